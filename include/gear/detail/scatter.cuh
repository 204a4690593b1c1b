#pragma once
// The fused scatter kernel: one launch writes every column of every inserted trajectory from
// device (or mapped) memory into its slot. Blocks are laid out like the gather's.

#include <cuda/stream_ref>

#include <gear/detail/copy.cuh>
#include <gear/detail/cuda.hpp>
#include <gear/detail/scatter.hpp>
#include <gear/detail/tuning.hpp>

namespace gear::detail {

struct scatter_grid {
  std::int64_t chunks[max_columns];
  std::int64_t first_block[max_columns + 1];
};

__global__ void __launch_bounds__(tuning::copy_threads)
    scatter_kernel(const scatter_args a, const scatter_grid g) {
  const std::int64_t block = blockIdx.x;
  int c = 0;
  while (block >= g.first_block[c + 1]) ++c;
  const std::int64_t local = block - g.first_block[c];
  const std::int64_t i = local / g.chunks[c];
  const std::int64_t chunk = local % g.chunks[c];

  const scatter_row r = a.rows[i];
  const scatter_column& col = a.columns[c];
  const std::int64_t bytes = r.length * col.step_bytes;
  const std::int64_t lo = chunk * tuning::copy_chunk_bytes;
  if (lo >= bytes) return;
  const std::int64_t hi = min64(lo + tuning::copy_chunk_bytes, bytes);
  block_copy(col.dst + r.slot * col.slot_stride + lo, col.src + r.src_step * col.step_bytes + lo,
             hi - lo);
}

/// Launches the scatter on `stream`; checks the launch, never synchronises.
inline void scatter_on_device(const scatter_args& a, cuda::stream_ref stream) {
  scatter_grid g{};
  for (int c = 0; c < a.num_columns; ++c) {
    const std::int64_t bytes = a.max_count_length * a.columns[c].step_bytes;
    g.chunks[c] = (bytes + tuning::copy_chunk_bytes - 1) / tuning::copy_chunk_bytes;
    g.first_block[c + 1] = g.first_block[c] + a.count * g.chunks[c];
  }
  const std::int64_t blocks = g.first_block[a.num_columns];
  if (blocks == 0) return;
  scatter_kernel<<<static_cast<unsigned>(blocks), tuning::copy_threads, 0, stream.get()>>>(a, g);
  GEAR_CHECK_LAUNCH("scatter_kernel");
}

}  // namespace gear::detail
