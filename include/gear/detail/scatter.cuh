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
  const std::byte* src =
      r.staged == nullptr ? col.src : r.staged + staged_column_offset(a, c, r.staged_steps);
  block_copy(col.dst + r.slot * col.slot_stride + lo, src + r.src_step * col.step_bytes + lo,
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

/// Launches the scatter of `a.count` rows (a.rows in GPU-readable memory; `rows`, the same rows,
/// readable by the host) in as many launches as keep each under 2^30 blocks, each sized by its own
/// longest row: any number of trajectories of mixed lengths goes, with no launch refused.
inline void scatter_in_groups(scatter_args a, const scatter_row* rows, cuda::stream_ref stream) {
  auto blocks_of = [&](std::int64_t n, std::int64_t longest) {
    std::int64_t blocks = 0;
    for (int c = 0; c < a.num_columns; ++c)
      blocks += (longest * a.columns[c].step_bytes + tuning::copy_chunk_bytes - 1) /
                tuning::copy_chunk_bytes;
    return n * blocks;
  };
  const scatter_row* device_rows = a.rows;
  const std::int64_t total = a.count;
  for (std::int64_t first = 0; first < total;) {
    std::int64_t longest = rows[first].length, end = first + 1;
    while (end < total) {
      const std::int64_t wider = std::max(longest, rows[end].length);
      if (blocks_of(end + 1 - first, wider) >= (std::int64_t{1} << 30)) break;
      longest = wider;
      ++end;
    }
    a.rows = device_rows + first;
    a.count = end - first;
    a.max_count_length = longest;
    scatter_on_device(a, stream);
    first = end;
  }
}

}  // namespace gear::detail
