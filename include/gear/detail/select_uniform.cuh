#pragma once
// Device side of gear::select::uniform: one thread per row.

#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/select/uniform.hpp>

namespace gear::detail {

// A template (Request is always selection_request) so that headers define it once per use.
template <class Request>
__global__ void uniform_select_kernel(slot_table table, Request request, bool replacement) {
  const std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (row >= request.batch) return;
  request.slots[row] = uniform_row(table, request, replacement, row);
  request.probabilities[row] = 1.0f / static_cast<float>(table.live);
  request.weights[row] = 1.0f;
}

}  // namespace gear::detail

namespace gear::select {

/// Device side: one kernel launch, stream-ordered, never synchronises.
template <>
class uniform::state<exec::device> {
 public:
  state(const uniform& policy, std::int64_t /*capacity*/) : policy_(policy) {}

  void validate(const slot_table& t, std::int64_t batch) const {
    detail::validate_uniform(t, batch, policy_.replacement);
  }

  void select(const slot_table& t, const selection_request& r, cuda::stream_ref stream) {
    if (!policy_.replacement)  // the claim set starts empty
      GEAR_CUDA_TRY(cudaMemsetAsync(
          r.scratch, 0, static_cast<std::size_t>(r.scratch_size) * sizeof(std::uint64_t),
          stream.get()));
    constexpr int threads = detail::tuning::select_threads;
    const auto blocks = static_cast<unsigned>((r.batch + threads - 1) / threads);
    detail::uniform_select_kernel<<<blocks, threads, 0, stream.get()>>>(t, r, policy_.replacement);
    GEAR_CHECK_LAUNCH("uniform_select_kernel");
  }

 private:
  uniform policy_;
};

}  // namespace gear::select
