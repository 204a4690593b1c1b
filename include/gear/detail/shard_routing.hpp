#pragma once
// sharded_buffer's routing of keys to the shards they name (priority updates, erases), with every
// check made before any shard is asked; the failed updates from device memory that all shards
// recorded for one update, raised as one error; and what the split needs of a policy.

#include <algorithm>
#include <cstddef>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gear::detail {

/// Keys (and their priorities, when given) by the shard each key names.
struct routed_keys {
  std::vector<std::vector<key>> keys;
  std::vector<std::vector<float>> priorities;
};

/// Routes `keys` (with `priorities`, if not empty) to `shards` shards in one pass. Throws
/// errc::key_out_of_range for a key of a shard past them.
inline routed_keys route_keys(std::size_t shards, std::span<const key> keys,
                              std::span<const float> priorities = {}) {
  check_not_null(keys.data(), keys.size(), "keys");
  check_not_null(priorities.data(), priorities.size(), "priorities");
  routed_keys r{std::vector<std::vector<key>>(shards),
                std::vector<std::vector<float>>(priorities.empty() ? 0 : shards)};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    GEAR_REQUIRE(keys[i].shard < shards, errc::key_out_of_range,
                 "key " + std::to_string(i) + " names shard " + std::to_string(keys[i].shard) +
                     " of a buffer of " + std::to_string(shards) + " shards");
    r.keys[keys[i].shard].push_back(keys[i]);
    if (!priorities.empty()) r.priorities[keys[i].shard].push_back(priorities[i]);
  }
  return r;
}

/// Throws errc::key_out_of_range unless owner_of(s) owns every key routed to shard s (a key of
/// another incarnation of its shard), before any shard is asked.
template <class OwnerOf>
void check_owners(const routed_keys& r, OwnerOf&& owner_of) {
  for (std::size_t s = 0; s < r.keys.size(); ++s)
    for (const key& k : r.keys[s])
      GEAR_REQUIRE(owner_of(s).owns(k), errc::key_out_of_range,
                   "a key of shard " + std::to_string(s) + " names incarnation " +
                       std::to_string(k.incarnation) + ", not this buffer's shard's");
}

/// The shard an insert goes to on turn `turn`: one on device `here` (round robin among those),
/// if any; else (or with `here` -1) every shard in turn.
inline std::size_t route_insert(std::size_t turn, const std::vector<int>& devices, int here) {
  const auto local = static_cast<std::size_t>(std::count(devices.begin(), devices.end(), here));
  if (here >= 0 && local > 0)
    for (std::size_t s = 0, k = turn % local;; ++s)
      if (devices[s] == here && k-- == 0) return s;
  return turn % devices.size();
}

/// Sorts each shard's keys by ticket and throws errc::stale_key unless holds(s, key) for every
/// key of shard s and no key is named twice.
template <class Holds>
void check_erase(routed_keys& r, Holds&& holds) {
  for (std::size_t s = 0; s < r.keys.size(); ++s) {
    std::vector<key>& k = r.keys[s];
    std::sort(k.begin(), k.end(), [](const key& a, const key& b) { return a.ticket < b.ticket; });
    for (std::size_t i = 0; i < k.size(); ++i)
      GEAR_REQUIRE(holds(s, k[i]) && (i == 0 || k[i].ticket != k[i - 1].ticket), errc::stale_key,
                   "erase: shard " + std::to_string(s) + " does not hold key ticket " +
                       std::to_string(k[i].ticket) + " (evicted, removed or named twice)");
  }
}

/// Calls f(s) for every shard s < n, then throws the first gear::error any of them threw: one
/// update from device memory fails in every shard alike, and each shard's record of it is taken.
template <class F>
void raise_first_of(std::size_t n, F&& f) {
  std::optional<error> first;
  for (std::size_t s = 0; s < n; ++s) try {
      f(s);
    } catch (const error& e) {
      if (!first) first = e;
    }
  if (first) throw *first;
}

/// A policy's importance-sampling exponent (0 for a policy without one).
template <class Selection>
constexpr double beta_of(const Selection& s) noexcept {
  if constexpr (requires { s.beta; })
    return s.beta;
  else
    return 0.0;
}
/// Whether a policy draws distinct rows.
template <class Selection>
constexpr bool draws_without_replacement(const Selection& s) noexcept {
  if constexpr (requires { s.replacement; })
    return !s.replacement;
  else
    return false;
}

}  // namespace gear::detail
