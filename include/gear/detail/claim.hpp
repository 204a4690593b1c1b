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

/// Rows and slots claim_slot_for can name: below 2^24 - 1 and 2^40 - 1.
inline constexpr std::int64_t max_claiming_rows = (std::int64_t{1} << 24) - 1;
inline constexpr std::int64_t max_claiming_slots = (std::int64_t{1} << 40) - 1;

/// Claims `slot` for row `row` in `table` (as claim_slot; entries pack the row above the slot,
/// (row + 1) << 40 | (slot + 1), so slots below 2^40 - 1 and rows below 2^24 - 1). Returns true
/// if the slot is claimed by `row`, by this call or an earlier one for the same row, false if
/// another row holds it: several callers that walk one row's candidates in the same order agree
/// on its slot (the blocks of a gather that draw the same row).
GEAR_HD inline bool claim_slot_for(std::uint64_t* table, std::int64_t size, std::int64_t slot,
                                   std::int64_t row) {
  constexpr std::uint64_t slot_bits = (std::uint64_t{1} << 40) - 1;
  const std::uint64_t tag = static_cast<std::uint64_t>(slot) + 1;
  const std::uint64_t mine = static_cast<std::uint64_t>(row + 1) << 40 | tag;
  const std::uint64_t mask = static_cast<std::uint64_t>(size) - 1;
  std::uint64_t at = (tag * 0x9E3779B97F4A7C15ull) >> 20 & mask;
  for (;;) {
#if defined(__CUDA_ARCH__)
    const unsigned long long seen =
        atomicCAS(reinterpret_cast<unsigned long long*>(table + at), 0ull, mine);
#else
    const std::uint64_t seen = table[at];
    if (seen == 0) table[at] = mine;
#endif
    if (seen == 0) return true;
    if ((seen & slot_bits) == tag) return seen == mine;
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
