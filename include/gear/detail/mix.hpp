#pragma once
// detail::mix64: splitmix64's finaliser, a bijection of 64-bit words whose every output bit
// depends on every input bit (seeds of shard shares, hash routing, incarnation starts).

#include <cstdint>

namespace gear::detail {

constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace gear::detail
