#pragma once
// Recency selection: uniform over the newest K committed trajectories, with replacement.
//
// The candidates are the committed trajectories among the last K reservations (tickets in
// [next_ticket - K, next_ticket)); pending or abandoned slots among them are skipped, so a batch
// may see fewer than K candidates while writers are open. Each row draws a ticket of that window
// uniformly and redraws while it hits a slot that is not committed, so every candidate has
// probability 1/m (m = candidates); weights are 1. Expected draws per row K / m.
//
// Both states count m on the host with a Fenwick tree over slots kept current by the buffer's
// on_commit / on_evict hooks, O(log N) per slot changed and per sample.

#include <algorithm>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/config.hpp>
#include <gear/detail/claim.hpp>
#include <gear/error.hpp>
#include <gear/select/concept.hpp>
#include <gear/select/uniform.hpp>
#include <string>
#include <vector>

namespace gear::select {

/// Uniform selection over the newest `newest` committed trajectories.
struct recency {
  /// K: how many of the most recent reservations are candidates (>= 1).
  std::int64_t newest = 1024;

  template <class Space>
  class state;
};

}  // namespace gear::select

namespace gear::detail {

/// Which slots hold committed trajectories, with O(log N) counts over ring ranges of tickets.
class committed_slots {
 public:
  explicit committed_slots(std::int64_t capacity)
      : capacity_(capacity),
        flags_(static_cast<std::size_t>(capacity), 0),
        fenwick_(static_cast<std::size_t>(capacity) + 1, 0) {}

  void set(std::uint64_t first_ticket, std::int64_t count, bool committed) {
    for (std::int64_t i = 0; i < count; ++i) {
      const auto slot = static_cast<std::size_t>((first_ticket + static_cast<std::uint64_t>(i)) %
                                                 static_cast<std::uint64_t>(capacity_));
      if (flags_[slot] == static_cast<std::uint8_t>(committed)) continue;
      flags_[slot] = static_cast<std::uint8_t>(committed);
      for (std::size_t k = slot + 1; k < fenwick_.size(); k += k & (~k + 1))
        fenwick_[k] += committed ? 1 : -1;
    }
  }

  /// Committed slots among the tickets [lo, hi) (hi - lo <= capacity).
  [[nodiscard]] std::int64_t count(std::uint64_t lo, std::uint64_t hi) const noexcept {
    if (hi <= lo) return 0;
    const auto cap = static_cast<std::uint64_t>(capacity_);
    const auto a = static_cast<std::int64_t>(lo % cap);
    const auto n = static_cast<std::int64_t>(hi - lo);
    if (a + n <= capacity_) return prefix(a + n) - prefix(a);
    return prefix(capacity_) - prefix(a) + prefix(a + n - capacity_);
  }

 private:
  [[nodiscard]] std::int64_t prefix(std::int64_t end) const noexcept {
    std::int64_t s = 0;
    for (auto k = static_cast<std::size_t>(end); k > 0; k -= k & (~k + 1)) s += fenwick_[k];
    return s;
  }

  std::int64_t capacity_;
  std::vector<std::uint8_t> flags_;
  std::vector<std::int64_t> fenwick_;
};

/// The ticket window of a recency draw.
struct recency_window {
  std::uint64_t first = 0;      ///< oldest candidate ticket
  std::uint64_t size = 0;       ///< tickets in the window
  std::int64_t candidates = 0;  ///< committed slots among them (m)
};

inline recency_window make_recency_window(const slot_table& t, const committed_slots& c,
                                          std::int64_t newest) {
  recency_window w;
  w.size = static_cast<std::uint64_t>(std::min<std::int64_t>(newest, t.occupied));
  w.first = t.next_ticket - w.size;
  w.candidates = c.count(w.first, t.next_ticket);
  return w;
}

/// Selects the slot of one row (see gear::select::recency); -1 if no candidate was found.
GEAR_HD inline std::int64_t recency_row(const slot_table& t, const selection_request& r,
                                        const recency_window& w, std::int64_t row) {
  for (std::uint32_t attempt = 0; attempt < max_uniform_attempts; ++attempt) {
    const std::uint64_t ticket =
        w.first + r.draw.below(w.size, static_cast<std::uint64_t>(row), attempt);
    const auto slot = static_cast<std::int64_t>(ticket % static_cast<std::uint64_t>(t.capacity));
    if (t.lengths[slot] > 0) return slot;
  }
  return -1;
}

inline void validate_recency(const slot_table& t, const committed_slots& c, std::int64_t newest) {
  GEAR_REQUIRE(make_recency_window(t, c, newest).candidates > 0, errc::not_enough_items,
               "none of the newest " + std::to_string(newest) + " reservations is committed");
}

inline void validate_newest(std::int64_t newest) {
  GEAR_REQUIRE(newest >= 1, errc::invalid_argument,
               "recency needs newest >= 1, got " + std::to_string(newest));
}

/// What the host and device states of recency share: K, the committed-slot counts and the
/// buffer's hooks that keep them current. The two states differ only in how they select.
class recency_state_base {
 public:
  recency_state_base(const select::recency& policy, std::int64_t capacity)
      : policy_(policy), committed_(capacity) {
    validate_newest(policy.newest);
  }

  /// Changes K. Throws errc::invalid_argument below 1.
  void set_newest(std::int64_t newest) {
    validate_newest(newest);
    policy_.newest = newest;
  }
  [[nodiscard]] std::int64_t newest() const noexcept { return policy_.newest; }

  void validate(const slot_table& t, std::int64_t) const {
    validate_recency(t, committed_, policy_.newest);
  }

  void on_commit(const slot_table&, std::uint64_t first, std::int64_t count, cuda::stream_ref) {
    committed_.set(first, count, true);
  }
  void on_evict(const slot_table&, std::uint64_t first, std::int64_t count, cuda::stream_ref) {
    committed_.set(first, count, false);
  }

 protected:
  [[nodiscard]] recency_window window(const slot_table& t) const {
    return make_recency_window(t, committed_, policy_.newest);
  }

 private:
  select::recency policy_;
  committed_slots committed_;
};

}  // namespace gear::detail

namespace gear::select {

/// Host side: a loop over rows.
template <>
class recency::state<exec::host> : public detail::recency_state_base {
 public:
  using recency_state_base::recency_state_base;

  void select(const slot_table& t, const selection_request& r, cuda::stream_ref) {
    const detail::recency_window w = window(t);
    const float p = 1.0f / static_cast<float>(w.candidates);
    for (std::int64_t row = 0; row < r.batch; ++row) {
      r.slots[row] = detail::recency_row(t, r, w, row);
      r.probabilities[row] = p;
      r.weights[row] = 1.0f;
    }
  }
};

}  // namespace gear::select
