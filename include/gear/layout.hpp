#pragma once
// Slot layout: where each (slot, column, step) lives.
//
// One region of memory per placement (host, pinned host, device). Inside a region every slot owns
// one contiguous block, and inside it each column placed in the region owns one segment of
// max_length steps, time-major. Every segment starts on a 128-byte boundary:
//
//   region base
//   | slot 0                                  | slot 1                                  | ...
//   | col a: step 0..T-1 |pad| col b: 0..T-1 |pad| col a: step 0..T-1 |pad| col b ... |
//   ^ 128-aligned         ^ 128-aligned         ^ slot_bytes (multiple of 128)
//
// So any (slot, column, window of steps) is one contiguous byte range. All offsets are 64-bit.

#include <cstddef>
#include <cstdint>
#include <gear/config.hpp>

namespace gear {

/// Alignment of every column segment, in bytes.
inline constexpr std::int64_t segment_alignment = 128;

/// x rounded up to a multiple of a (a > 0).
GEAR_HD constexpr std::int64_t align_up(std::int64_t x, std::int64_t a) noexcept {
  return (x + a - 1) / a * a;
}

namespace detail {

/// Bytes one column segment of a slot takes, padding included.
GEAR_HD constexpr std::int64_t segment_bytes(std::int64_t step_bytes,
                                             std::int64_t max_len) noexcept {
  return align_up(step_bytes * max_len, segment_alignment);
}

/// Where one column's bytes start and how far apart its slots are.
struct column_geometry {
  std::byte* base = nullptr;     ///< column segment of slot 0 (host or device address)
  std::int64_t slot_stride = 0;  ///< bytes from one slot to the next in this column's region
  std::int64_t step_bytes = 0;   ///< bytes of one step

  /// Address of step `step` of slot `slot`.
  GEAR_HD constexpr std::byte* at(std::int64_t slot, std::int64_t step) const noexcept {
    return base + slot * slot_stride + step * step_bytes;
  }
};

}  // namespace detail
}  // namespace gear
