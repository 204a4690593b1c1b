#pragma once
// gear::rng: the random stream sample() draws from. Counter-based (Philox-4x32-10), so the host
// and the device produce the same numbers for the same (seed, call, row, attempt). A sample is
// reproducible from its seed and the calls that built the buffer, in their order (it sees exactly
// the calls that returned before it started, on any stream: replay_buffer.hpp; two buffers of the
// same contents reached by erases in another order may draw other rows), except uniform without
// replacement on the GPU, whose rows race for slots (select/uniform.hpp).

#include <cstdint>
#include <gear/config.hpp>

namespace gear {

namespace detail {

/// Four 32-bit words.
struct u32x4 {
  std::uint32_t x, y, z, w;
};

GEAR_HD constexpr std::uint32_t mulhi32(std::uint32_t a, std::uint32_t b) noexcept {
  return static_cast<std::uint32_t>((std::uint64_t{a} * b) >> 32);
}

/// Philox-4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
GEAR_HD constexpr u32x4 philox(u32x4 ctr, std::uint32_t k0, std::uint32_t k1) noexcept {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint32_t hi0 = mulhi32(m0, ctr.x), lo0 = m0 * ctr.x;
    const std::uint32_t hi1 = mulhi32(m1, ctr.z), lo1 = m1 * ctr.z;
    ctr = {hi1 ^ ctr.y ^ k0, lo1, hi0 ^ ctr.w ^ k1, lo0};
    k0 += w0;
    k1 += w1;
  }
  return ctr;
}

/// (a * b) >> 64 for 64-bit unsigned a and b.
GEAR_HD constexpr std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b) noexcept {
  const std::uint64_t a_lo = a & 0xFFFFFFFFu, a_hi = a >> 32;
  const std::uint64_t b_lo = b & 0xFFFFFFFFu, b_hi = b >> 32;
  const std::uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi;
  const std::uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + lo_hi;
  return a_hi * b_hi + (hi_lo >> 32) + (cross >> 32);
}

/// The device words of a gear::device_rng: the next call number, and how many blocks of the
/// current sample's last kernel have finished (the last of them advances `call` and clears it).
struct draw_counter {
  std::uint64_t call;
  unsigned finished;
  unsigned unused;
};

}  // namespace detail

/// The random numbers of one sample() call: a seed and the call's number. Trivially copyable;
/// kernels take it by value.
struct rng_draw {
  std::uint64_t seed = 0;
  std::uint64_t call = 0;

  /// 4 x 32 random bits for (row, attempt, lane); lanes separate independent uses in one row.
  GEAR_HD constexpr detail::u32x4 bits(std::uint64_t row, std::uint32_t attempt) const noexcept {
    return detail::philox(
        {static_cast<std::uint32_t>(row), static_cast<std::uint32_t>(row >> 32), attempt,
         static_cast<std::uint32_t>(call)},
        static_cast<std::uint32_t>(seed),
        static_cast<std::uint32_t>(seed >> 32) ^ static_cast<std::uint32_t>(call >> 32));
  }

  /// Uniform integer in [0, n) for (row, attempt); bias below n / 2^64.
  GEAR_HD constexpr std::uint64_t below(std::uint64_t n, std::uint64_t row,
                                        std::uint32_t attempt) const noexcept {
    const detail::u32x4 r = bits(row, attempt);
    return detail::mulhi64((std::uint64_t{r.x} << 32) | r.y, n);
  }

  /// 64 more random bits for (row, attempt), independent of below()'s.
  GEAR_HD constexpr std::uint64_t extra(std::uint64_t row, std::uint32_t attempt) const noexcept {
    const detail::u32x4 r = bits(row, attempt);
    return (std::uint64_t{r.z} << 32) | r.w;
  }
};

/// A seeded random stream. Each sample() takes the next call number, so successive samples differ
/// and a run is reproducible from the seed.
class rng {
 public:
  explicit constexpr rng(std::uint64_t seed) noexcept : seed_(seed) {}

  /// The draw for the next call, advancing the stream.
  constexpr rng_draw next() noexcept { return {seed_, call_++}; }

  [[nodiscard]] constexpr std::uint64_t seed() const noexcept { return seed_; }
  [[nodiscard]] constexpr std::uint64_t calls() const noexcept { return call_; }

 private:
  std::uint64_t seed_;
  std::uint64_t call_ = 0;
};

}  // namespace gear
