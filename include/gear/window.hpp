#pragma once
// Windows: which steps of a trajectory a sampled row holds, and where they land in the row.

#include <cstdint>
#include <gear/config.hpp>
#include <gear/error.hpp>
#include <string>

namespace gear {

/// What a window's offset is measured from.
enum class anchor : std::uint8_t {
  start,   ///< steps [offset, offset + length)
  end,     ///< the window ends `offset` steps before the trajectory's last step
  random,  ///< first step drawn uniformly from [offset, max(offset, len - length)]
};

/// Where a row's padding goes when the trajectory has fewer steps than the window.
enum class pad : std::uint8_t {
  tail,  ///< valid steps first, zeros after (mask 1...1 0...0)
  head,  ///< zeros first, valid steps last (mask 0...0 1...1), as causal transformers expect
};

/// A window of `length` steps taken from each sampled trajectory.
/// Requires length >= 1 and 0 <= offset < the buffer's max_length.
struct window {
  std::int64_t length = 1;
  std::int64_t offset = 0;
  anchor from = anchor::start;
  pad padding = pad::tail;
};

/// The window resolved against one trajectory: copy `count` steps starting at trajectory step
/// `src_step` to row positions [dst_pos, dst_pos + count); every other position is padding.
struct window_plan {
  std::int64_t src_step = 0;
  std::int64_t count = 0;
  std::int64_t dst_pos = 0;
};

/// Resolves window w against a trajectory of `length` steps. `random_bits` chooses the first step
/// for anchor::random (uniform up to a bias below 2^-32 for lengths below 2^32).
GEAR_HD constexpr window_plan plan_window(const window& w, std::int64_t length,
                                          std::uint64_t random_bits) noexcept {
  std::int64_t first = w.offset;
  if (w.from == anchor::end) {
    first = length - w.offset - w.length;
  } else if (w.from == anchor::random) {
    const std::int64_t last = length - w.length;
    if (last > w.offset) {
      const auto choices = static_cast<std::uint64_t>(last - w.offset + 1);
      first = w.offset + static_cast<std::int64_t>((random_bits >> 32) * choices >> 32);
    }
  }
  const std::int64_t lo = first < 0 ? 0 : first;
  const std::int64_t end = first + w.length;
  const std::int64_t hi = end < length ? end : length;
  window_plan p;
  p.count = hi > lo ? hi - lo : 0;
  p.src_step = p.count > 0 ? lo : 0;
  p.dst_pos = w.padding == pad::head ? w.length - p.count : 0;
  return p;
}

namespace detail {

/// Throws unless w suits trajectories of at most `max_length` steps: errc::empty_window,
/// errc::window_out_of_range (offset outside [0, max_length), an anchor or padding of no name).
inline void check_window(const window& w, std::int64_t max_length) {
  GEAR_REQUIRE(w.length >= 1, errc::empty_window,
               "window length must be at least 1, got " + std::to_string(w.length));
  GEAR_REQUIRE(w.offset >= 0 && w.offset < max_length, errc::window_out_of_range,
               "window offset must be in [0, max_length = " + std::to_string(max_length) +
                   "), got " + std::to_string(w.offset));
  GEAR_REQUIRE(w.from == anchor::start || w.from == anchor::end || w.from == anchor::random,
               errc::window_out_of_range, "window anchor is not start, end or random");
  GEAR_REQUIRE(w.padding == pad::head || w.padding == pad::tail, errc::window_out_of_range,
               "window padding is not head or tail");
}

}  // namespace detail

}  // namespace gear
