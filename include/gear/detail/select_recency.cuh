#pragma once
// Device side of gear::select::recency: one thread per row; the candidate count comes from the
// host-side Fenwick tree, so selection is one launch and never synchronises.

#include <cstdint>

#include <cuda/stream_ref>

#include <gear/detail/cuda.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/select/recency.hpp>

namespace gear::detail {

template <class Request>  // always selection_request; a template so that headers define it once per use
__global__ void recency_select_kernel(slot_table table, Request request,
                                      recency_window w) {
  const std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (row >= request.batch) return;
  request.slots[row] = recency_row(table, request, w, row);
  request.probabilities[row] = 1.0f / static_cast<float>(w.candidates);
  request.weights[row] = 1.0f;
}

}  // namespace gear::detail

namespace gear::select {

/// Device side: one kernel launch, stream-ordered, never synchronises.
template <>
class recency::state<exec::device> {
 public:
  state(const recency& policy, std::int64_t capacity) : policy_(policy), committed_(capacity) {
    detail::validate_newest(policy.newest);
  }

  /// Changes K. Throws errc::invalid_argument below 1.
  void set_newest(std::int64_t newest) {
    detail::validate_newest(newest);
    policy_.newest = newest;
  }
  [[nodiscard]] std::int64_t newest() const noexcept { return policy_.newest; }

  void validate(const slot_table& t, std::int64_t) const {
    detail::validate_recency(t, committed_, policy_.newest);
  }

  void select(const slot_table& t, const selection_request& r, cuda::stream_ref stream) {
    const detail::recency_window w = detail::make_recency_window(t, committed_, policy_.newest);
    constexpr int threads = detail::tuning::select_threads;
    const auto blocks = static_cast<unsigned>((r.batch + threads - 1) / threads);
    detail::recency_select_kernel<<<blocks, threads, 0, stream.get()>>>(t, r, w);
    GEAR_CHECK_LAUNCH("recency_select_kernel");
  }

  void on_commit(const slot_table&, std::uint64_t first, std::int64_t count, cuda::stream_ref) {
    committed_.set(first, count, true);
  }
  void on_evict(const slot_table&, std::uint64_t first, std::int64_t count, cuda::stream_ref) {
    committed_.set(first, count, false);
  }

 private:
  recency policy_;
  detail::committed_slots committed_;
};

}  // namespace gear::select
