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
/// Bytes of one row segment one copy block moves.
inline constexpr std::int64_t copy_chunk_bytes =
    std::int64_t{16} * copy_threads * copy_vectors_per_thread;

}  // namespace gear::detail::tuning
