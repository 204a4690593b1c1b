#pragma once
// Device side of gear::select::recency: one thread per row; the candidate count comes from the
// host-side Fenwick tree, so selection is one launch and never synchronises.

#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/select/recency.hpp>

namespace gear::detail {

// A template (Request is always selection_request) so that headers define it once per use.
template <class Request>
__global__ void recency_select_kernel(slot_table table, Request request, recency_window w) {
  const std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (row >= request.batch) return;
  request.slots[row] = recency_row(table, request, w, row);
  request.probabilities[row] = recency_probability(table, w, request.slots[row]);
  request.weights[row] = 1.0f;
}

}  // namespace gear::detail

namespace gear::select {

/// Device side: one kernel launch, stream-ordered, never synchronises.
template <>
class recency::state<exec::device> : public detail::recency_state_base {
 public:
  using recency_state_base::recency_state_base;

  void select(const slot_table& t, const selection_request& r, cuda::stream_ref stream) {
    const detail::recency_window w = window(t);
    constexpr int threads = detail::tuning::select_threads;
    const auto blocks = static_cast<unsigned>((r.batch + threads - 1) / threads);
    detail::recency_select_kernel<<<blocks, threads, 0, stream.get()>>>(t, r, w);
    GEAR_CHECK_LAUNCH("recency_select_kernel");
  }
};

}  // namespace gear::select
