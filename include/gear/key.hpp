#pragma once
// Keys name one stored trajectory: its shard, slot and the slot's generation when it was written.

#include <cstdint>
#include <gear/config.hpp>

namespace gear {

/// Identifies one trajectory. A slot's generation is bumped every time the slot is overwritten or
/// removed, so a key outlives its trajectory only as a stale key, which every operation rejects.
struct key {
  std::uint64_t slot = 0;        ///< slot index within the shard
  std::uint32_t generation = 0;  ///< slot generation when the trajectory was committed
  std::uint32_t shard = 0;       ///< shard that owns the slot (0 with transport::local)

  friend constexpr bool operator==(const key&, const key&) = default;
};

static_assert(sizeof(key) == 16);

}  // namespace gear
