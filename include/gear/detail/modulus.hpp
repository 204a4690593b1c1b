#pragma once
// Remainders by a divisor fixed at construction (a buffer's capacity: slot = ticket % capacity),
// without a division instruction. A 64-bit `div` takes tens of cycles on the x86 servers GPUs sit
// in, and the host's bookkeeping of a sample or an insert takes a slot per row: a few hundred
// divisions were a large part of a fifo sample's host time.
//
// The quotient is computed with a multiply by a precomputed 64-bit reciprocal and two shifts
// (Granlund and Montgomery, "Division by invariant integers using multiplication", 1994, figure
// 4.1, for N = 64): exact for every 64-bit dividend, so no range is assumed of the tickets.
// Without a 128-bit integer type the plain remainder is used.

#include <cstdint>

namespace gear::detail {

class modulus {
 public:
  /// d >= 1.
  explicit modulus(std::uint64_t d) noexcept : d_(d) {
#if defined(__SIZEOF_INT128__)
    int l = 0;  // ceil(log2(d))
    while (l < 64 && (std::uint64_t{1} << l) < d) ++l;
    using u128 = unsigned __int128;
    // m = floor(2^64 * (2^l - d) / d) + 1, which fits in 64 bits since 2^l < 2d.
    const u128 two_l = u128{1} << l;
    multiplier_ = static_cast<std::uint64_t>(((two_l - d) << 64) / d) + 1;
    shift1_ = l < 1 ? l : 1;
    shift2_ = l > 1 ? l - 1 : 0;
#endif
  }

  /// n / d.
  [[nodiscard]] std::uint64_t quotient(std::uint64_t n) const noexcept {
#if defined(__SIZEOF_INT128__)
    const auto wide = static_cast<unsigned __int128>(multiplier_) * n;
    const auto t = static_cast<std::uint64_t>(wide >> 64);
    return (t + ((n - t) >> shift1_)) >> shift2_;
#else
    return n / d_;
#endif
  }

  /// n % d.
  [[nodiscard]] std::uint64_t operator()(std::uint64_t n) const noexcept {
    return n - quotient(n) * d_;
  }

 private:
  std::uint64_t d_;
  std::uint64_t multiplier_ = 0;
  int shift1_ = 0;
  int shift2_ = 0;
};

}  // namespace gear::detail
