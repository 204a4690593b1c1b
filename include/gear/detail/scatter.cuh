#pragma once
// The fused scatter kernel: one launch writes every column of every inserted trajectory from
// device (or mapped) memory into its slot. Its threads may also run a small piece of work beside
// the copies, spread over the whole grid (an insert's commit: the journal's apply). No work later
// in stream order sees a trajectory before the launch has ended, so before all of its bytes are
// stored. Blocks are laid out like the gather's, or planned in proportion to bytes (scatter.hpp).

#include <algorithm>
#include <cuda/stream_ref>
#include <gear/detail/copy.cuh>
#include <gear/detail/cuda.hpp>
#include <gear/detail/scatter.hpp>
#include <gear/detail/tuning.hpp>

namespace gear::detail {

/// Nothing beside the copies.
struct no_scatter_extra {
  static constexpr bool present = false;
  __device__ void operator()(std::int64_t, std::int64_t) const {}
};

// A template (Args is always scatter_args) so that headers define it once per use. `extra`, if
// present, is called by every thread with its index in the grid and the grid's thread count.
template <class Args, class Extra>
__global__ void __launch_bounds__(tuning::copy_threads)
    scatter_kernel(const Args a, const column_blocks g, const Extra extra) {
  if constexpr (Extra::present)
    extra(blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x,
          std::int64_t{gridDim.x} * blockDim.x);
  int c;
  std::int64_t i, chunk;
  scatter_locate(a, g, blockIdx.x, c, i, chunk);
  const scatter_piece p = scatter_piece_of(a, a.rows[i], c, chunk);
  if (p.bytes > 0) block_copy(p.dst, p.src, p.bytes);
}

/// Launches the scatter on `stream` (planned or not, scatter.hpp), its threads running `extra`
/// beside the copies; checks the launch, never synchronises. Returns false when there was nothing
/// to copy: then nothing was launched, and `extra` did not run.
template <class Extra = no_scatter_extra>
bool scatter_on_device(const scatter_args& a, cuda::stream_ref stream, const Extra& extra = {}) {
  const column_blocks g = scatter_grid(a);
  const std::int64_t blocks =
      a.blocks != nullptr ? a.first_block[a.num_columns] : g.first_block[a.num_columns];
  GEAR_REQUIRE(blocks < (std::int64_t{1} << 31), errc::invalid_argument,
               "an insert this large needs more than 2^31 copy blocks; insert fewer at once");
  if (blocks == 0) return false;
  scatter_kernel<<<static_cast<unsigned>(blocks), tuning::copy_threads, 0, stream.get()>>>(a, g,
                                                                                           extra);
  GEAR_CHECK_LAUNCH("scatter_kernel");
  return true;
}

}  // namespace gear::detail
