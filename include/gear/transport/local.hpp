#pragma once
#include <cstdint>
#include <gear/transport/concept.hpp>

namespace gear::transport {

/// One process, one shard: the whole buffer is local.
struct local {
  [[nodiscard]] constexpr std::uint32_t shard_id() const noexcept { return 0; }
  [[nodiscard]] constexpr std::uint32_t shard_count() const noexcept { return 1; }
};

static_assert(transport_policy<local>);

}  // namespace gear::transport
