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
/// each, column after column. Items of one chunk or less may share a block: items_per_block[c] of
/// them (a power of two), each copied by a group of copy_threads / items_per_block[c] threads,
/// whole warps; a block per item where the caller asks for that.
struct column_blocks {
  std::int64_t chunks[max_columns];
  std::int64_t first_block[max_columns + 1];
  int items_per_block[max_columns];

  /// Blocks for `items` items per column, column c's items being at most item_bytes[c] long, at
  /// most `max_items_per_block` (a power of two, 1 .. tuning::gather_max_rows_per_block) per block.
  static column_blocks make(int num_columns, std::int64_t items, const std::int64_t* item_bytes,
                            int max_items_per_block = 1) {
    column_blocks g{};
    for (int c = 0; c < num_columns; ++c) {
      g.chunks[c] = (item_bytes[c] + tuning::copy_chunk_bytes - 1) / tuning::copy_chunk_bytes;
      int per_block = 1;  // the most that fit one chunk together
      while (per_block < max_items_per_block &&
             2 * per_block * item_bytes[c] <= tuning::copy_chunk_bytes)
        per_block *= 2;
      g.items_per_block[c] = per_block;
      const std::int64_t item_blocks = (items + per_block - 1) / per_block;
      g.first_block[c + 1] = g.first_block[c] + item_blocks * g.chunks[c];
    }
    return g;
  }

  /// The column, first item and chunk of block `block`.
  GEAR_HD void locate(std::int64_t block, int& column, std::int64_t& item,
                      std::int64_t& chunk) const {
    column = 0;
    while (block >= first_block[column + 1]) ++column;
    const std::int64_t local = block - first_block[column];
    item = local / chunks[column] * items_per_block[column];
    chunk = local % chunks[column];
  }

  /// Of a block of `threads` threads copying items of `column`: the item group of thread `thread`,
  /// its lane in the group and the group's thread count.
  GEAR_HD void group_of(int column, int thread, int threads, int& group, int& lane,
                        int& group_threads) const {
    group_threads = threads / items_per_block[column];
    group = thread / group_threads;
    lane = thread % group_threads;
  }
};

// Groups are whole warps: a group's barriers and shuffles never split one.
static_assert(tuning::copy_threads % (32 * tuning::gather_max_rows_per_block) == 0);

}  // namespace gear::detail
