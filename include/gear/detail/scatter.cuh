#pragma once
// The fused scatter kernel: one launch writes every column of every inserted trajectory from
// device (or mapped) memory into its slot. The insert commits the trajectories with the journal's
// apply, enqueued after it: no later work sees a trajectory before all of its bytes are stored.
// Blocks are laid out like the gather's.

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
  g.locate(blockIdx.x, c, i, chunk);

  const scatter_row r = a.rows[i];
  const auto& col = a.columns[c];
  const std::int64_t bytes = r.length * col.step_bytes;
  const std::int64_t lo = chunk * tuning::copy_chunk_bytes;
  if (lo >= bytes) return;
  const std::int64_t hi = min64(lo + tuning::copy_chunk_bytes, bytes);
  block_copy(col.dst + r.slot * col.slot_stride + lo, col.src + r.src_step * col.step_bytes + lo,
             hi - lo);
}

/// Launches the scatter on `stream`; checks the launch, never synchronises.
inline void scatter_on_device(const scatter_args& a, cuda::stream_ref stream) {
  std::int64_t item_bytes[max_columns];
  for (int c = 0; c < a.num_columns; ++c)
    item_bytes[c] = a.max_count_length * a.columns[c].step_bytes;
  const column_blocks g = column_blocks::make(a.num_columns, a.count, item_bytes);
  const std::int64_t blocks = g.first_block[a.num_columns];
  GEAR_REQUIRE(blocks < (std::int64_t{1} << 31), errc::invalid_argument,
               "an insert this large needs more than 2^31 copy blocks; insert fewer at once");
  if (blocks == 0) return;
  scatter_kernel<<<static_cast<unsigned>(blocks), tuning::copy_threads, 0, stream.get()>>>(a, g);
  GEAR_CHECK_LAUNCH("scatter_kernel");
}

}  // namespace gear::detail
