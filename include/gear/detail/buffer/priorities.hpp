#pragma once
// Priority updates (replay_buffer::update_priorities_async), for selection policies whose state
// takes them. From host spans, the buffer checks every pair during the call (sizes, the key's
// shard, the priority), skips and counts pairs whose key is stale, and hands the rest to the
// policy. From device memory, the policy checks the pairs on the GPU (select/concept.hpp).

#include <cmath>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/buffer/landing.hpp>
#include <gear/detail/memory.hpp>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <gear/priority_update.hpp>
#include <gear/select/prioritized.hpp>
#include <span>
#include <string>
#include <vector>

namespace gear::detail {

/// Throws unless p, an array of `align`-byte elements, is set, aligned and readable by kernels.
inline void check_gpu_readable(const void* p, std::size_t align, const char* what) {
  GEAR_REQUIRE(p != nullptr, errc::null_pointer, std::string(what) + " is null");
  GEAR_REQUIRE(reinterpret_cast<std::uintptr_t>(p) % align == 0, errc::misaligned_pointer,
               std::string(what) + " is not aligned to its element size");
  GEAR_REQUIRE(memory_of(p).gpu_readable, errc::wrong_memory,
               std::string(what) +
                   " is not in memory kernels can read at this address (device, managed or "
                   "pinned) as memory_kind::device says");
}

/// With raise_earlier false (sharded_buffer, which raised every shard's first) an earlier failed
/// update from device memory is left to check_priority_updates.
template <class Core>
priority_update_result update_from_host(Core& b, std::span<const key> keys,
                                        std::span<const float> priorities, cuda::stream_ref stream,
                                        bool raise_earlier = true) {
  const auto held = b.lock();
  b.check_usable(stream);
  if constexpr (device_priority_update<typename Core::state_type>)
    if (raise_earlier) b.selection_->raise_update_failures();
  GEAR_REQUIRE(keys.size() == priorities.size(), errc::invalid_argument,
               "update_priorities needs one priority per key: " + std::to_string(keys.size()) +
                   " keys, " + std::to_string(priorities.size()) + " priorities");
  check_not_null(keys.data(), keys.size(), "keys");
  check_not_null(priorities.data(), priorities.size(), "priorities");
  // Every key, then every priority: the order the GPU's checks report (check_priority_pair).
  for (std::size_t i = 0; i < keys.size(); ++i)
    GEAR_REQUIRE(b.owner_.owns(keys[i]), errc::key_out_of_range,
                 "key " + std::to_string(i) + " (shard " + std::to_string(keys[i].shard) +
                     ", incarnation " + std::to_string(keys[i].incarnation) +
                     ") is not of this shard");
  // The values, before anything changes: the policy's own check where it has an exponent (also
  // p^alpha in range), else finite and >= 0.
  if constexpr (requires { b.selection_->alpha(); }) {
    validate_priorities(keys, priorities, b.selection_->alpha(), b.capacity_);
  } else {
    for (std::size_t i = 0; i < priorities.size(); ++i)
      GEAR_REQUIRE(std::isfinite(priorities[i]) && priorities[i] >= 0, errc::invalid_priority,
                   "priority " + std::to_string(i) + " is " + std::to_string(priorities[i]) +
                       "; priorities must be finite and >= 0");
  }
  // Keys of landing inserts are published first, so that they count as live.
  settle_landing(b, landing_force{landing_force::kind::keys, {}, keys}, stream);
  std::int64_t stale = 0;
  for (const key& k : keys) stale += !b.ring_.holds(k.ticket);
  const auto n = static_cast<std::int64_t>(keys.size());
  std::vector<key> live_keys;
  std::vector<float> live_priorities;
  if (stale > 0) {
    live_keys.reserve(keys.size() - static_cast<std::size_t>(stale));
    live_priorities.reserve(live_keys.capacity());
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (b.ring_.holds(keys[i].ticket)) {
        live_keys.push_back(keys[i]);
        live_priorities.push_back(priorities[i]);
      }
  }
  // What the policy's update needs (staging), acquired before anything changes.
  if constexpr (requires { b.selection_->prepare_update(std::size_t{}); })
    b.selection_->prepare_update(stale == 0 ? keys.size() : live_keys.size());
  b.order_before(stream, Core::write);
  // The update's launches change the tree: one failing halfway leaves it untrustworthy.
  b.enqueue([&] {
    if (stale == 0)
      b.selection_->update(b.table(), keys, priorities, stream);
    else if (!live_keys.empty())
      b.selection_->update(b.table(), live_keys, live_priorities, stream);
    b.order_after(stream, Core::write, /*bytes=*/false);
  });
  ++b.calls_.priority_updates;
  b.calls_.priorities_applied += static_cast<std::uint64_t>(n - stale);
  b.calls_.priorities_stale += static_cast<std::uint64_t>(stale);
  return {n - stale, stale};
}

/// raise_earlier: as update_from_host's.
template <class Core>
void update_from_device(Core& b, std::span<const key> keys, std::span<const float> priorities,
                        cuda::stream_ref stream, bool raise_earlier = true) {
  const auto held = b.lock();
  b.check_usable();
  if constexpr (device_priority_update<typename Core::state_type>) {
    if (raise_earlier) b.selection_->raise_update_failures();
    GEAR_REQUIRE(keys.size() == priorities.size(), errc::invalid_argument,
                 "update_priorities needs one priority per key: " + std::to_string(keys.size()) +
                     " keys, " + std::to_string(priorities.size()) + " priorities");
    if (keys.empty()) {
      ++b.calls_.priority_updates;
      return;
    }
    GEAR_REQUIRE(keys.size() < (std::size_t{1} << 32), errc::invalid_argument,
                 "update_priorities takes fewer than 2^32 keys at once");
    check_gpu_readable(keys.data(), alignof(key), "keys");
    check_gpu_readable(priorities.data(), alignof(float), "priorities");
    // Captured into a CUDA graph, the update binds the buffer to its stream (stream_order.hpp):
    // its replays wait for no event of other streams.
    const bool captured = stream_capturing(stream);
    if (captured) b.order_.check_bind(stream.get());
    // Landing inserts whose bytes are still on their way stay so: their keys count as stale here.
    settle_landing(b, landing_force{}, stream);
    b.order_before(stream, Core::write, /*capturable=*/true, /*binding=*/captured);
    b.enqueue([&] {
      // A sharded_buffer's shard skips its siblings' keys (a state that may take them says so
      // with a last parameter).
      auto& state = *b.selection_;
      const std::uint32_t siblings = sibling_shards(b.transport_);
      if constexpr (requires {
                      state.update_from_device(b.table(), b.owner_, keys, priorities, stream,
                                               siblings);
                    })
        state.update_from_device(b.table(), b.owner_, keys, priorities, stream, siblings);
      else
        state.update_from_device(b.table(), b.owner_, keys, priorities, stream);
      b.order_after(stream, Core::write, /*bytes=*/false, /*binding=*/captured);
    });
    if (captured) b.order_.bind(stream.get());
    ++b.calls_.priority_updates;
  } else {
    (void)keys, (void)priorities, (void)stream, (void)raise_earlier;
    throw error(errc::wrong_memory,
                "this buffer takes priorities from host memory only (storage::host selects on "
                "the CPU; other policies may lack update_from_device): use memory_kind::host");
  }
}

/// update_priorities from `source`, synchronous (replay_buffer's and sharded_buffer's): host
/// spans as b.update_priorities does (its counts dropped); device memory between two
/// check_priority_updates, so that it throws only when the call changed nothing.
template <class Buffer>
void update_synchronously(Buffer& b, std::span<const key> keys, std::span<const float> priorities,
                          memory_kind source, cuda::stream_ref stream) {
  if (source == memory_kind::host) {
    (void)b.update_priorities(keys, priorities, stream);
    return;
  }
  b.check_priority_updates(stream);
  b.update_priorities_async(keys, priorities, source, stream);
  b.check_priority_updates(stream);
}

}  // namespace gear::detail
