#pragma once
// Selection one thread per row, for policies that draw each row on its own (uniform, recency):
// the launch behind their select(), given the policy's row function; and the same for rows that
// claim slots from each other (uniform without replacement).

#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/dependent_launch.cuh>
#include <gear/detail/last_block.cuh>
#include <gear/detail/tuning.hpp>
#include <gear/select/concept.hpp>

namespace gear::detail {

/// One thread per row. With ClearsClaims the rows claim slots from each other in r.scratch
/// (uniform without replacement), a table that is all 0 when the launch starts: the last block to
/// finish (counted in r.arrivals) clears it for the next sample, so no memset precedes the launch
/// (for tables of up to tuning::select_fused_claims_max_words, which one block clears in about a
/// microsecond).
template <bool ClearsClaims, class Rows>
__global__ void row_select_kernel(Rows rows, const selection_request r) {
  allow_dependents();  // a gather after it may be placed now (dependent_launch.cuh)
  const std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (row < r.batch) {  // every thread goes on to the arrival
    if constexpr (requires { rows.read_device_counts(); }) rows.read_device_counts();
    const selected_row s = rows(row);
    r.slots[row] = s.slot;
    r.probabilities[row] = s.probability;
    r.weights[row] = s.weight;
  }
  if constexpr (ClearsClaims) {
    if (!last_block_to_arrive(r.arrivals)) return;
    // The table is a power of two >= 2 words at a 16-byte boundary: 16-byte stores.
    auto* table = reinterpret_cast<uint4*>(r.scratch);
    for (std::int64_t i = threadIdx.x; i < r.scratch_size / 2; i += blockDim.x)
      table[i] = make_uint4(0, 0, 0, 0);
  }
}

/// Launches row_select_kernel over r.batch rows on `stream`; never synchronises.
template <bool ClearsClaims = false, class Rows>
void select_rows_on_device(const Rows& rows, const selection_request& r, cuda::stream_ref stream) {
  constexpr int threads = tuning::select_threads;
  const auto blocks = static_cast<unsigned>((r.batch + threads - 1) / threads);
  row_select_kernel<ClearsClaims><<<blocks, threads, 0, stream.get()>>>(rows, r);
  GEAR_CHECK_LAUNCH("row_select_kernel");
}

}  // namespace gear::detail
