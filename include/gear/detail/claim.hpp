#pragma once
// A set of claimed slots in a caller-zeroed table of 2^k words (open addressing, linear probing),
// used to draw without replacement. On the device, claims from many threads race safely.

#include <cstdint>
#include <gear/config.hpp>

namespace gear::detail {

/// Bits of an entry that hold its slot (+ 1); claim_slot_for puts the row above them.
inline constexpr std::uint64_t claim_slot_bits = (std::uint64_t{1} << 40) - 1;

/// Probes `table` (size a power of two) for the entry of slot tag `tag` from the tag's hash,
/// writing `entry` into the first empty word: returns 0 if this call wrote it, else the entry
/// found for the tag (the word whose bits `tag_bits` equal the tag).
GEAR_HD inline std::uint64_t claim_entry(std::uint64_t* table, std::int64_t size, std::uint64_t tag,
                                         std::uint64_t entry, std::uint64_t tag_bits) {
  const std::uint64_t mask = static_cast<std::uint64_t>(size) - 1;
  std::uint64_t at = (tag * 0x9E3779B97F4A7C15ull) >> 20 & mask;
  for (;;) {
#if defined(__CUDA_ARCH__)
    const unsigned long long seen =
        atomicCAS(reinterpret_cast<unsigned long long*>(table + at), 0ull, entry);
#else
    const std::uint64_t seen = table[at];
    if (seen == 0) table[at] = entry;
#endif
    if (seen == 0 || (seen & tag_bits) == tag) return seen;
    at = (at + 1) & mask;
  }
}

/// Claims `slot` (any slot below 2^63 - 1) in `table` (size a power of two, larger than the
/// number of claims); returns true if this call claimed it, false if it was claimed before.
GEAR_HD inline bool claim_slot(std::uint64_t* table, std::int64_t size, std::int64_t slot) {
  const std::uint64_t tag = static_cast<std::uint64_t>(slot) + 1;  // 0 marks an empty entry
  return claim_entry(table, size, tag, tag, ~std::uint64_t{0}) == 0;
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
  const std::uint64_t tag = static_cast<std::uint64_t>(slot) + 1;
  const std::uint64_t mine = static_cast<std::uint64_t>(row + 1) << 40 | tag;
  const std::uint64_t seen = claim_entry(table, size, tag, mine, claim_slot_bits);
  return seen == 0 || seen == mine;
}

/// The scratch size (a power of two >= 2 * batch) that claim_slot needs for `batch` claims.
GEAR_HD constexpr std::int64_t claim_table_size(std::int64_t batch) noexcept {
  std::int64_t size = 2;
  while (size < 2 * batch) size *= 2;
  return size;
}

}  // namespace gear::detail
