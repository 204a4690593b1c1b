#pragma once
// Selection one thread per row, for policies that draw each row on its own (uniform, recency):
// the launch behind their select(), given the policy's row function.

#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/select/concept.hpp>

namespace gear::detail {

template <class Rows>
__global__ void row_select_kernel(Rows rows, const selection_request r) {
  const std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (row >= r.batch) return;
  if constexpr (requires { rows.read_device_counts(); }) rows.read_device_counts();
  const selected_row s = rows(row);
  r.slots[row] = s.slot;
  r.probabilities[row] = s.probability;
  r.weights[row] = s.weight;
}

/// Launches row_select_kernel over r.batch rows on `stream`; never synchronises.
template <class Rows>
void select_rows_on_device(const Rows& rows, const selection_request& r, cuda::stream_ref stream) {
  constexpr int threads = tuning::select_threads;
  const auto blocks = static_cast<unsigned>((r.batch + threads - 1) / threads);
  row_select_kernel<<<blocks, threads, 0, stream.get()>>>(rows, r);
  GEAR_CHECK_LAUNCH("row_select_kernel");
}

}  // namespace gear::detail
