#pragma once
// column_blocks: the grid of a copy launch (the gather's; the scatter's unplanned one).
// Host-compilable, so the host tests run the kernels' own block mapping.

#include <cstdint>
#include <gear/config.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/spec.hpp>

namespace gear::detail {

/// How the blocks of a copy launch are shared out: every item (a sampled row, an inserted
/// trajectory) of column c is split into chunks[c] chunks of tuning::copy_chunk_bytes, one block
/// each, column after column.
struct column_blocks {
  std::int64_t chunks[max_columns];
  std::int64_t first_block[max_columns + 1];

  /// Blocks for `items` items per column, column c's items being at most item_bytes[c] long.
  static column_blocks make(int num_columns, std::int64_t items, const std::int64_t* item_bytes) {
    column_blocks g{};
    for (int c = 0; c < num_columns; ++c) {
      g.chunks[c] = (item_bytes[c] + tuning::copy_chunk_bytes - 1) / tuning::copy_chunk_bytes;
      g.first_block[c + 1] = g.first_block[c] + items * g.chunks[c];
    }
    return g;
  }

  /// The column, item and chunk of block `block`.
  GEAR_HD void locate(std::int64_t block, int& column, std::int64_t& item,
                      std::int64_t& chunk) const {
    column = 0;
    while (block >= first_block[column + 1]) ++column;
    const std::int64_t local = block - first_block[column];
    item = local / chunks[column];
    chunk = local % chunks[column];
  }
};

}  // namespace gear::detail
