#pragma once
// A set of claimed slots in a caller-zeroed table of 2^k words (open addressing, linear probing),
// used to draw without replacement. On the device, claims from many threads race safely.

#include <cstdint>
#include <gear/config.hpp>

namespace gear::detail {

/// Claims `slot` in `table` (size a power of two, larger than the number of claims); returns true
/// if this call claimed it, false if it was claimed before.
GEAR_HD inline bool claim_slot(std::uint64_t* table, std::int64_t size, std::int64_t slot) {
  const std::uint64_t tag = static_cast<std::uint64_t>(slot) + 1;  // 0 marks an empty entry
  const std::uint64_t mask = static_cast<std::uint64_t>(size) - 1;
  std::uint64_t at = (tag * 0x9E3779B97F4A7C15ull) >> 20 & mask;
  for (;;) {
#if defined(__CUDA_ARCH__)
    const unsigned long long seen =
        atomicCAS(reinterpret_cast<unsigned long long*>(table + at), 0ull, tag);
#else
    const std::uint64_t seen = table[at];
    if (seen == 0) table[at] = tag;
#endif
    if (seen == 0) return true;
    if (seen == tag) return false;
    at = (at + 1) & mask;
  }
}

/// The scratch size (a power of two >= 2 * batch) that claim_slot needs for `batch` claims.
GEAR_HD constexpr std::int64_t claim_table_size(std::int64_t batch) noexcept {
  std::int64_t size = 2;
  while (size < 2 * batch) size *= 2;
  return size;
}

}  // namespace gear::detail
