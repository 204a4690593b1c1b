#pragma once
// The fused gather kernel: one launch copies the windows of every row of every column.
//
// Column c's rows are split into chunks of tuning::copy_chunk_bytes; block b finds its column
// from the per-column block counts, then its row and chunk. Each block resolves its row's window
// (plan_window, the same function as the host loop), copies the chunk's part of the valid steps
// and zero-fills the chunk's padding. The first block of each row in column 0 also writes the
// row's mask and key.

#include <cuda/stream_ref>
#include <gear/detail/copy.cuh>
#include <gear/detail/cuda.hpp>
#include <gear/detail/gather.hpp>
#include <gear/detail/tuning.hpp>

namespace gear::detail {

// Kernels in gear's headers are templates (here on the argument type, always gather_args), so that
// every translation unit that includes them can instantiate them without duplicate symbols.
template <class Args>
__global__ void __launch_bounds__(tuning::copy_threads)
    gather_kernel(const Args a, const column_blocks g) {
  int c;
  std::int64_t row, chunk;
  g.locate(blockIdx.x, c, row, chunk);

  const std::int64_t slot = a.slots[row];
  const window_plan p = row_plan(a, row, slot);
  if (c == 0 && chunk == 0) {
    std::uint8_t* mask = a.mask + row * a.win.length;
    for (std::int64_t t = threadIdx.x; t < a.win.length; t += blockDim.x)
      mask[t] = (t >= p.dst_pos && t < p.dst_pos + p.count);
    if (threadIdx.x == 0) a.keys[row] = row_key(a, slot);
  }

  const auto& col = a.columns[c];
  const std::int64_t row_bytes = a.win.length * col.step_bytes;
  const std::int64_t lo = chunk * tuning::copy_chunk_bytes;
  const std::int64_t hi = min64(lo + tuning::copy_chunk_bytes, row_bytes);
  const std::int64_t valid_lo = p.dst_pos * col.step_bytes;
  const std::int64_t valid_hi = valid_lo + p.count * col.step_bytes;
  std::byte* dst = col.dst + row * row_bytes;
  const std::byte* src = col.src + slot * col.slot_stride + p.src_step * col.step_bytes - valid_lo;

  const std::int64_t copy_lo = max64(lo, valid_lo), copy_hi = min64(hi, valid_hi);
  if (copy_lo < copy_hi) {
    block_copy(dst + copy_lo, src + copy_lo, copy_hi - copy_lo);
    block_zero(dst + lo, copy_lo - lo);
    block_zero(dst + copy_hi, hi - copy_hi);
  } else {
    block_zero(dst + lo, hi - lo);
  }
}

/// Launches the gather on `stream`; checks the launch, never synchronises.
inline void gather_on_device(const gather_args& a, cuda::stream_ref stream) {
  std::int64_t row_bytes[max_columns];
  for (int c = 0; c < a.num_columns; ++c) row_bytes[c] = a.win.length * a.columns[c].step_bytes;
  const column_blocks g = column_blocks::make(a.num_columns, a.batch, row_bytes);
  const std::int64_t blocks = g.first_block[a.num_columns];
  if (blocks == 0) return;
  gather_kernel<<<static_cast<unsigned>(blocks), tuning::copy_threads, 0, stream.get()>>>(a, g);
  GEAR_CHECK_LAUNCH("gather_kernel");
}

}  // namespace gear::detail
