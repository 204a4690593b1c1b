#pragma once
// Keys name one stored trajectory: its ticket (the insertion sequence number of its reservation),
// the shard that holds it, and that shard's incarnation.

#include <cstdint>
#include <gear/config.hpp>

namespace gear {

/// Identifies one trajectory. Ticket t lives in slot t % capacity; a slot's ticket changes every
/// time the slot is reserved again, so a key outlives its trajectory only as a stale key, which
/// every operation recognises (reads reject it, priority updates skip and count it). Tickets are
/// 64-bit and never reused: keys cannot wrap.
struct key {
  std::uint64_t ticket = 0;       ///< insertion sequence number of the trajectory's reservation
  std::uint32_t shard = 0;        ///< shard that owns the slot (0 with transport::local)
  std::uint32_t incarnation = 0;  ///< the shard's incarnation (transport::local: the buffer's)

  /// The slot this key's trajectory occupies in a shard of `capacity` slots.
  [[nodiscard]] GEAR_HD constexpr std::int64_t slot(std::int64_t capacity) const noexcept {
    return static_cast<std::int64_t>(ticket % static_cast<std::uint64_t>(capacity));
  }

  friend constexpr bool operator==(const key&, const key&) = default;
};

static_assert(sizeof(key) == 16);

/// Who owns keys: one shard in one incarnation (transport::local: shard 0 and a number no other
/// buffer of the process has, so that a key of another buffer is refused; a sharded_buffer's
/// shards: their index and one such number for all; a shard of a distributed buffer: its id and
/// a random incarnation drawn when it starts, so that keys from before a restart are told apart
/// from the new ones).
struct key_owner {
  std::uint32_t shard = 0;
  std::uint32_t incarnation = 0;

  [[nodiscard]] GEAR_HD constexpr bool owns(const key& k) const noexcept {
    return k.shard == shard && k.incarnation == incarnation;
  }
  friend constexpr bool operator==(const key_owner&, const key_owner&) = default;
};

/// The ticket no reservation ever gets: keys of rows that hold no trajectory carry it.
inline constexpr std::uint64_t no_ticket = ~std::uint64_t{0};

/// The consecutive tickets [first, first + count): trajectories reserved one after another.
struct ticket_run {
  std::uint64_t first = 0;
  std::int64_t count = 0;
  friend constexpr bool operator==(const ticket_run&, const ticket_run&) = default;
};

}  // namespace gear
