#pragma once
// Writing a batch of packed trajectories into their slots: the description shared by the host
// loop and the device kernel (scatter.cuh), and how the kernel's blocks share the bytes out.
//
// Blocks copy chunks of tuning::copy_chunk_bytes of one row's column segment. When the rows'
// lengths are close, block b of column c copies chunk b % chunks(longest) of row b / chunks
// (count x chunks(longest) blocks; a shorter row's blocks past its end copy nothing). When they
// differ, that grid is mostly empty blocks, so the insert plans one block per chunk a row
// really has (plan_scatter_blocks) and stages the plan beside the rows: work in proportion to
// bytes, one extra 8-byte load per block.

#include <cstddef>
#include <cstdint>
#include <gear/config.hpp>
#include <gear/detail/column_blocks.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/layout.hpp>
#include <gear/spec.hpp>

namespace gear::detail {

/// One trajectory of an insert: its slot, where its steps start in the packed input, its length
/// and its ticket.
struct scatter_row {
  std::int64_t slot = 0;
  std::int64_t src_step = 0;
  std::int64_t length = 0;
  std::uint64_t ticket = 0;
};

/// Source (packed, trajectories back to back) and destination (slot segments) of one column.
struct scatter_column {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;  ///< column segment of slot 0
  std::int64_t slot_stride = 0;
  std::int64_t step_bytes = 0;
};

/// One block of a planned scatter: the row it copies and the chunk of that row's segment.
struct scatter_block {
  std::int32_t row = 0;
  std::int32_t chunk = 0;
};

struct scatter_args {
  scatter_column columns[max_columns];
  int num_columns = 0;
  std::int64_t count = 0;             ///< trajectories
  std::int64_t max_count_length = 0;  ///< longest trajectory of this insert
  const scatter_row* rows = nullptr;  ///< [count], in device memory
  /// A plan (plan_scatter_blocks), in device memory, or null for count x chunks(longest) blocks
  /// per column. With a plan, column c's blocks are [first_block[c], first_block[c + 1]).
  const scatter_block* blocks = nullptr;
  std::int64_t first_block[max_columns + 1] = {};
};

/// The bytes one block copies: n bytes from src to dst (n <= 0: none).
struct scatter_piece {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  std::int64_t bytes = 0;
};

/// Chunk `chunk` of row r's segment of column c.
GEAR_HD inline scatter_piece scatter_piece_of(const scatter_args& a, const scatter_row& r, int c,
                                              std::int64_t chunk) {
  const scatter_column& col = a.columns[c];
  const std::int64_t bytes = r.length * col.step_bytes;
  const std::int64_t lo = chunk * tuning::copy_chunk_bytes;
  const std::int64_t hi =
      lo + tuning::copy_chunk_bytes < bytes ? lo + tuning::copy_chunk_bytes : bytes;
  return {col.dst + r.slot * col.slot_stride + lo, col.src + r.src_step * col.step_bytes + lo,
          hi - lo};
}

/// The column of block `block` of a planned scatter.
GEAR_HD inline int scatter_column_of(const scatter_args& a, std::int64_t block) {
  int c = 0;
  while (c + 1 < a.num_columns && block >= a.first_block[c + 1]) ++c;
  return c;
}

/// The column c, row and chunk that block `block` copies: from the plan where a has one, else on
/// the grid g (scatter_grid).
GEAR_HD inline void scatter_locate(const scatter_args& a, const column_blocks& g,
                                   std::int64_t block, int& c, std::int64_t& row,
                                   std::int64_t& chunk) {
  if (a.blocks != nullptr) {
    const scatter_block e = a.blocks[block];
    c = scatter_column_of(a, block);
    row = e.row;
    chunk = e.chunk;
  } else {
    g.locate(block, c, row, chunk);
  }
}

/// Chunks of copy_chunk_bytes in `bytes` (0 for none).
constexpr std::int64_t copy_chunks(std::int64_t bytes) noexcept {
  return (bytes + tuning::copy_chunk_bytes - 1) / tuning::copy_chunk_bytes;
}

/// Most entries a plan of `count` rows and `steps` steps in all can take, for columns of
/// step_bytes[0 .. num_columns): each row's segment is at most one chunk longer than its share.
inline std::int64_t scatter_plan_bound(std::int64_t count, std::int64_t steps,
                                       const std::int64_t* step_bytes, int num_columns) noexcept {
  std::int64_t n = 0;
  for (int c = 0; c < num_columns; ++c) n += copy_chunks(steps * step_bytes[c]) + count;
  return n;
}

/// The unplanned grid: count x chunks(longest) blocks per column of a.
inline column_blocks scatter_grid(const scatter_args& a) noexcept {
  std::int64_t item_bytes[max_columns];
  for (int c = 0; c < a.num_columns; ++c)
    item_bytes[c] = a.max_count_length * a.columns[c].step_bytes;
  return column_blocks::make(a.num_columns, a.count, item_bytes);
}

/// Plans a's scatter from the rows' lengths (host memory): one block per chunk each row's segment
/// of each column has, column after column. Sets a.first_block; writes the blocks to `out` (room
/// for scatter_plan_bound entries) where out is not null. Returns the blocks.
inline std::int64_t plan_scatter_blocks(scatter_args& a, const std::int64_t* lengths,
                                        scatter_block* out) noexcept {
  std::int64_t n = 0;
  for (int c = 0; c < a.num_columns; ++c) {
    a.first_block[c] = n;
    for (std::int64_t i = 0; i < a.count; ++i) {
      const std::int64_t chunks = copy_chunks(lengths[i] * a.columns[c].step_bytes);
      if (out != nullptr)
        for (std::int64_t k = 0; k < chunks; ++k)
          out[n + k] = {static_cast<std::int32_t>(i), static_cast<std::int32_t>(k)};
      n += chunks;
    }
  }
  a.first_block[a.num_columns] = n;
  return n;
}

/// Whether a plan pays for itself: it saves a quarter or more of the unplanned grid's blocks.
inline bool scatter_plan_pays(std::int64_t planned, std::int64_t grid) noexcept {
  return planned < grid && planned * 4 <= grid * 3;
}

}  // namespace gear::detail
