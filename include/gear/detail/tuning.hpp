#pragma once
// Launch parameters of gear's kernels, named in one place.

#include <cstdint>

namespace gear::detail::tuning {

/// Threads per block of the selection kernels (one thread per row).
inline constexpr int select_threads = 256;
/// Threads per block of the priority update kernels (one thread per updated key) and of the sum
/// tree rebuild (one thread per node).
inline constexpr int priority_update_threads = 256;
/// Threads per block of the gather and scatter kernels.
inline constexpr int copy_threads = 256;
/// 16-byte vectors each copy thread moves per chunk.
inline constexpr int copy_vectors_per_thread = 4;
/// Most bytes of one row segment one copy block moves (one pass of all its threads).
inline constexpr std::int64_t copy_chunk_bytes =
    std::int64_t{16} * copy_threads * copy_vectors_per_thread;
/// Fewest bytes per copy block: small launches split rows down to this to keep enough blocks in
/// flight, since a small grid leaves most SMs idle and each block waits out memory latency alone.
inline constexpr std::int64_t min_copy_chunk_bytes = 2048;
/// Blocks a copy launch aims for before it stops shrinking chunks (about 16 per H200 SM).
inline constexpr std::int64_t copy_target_blocks = 2048;

}  // namespace gear::detail::tuning
