#pragma once
// copy_rows_on_host (row_copy.hpp) on the GPU: one block per (row, part, chunk of
// tuning::copy_chunk_bytes), with block_copy's widest aligned accesses. The source may be another
// device's memory that the current device reaches by peer access.

#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/copy.cuh>
#include <gear/detail/cuda.hpp>
#include <gear/detail/row_copy.hpp>
#include <gear/detail/tuning.hpp>

namespace gear::detail {

/// Blocks of a row copy: part p's rows are split into chunks[p] chunks each, blocks
/// [first_block[p], first_block[p + 1]) copy them, part after part.
struct row_blocks {
  std::int64_t chunks[row_parts::max_parts] = {};
  std::int64_t first_block[row_parts::max_parts + 1] = {};
};

__global__ void __launch_bounds__(tuning::copy_threads)
    copy_rows_kernel(row_parts p, row_blocks g, const std::int32_t* rows_from) {
  const std::int64_t block = blockIdx.x;
  int part = 0;
  while (block >= g.first_block[part + 1]) ++part;
  const std::int64_t local = block - g.first_block[part];
  const std::int64_t row = local / g.chunks[part], chunk = local % g.chunks[part];
  const std::int64_t bytes = p.row_bytes[part], begin = chunk * tuning::copy_chunk_bytes;
  const std::int64_t n = min64(tuning::copy_chunk_bytes, bytes - begin);
  block_copy(p.to[part] + row * bytes + begin, p.from[part] + rows_from[row] * bytes + begin, n);
}

/// Enqueues the copy on `stream` (the current device's). `rows_from` is in memory the current
/// device reads. Throws errc::invalid_argument for more blocks than a grid holds,
/// errc::cuda_error.
inline void copy_rows_on_device(const row_parts& p, const std::int32_t* rows_from,
                                std::int64_t rows, cuda::stream_ref stream) {
  row_blocks g;
  for (int k = 0; k < p.count; ++k) {
    g.chunks[k] = (p.row_bytes[k] + tuning::copy_chunk_bytes - 1) / tuning::copy_chunk_bytes;
    g.first_block[k + 1] = g.first_block[k] + rows * g.chunks[k];
  }
  const std::int64_t blocks = g.first_block[p.count];
  if (blocks == 0) return;
  GEAR_REQUIRE(blocks <= 0x7fffffff, errc::invalid_argument,
               "a row copy of " + std::to_string(rows) + " rows needs " + std::to_string(blocks) +
                   " blocks, more than one grid holds");
  copy_rows_kernel<<<static_cast<unsigned>(blocks), tuning::copy_threads, 0, stream.get()>>>(
      p, g, rows_from);
  GEAR_CHECK_LAUNCH("copy_rows_kernel");
}

}  // namespace gear::detail
