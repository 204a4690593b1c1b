#pragma once
// Decentralised sampling, the learner's side of the maths: how a batch of B rows is split across
// shards, and the global probability and importance weight of each row.
//
// With replacement, each row picks its shard with probability M_s / M (M_s: the shard's selection
// mass in the learner's snapshot, sum p^alpha for prioritized, its size for uniform), so the
// shares are Multinomial(B, M_s / M); the shard then draws its rows with probability p_i / M'_s
// (M'_s: its mass when it selects). A row's probability is their product,
//     P_i = (M_s / M) * (p_i / M'_s),
// which equals the union's p_i / M when nothing changed since the snapshot. Without replacement
// (uniform), the shares are multivariate hypergeometric on the shards' sizes: every B-subset of
// the union is equally likely. Shards that are lost, or hold no mass, get no rows, and the
// probabilities are those of the live union. Importance weights follow the local formula over the
// union: w_i = (N P_i)^-beta / max_j (N P_j)^-beta, N the union's size.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <gear/detail/mix.hpp>
#include <gear/error.hpp>
#include <gear/rng.hpp>
#include <span>
#include <string>
#include <vector>

namespace gear::detail::remote {

/// One shard as the learner's snapshot has it.
struct shard_share {
  double mass = 0;        ///< M_s
  std::int64_t size = 0;  ///< N_s
  bool live = true;
};

/// A uniform double in [0, 1) from 53 random bits.
GEAR_HD constexpr double unit_double(std::uint64_t bits) noexcept {
  return static_cast<double>(bits >> 11) * 0x1p-53;
}

/// The random stream of one shard's share: the sample's seed and call, mixed (splitmix64's
/// finaliser), so that every shard draws its rows from a stream of its own.
constexpr std::uint64_t share_seed(std::uint64_t seed, std::uint64_t call) noexcept {
  return mix64(seed ^ (call + 0x9E3779B97F4A7C15ull + (seed << 6) + (seed >> 2)));
}

/// Throws errc::invalid_argument for a mass or size that is not finite and non-negative.
inline void check_shares(std::span<const shard_share> shards) {
  for (std::size_t s = 0; s < shards.size(); ++s) {
    GEAR_REQUIRE(
        std::isfinite(shards[s].mass) && shards[s].mass >= 0, errc::invalid_argument,
        "shard " + std::to_string(s) + " reports selection mass " + std::to_string(shards[s].mass));
    GEAR_REQUIRE(shards[s].size >= 0, errc::invalid_argument,
                 "shard " + std::to_string(s) + " reports size " + std::to_string(shards[s].size));
  }
}

/// The mass of the live shards (M).
inline double live_mass(std::span<const shard_share> shards) noexcept {
  double m = 0;
  for (const shard_share& s : shards)
    if (s.live) m += s.mass;
  return m;
}

/// Rows per shard for `batch` rows drawn with replacement: Multinomial(batch, M_s / M) over the
/// live shards, from `draw` (one draw per row), into `rows` (with `upto` as scratch: a learner
/// splits every sample, and keeps both). Throws errc::empty_buffer when no live shard has mass,
/// errc::invalid_argument for a negative batch or a bad snapshot.
inline void split_with_replacement(std::span<const shard_share> shards, std::int64_t batch,
                                   rng_draw draw, std::vector<std::int64_t>& rows,
                                   std::vector<double>& upto) {
  check_shares(shards);
  GEAR_REQUIRE(batch >= 0, errc::invalid_argument, "batch " + std::to_string(batch));
  upto.assign(shards.size(), 0.0);
  double total = 0;
  std::size_t last = shards.size();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    if (shards[s].live && shards[s].mass > 0) {
      total += shards[s].mass;
      last = s;
    }
    upto[s] = total;
  }
  GEAR_REQUIRE(
      last < shards.size(), errc::empty_buffer,
      "no live shard holds anything to sample (" + std::to_string(shards.size()) + " shards)");
  rows.assign(shards.size(), 0);
  for (std::int64_t r = 0; r < batch; ++r) {
    const double x = unit_double(draw.extra(static_cast<std::uint64_t>(r), 0)) * total;
    // The first shard whose running mass passes x: shards without mass are never it.
    auto s = static_cast<std::size_t>(std::upper_bound(upto.begin(), upto.end(), x) - upto.begin());
    if (s >= shards.size()) s = last;  // x rounded up to the total
    ++rows[s];
  }
}
inline std::vector<std::int64_t> split_with_replacement(std::span<const shard_share> shards,
                                                        std::int64_t batch, rng_draw draw) {
  std::vector<std::int64_t> rows;
  std::vector<double> upto;
  split_with_replacement(shards, batch, draw, rows, upto);
  return rows;
}

/// Rows per shard for `batch` distinct rows drawn uniformly from the live shards' union:
/// multivariate hypergeometric on their sizes. Throws errc::not_enough_items when the union holds
/// fewer than `batch` trajectories.
inline std::vector<std::int64_t> split_without_replacement(std::span<const shard_share> shards,
                                                           std::int64_t batch, rng_draw draw) {
  check_shares(shards);
  GEAR_REQUIRE(batch >= 0, errc::invalid_argument, "batch " + std::to_string(batch));
  std::vector<std::int64_t> left(shards.size()), rows(shards.size());
  std::int64_t total = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    left[s] = shards[s].live ? shards[s].size : 0;
    total += left[s];
  }
  GEAR_REQUIRE(total >= batch, errc::not_enough_items,
               std::to_string(batch) + " distinct rows asked of live shards holding " +
                   std::to_string(total) + " trajectories");
  for (std::int64_t r = 0; r < batch; ++r, --total) {
    auto j = static_cast<std::int64_t>(
        draw.below(static_cast<std::uint64_t>(total), static_cast<std::uint64_t>(r), 1));
    std::size_t s = 0;
    while (j >= left[s]) j -= left[s++];
    --left[s];
    ++rows[s];
  }
  return rows;
}

/// P_i for a row a shard drew with its own probability `local` (p_i / M'_s), the shard having
/// `shard_mass` (M_s) of the snapshot's live `total_mass` (M).
GEAR_HD constexpr double global_probability(double shard_mass, double total_mass,
                                            double local) noexcept {
  return shard_mass / total_mass * local;
}

/// Importance weights of a batch: w_i = (N P_i)^-beta / max_j (N P_j)^-beta over the union of N
/// trajectories, with `w` as scratch (a learner keeps it). Rows with P_i = 0 (padding) get weight
/// 0.
inline void importance_weights(std::span<const double> probabilities, std::int64_t union_size,
                               double beta, std::span<float> out, std::vector<double>& w) {
  double max_w = 0;
  w.resize(probabilities.size());
  for (std::size_t i = 0; i < probabilities.size(); ++i) {
    const double p = probabilities[i];
    w[i] = p > 0 ? std::pow(static_cast<double>(union_size) * p, -beta) : 0.0;
    max_w = std::max(max_w, w[i]);
  }
  for (std::size_t i = 0; i < probabilities.size() && i < out.size(); ++i)
    out[i] = max_w > 0 ? static_cast<float>(w[i] / max_w) : 0.0f;
}
inline void importance_weights(std::span<const double> probabilities, std::int64_t union_size,
                               double beta, std::span<float> out) {
  std::vector<double> w;
  importance_weights(probabilities, union_size, beta, out, w);
}

}  // namespace gear::detail::remote
