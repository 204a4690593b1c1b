#pragma once
// The transport policy concept.
//
// A transport says where the shards of one logical buffer live. The buffer asks it only who it is
// (shard_id) and how many shards there are (shard_count), and, optionally, which incarnation of
// its shard it is (incarnation(); without one, each buffer draws a number of its own); keys carry
// both, so that a key from another shard, another buffer, or from before the shard restarted, is
// told apart from a local one. A multi-machine transport
// adds remote insert and sample paths on top of the same buffer operations, so the buffer's
// interface does not change when a transport other than local is chosen.

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <gear/detail/mix.hpp>
#include <gear/key.hpp>

namespace gear {

template <class T>
concept transport_policy = std::move_constructible<T> && requires(const T& t) {
  { t.shard_id() } -> std::convertible_to<std::uint32_t>;
  { t.shard_count() } -> std::convertible_to<std::uint32_t>;
};

namespace transport {

/// The transport of one shard's local buffer (a shard of transport::libfabric, or of a
/// sharded_buffer): its id and incarnation, which its keys carry.
struct shard_view {
  key_owner owner;
  /// The sharded_buffer's shard count: updates from device memory skip the other shards' keys.
  std::uint32_t siblings = 0;
  [[nodiscard]] std::uint32_t shard_id() const noexcept { return owner.shard; }
  [[nodiscard]] std::uint32_t shard_count() const noexcept { return 1; }
  [[nodiscard]] std::uint32_t incarnation() const noexcept { return owner.incarnation; }
};

}  // namespace transport

namespace detail {

/// Where a counter of local incarnations starts: mixed from its own address and the time it is
/// first asked for, so that code built into two shared libraries (hidden visibility: a counter
/// each) counts from far-apart numbers, not both from 1.
inline std::uint32_t first_local_incarnation(const void* counter) noexcept {
  return static_cast<std::uint32_t>(
      mix64(reinterpret_cast<std::uintptr_t>(counter) ^
            static_cast<std::uint64_t>(
                std::chrono::steady_clock::now().time_since_epoch().count())));
}

/// A number no other local buffer (nor sharded_buffer) of this process has drawn (until 2^32
/// have been), never 0: the incarnation of their keys, so that one buffer refuses another's.
inline std::uint32_t next_local_incarnation() noexcept {
  static std::atomic<std::uint32_t> next{first_local_incarnation(&next)};
  std::uint32_t n = next.fetch_add(1, std::memory_order_relaxed);
  return n != 0 ? n : next.fetch_add(1, std::memory_order_relaxed);
}

/// The keys a buffer with transport `t` issues and accepts: a shard's id and incarnation, or for
/// a transport without one (transport::local) shard 0 of an incarnation drawn now.
template <class T>
key_owner owner_of(const T& t) noexcept {
  if constexpr (requires { t.incarnation(); })
    return key_owner{static_cast<std::uint32_t>(t.shard_id()),
                     static_cast<std::uint32_t>(t.incarnation())};
  else
    return key_owner{static_cast<std::uint32_t>(t.shard_id()), next_local_incarnation()};
}

/// The shards whose keys an update from device memory may name besides the buffer's own (their
/// pairs skipped): a sharded_buffer's shards see each other (0: none, the key must be its own).
template <class T>
constexpr std::uint32_t sibling_shards(const T&) noexcept {
  return 0;
}
constexpr std::uint32_t sibling_shards(const transport::shard_view& t) noexcept {
  return t.siblings;
}

}  // namespace detail
}  // namespace gear
