#pragma once
// The transport policy concept.
//
// A transport says where the shards of one logical buffer live. The buffer asks it only who it is
// (shard_id) and how many shards there are (shard_count); keys carry the shard id so that a key
// from another shard is told apart from a local one. A multi-machine transport adds remote insert
// and sample paths on top of the same buffer operations, so the buffer's interface does not change
// when a transport other than local is chosen.

#include <concepts>
#include <cstdint>

namespace gear {

template <class T>
concept transport_policy = std::move_constructible<T> && requires(const T& t) {
  { t.shard_id() } -> std::convertible_to<std::uint32_t>;
  { t.shard_count() } -> std::convertible_to<std::uint32_t>;
};

}  // namespace gear
