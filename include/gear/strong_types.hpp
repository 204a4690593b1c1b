#pragma once
// Strong integer types for the sizes a buffer is built and sampled with, so that
// replay_buffer{capacity{1024}, max_length{500}} cannot be written the wrong way round.

#include <cstdint>

namespace gear {

/// An int64 that only converts explicitly; Tag keeps the kinds apart.
template <class Tag>
struct strong_int {
  std::int64_t value;
  constexpr explicit strong_int(std::int64_t v) noexcept : value(v) {}
};

/// Number of trajectory slots in a buffer (one shard).
using capacity = strong_int<struct capacity_tag>;
/// Most steps a trajectory may have.
using max_length = strong_int<struct max_length_tag>;
/// Rows in a sampled batch.
using batch_size = strong_int<struct batch_size_tag>;
/// Steps per row in a sampled batch.
using window_length = strong_int<struct window_length_tag>;

}  // namespace gear
