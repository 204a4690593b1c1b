#pragma once
// The fused scatter kernel: one launch writes every column of every inserted trajectory from
// device (or mapped) memory into its slot. The insert commits the trajectories with the journal's
// apply, enqueued after it: no later work sees a trajectory before all of its bytes are stored.
// Blocks are laid out like the gather's, or planned in proportion to bytes (scatter.hpp).

#include <algorithm>
#include <cuda/stream_ref>
#include <gear/detail/copy.cuh>
#include <gear/detail/cuda.hpp>
#include <gear/detail/scatter.hpp>
#include <gear/detail/tuning.hpp>

namespace gear::detail {

// A template (Args is always scatter_args) so that headers define it once per use.
template <class Args>
__global__ void __launch_bounds__(tuning::copy_threads)
    scatter_kernel(const Args a, const column_blocks g) {
  int c;
  std::int64_t i, chunk;
  scatter_locate(a, g, blockIdx.x, c, i, chunk);
  const scatter_piece p = scatter_piece_of(a, a.rows[i], c, chunk);
  if (p.bytes > 0) block_copy(p.dst, p.src, p.bytes);
}

/// Launches the scatter on `stream` (planned or not, scatter.hpp); checks the launch, never
/// synchronises.
inline void scatter_on_device(const scatter_args& a, cuda::stream_ref stream) {
  const column_blocks g = scatter_grid(a);
  const std::int64_t blocks =
      a.blocks != nullptr ? a.first_block[a.num_columns] : g.first_block[a.num_columns];
  GEAR_REQUIRE(blocks < (std::int64_t{1} << 31), errc::invalid_argument,
               "an insert this large needs more than 2^31 copy blocks; insert fewer at once");
  if (blocks == 0) return;
  scatter_kernel<<<static_cast<unsigned>(blocks), tuning::copy_threads, 0, stream.get()>>>(a, g);
  GEAR_CHECK_LAUNCH("scatter_kernel");
}

}  // namespace gear::detail
