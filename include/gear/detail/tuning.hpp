#pragma once
// Launch parameters of gear's kernels, named in one place.

#include <cstdint>

namespace gear::detail::tuning {

/// Threads per block of the selection kernels (one thread per row; prioritized: 16 per row).
inline constexpr int select_threads = 256;
/// Most blocks of the prioritized selection (larger batches stride): the block that writes the
/// weights (its last, or each block of the weights launch) reduces one word per selection block.
inline constexpr std::int64_t select_max_blocks = 1024;
/// Levels below the root that each prioritized selection block reads once into shared memory
/// (levels 1 and 2: at most 16 + 256 nodes, 2 KiB) instead of every row reading them from L2.
/// Levels 1 .. 3 took 15.3 us against 14.0 us at B = 4096 on an H100 (gear_bench prioritized/,
/// bench/results/h100-session13.txt): each block's 4096 more loads cost more than they save.
inline constexpr int select_shared_levels = 2;
/// Largest batch whose importance weights the prioritized selection's last block writes itself,
/// in the selection's launch (one exp per row, spread over that block's threads, 8 loads in
/// flight each); larger batches take a second launch spread over the GPU. On an H100 at B = 4096
/// the one launch took 17.3 us against 16.5 us for two (gear_bench prioritized/, same run): up to
/// 2048 rows each thread of the last block loads its rows at once.
inline constexpr std::int64_t select_fused_weights_max_rows = 2048;
/// Larger batches have their weights written by every selection block after a grid-wide barrier
/// (a cooperative launch, while the grid fits on the GPU at once and the stream is not capturing)
/// instead of by a second launch. On H100s at B = 4096 (gear_bench prioritized/, three runs,
/// bench/results/h100-session13.txt): 13.7, 13.3 and 14.6 us against 14.5, 14.1 and 14.7 us for
/// two launches. Where the grid does not fit, or under capture, the weights take the second
/// launch.
inline constexpr bool select_weights_grid_sync = true;
/// Largest claim table (words) that uniform selection without replacement clears in its own last
/// block (one block's stores), in the selection launch or in the gather that draws its rows (its
/// claims epilogue); larger tables are cleared by a memset before the selection, spread over the
/// GPU. The table of a batch of B rows is the power of two >= 2B: this is B = 8192.
inline constexpr std::int64_t select_fused_claims_max_words = 16384;
/// Threads per block of the priority update kernels (one thread per updated key) and of the sum
/// tree rebuild (one thread per node).
inline constexpr int priority_update_threads = 256;
/// Threads per block, and most blocks, of the journal's apply (one thread per slot record).
inline constexpr int journal_threads = 256;
inline constexpr std::int64_t journal_max_blocks = 1024;
/// The buffers' pinned staging (host data on its way to the GPU: inserts, landing inserts, journal
/// records; and the rows a sample under max_times_sampled reads back or stages) is write-combined.
/// Off: gear_contention's write-combined copy references moved as much as cached ones, alone and
/// beside a learner, in every run (bench/results/h100-session29.txt), and the CPU reads such
/// memory slowly (a readback does).
inline constexpr bool staging_write_combined = false;
/// Threads per block of the gather and scatter kernels.
inline constexpr int copy_threads = 256;
/// 16-byte vectors each copy thread moves per chunk.
inline constexpr int copy_vectors_per_thread = 4;
/// Bytes of one row segment one copy block moves.
inline constexpr std::int64_t copy_chunk_bytes =
    std::int64_t{16} * copy_threads * copy_vectors_per_thread;

/// Most sampled rows one gather block copies: rows of at most a chunk share a block (the largest
/// power of two of them that fits one chunk, up to this many), each copied by a group of
/// copy_threads / rows threads, whole warps. A block per 8-byte row was slower than a selection
/// launch and a gather of the landed core's (B = 4096 rows, gear_bench select/device).
inline constexpr int gather_max_rows_per_block = 8;

/// Copy blocks one SM holds at once (2048 resident threads per SM on sm_80 and sm_90).
inline constexpr int copy_blocks_per_sm = 2048 / copy_threads;
/// sample() draws rows inside the gather kernel (a policy's row_selector) only while the gather
/// fits in this many waves of resident blocks. Each block draws its own row, a latency of a few
/// hundred cycles per wave; the separate selection launch it replaces costs about 3 us. On the
/// H200 (bench/README.md) one launch was faster up to 1024 blocks and slower from 4096.
inline constexpr int fused_gather_max_waves = 2;

}  // namespace gear::detail::tuning
