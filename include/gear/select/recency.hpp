#pragma once
// Recency selection: among the newest K committed trajectories, with replacement, uniformly or
// weighted by age (weight 2^(-age / half_life), age in insertions, the newest having age 0).
// Age-weighted draws invert the CDF of the truncated geometric distribution over the window and
// redraw on slots that are not committed, so P(i) = w_i / (sum of the candidates' weights),
// exactly; the candidates' weight sum comes from a second host-side sum tree.
//
// The candidates are the committed trajectories among the last K reservations (tickets in
// [next_ticket - K, next_ticket)); pending or abandoned slots among them are skipped, so a batch
// may see fewer than K candidates while writers are open. Each row draws a ticket of that window
// uniformly and redraws while it hits a slot that is not committed, so every candidate has
// probability 1/m (m = candidates); weights are 1. Expected draws per row K / m.
//
// Every row makes at most 64 such draws; if all of them miss (few candidates among many pending
// slots, e.g. writers open on the newest tickets), the row is drawn exactly by one scan of the
// window instead, O(K). No loop is unbounded and no row is left without a trajectory while a
// candidate exists. half_life is 0 or at least 1/1024.
//
// Both states count m (and sum the weights) on the host with sum trees over slots kept current
// by the buffer's on_commit / on_evict hooks, O(log N) per slot changed and per sample. Every
// inner node is recomputed from its children, never adjusted by a delta, so the sums cannot drift
// however long the buffer runs.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/config.hpp>
#include <gear/detail/claim.hpp>
#include <gear/detail/modulus.hpp>
#include <gear/detail/select_rows.hpp>
#include <gear/error.hpp>
#include <gear/select/concept.hpp>
#include <gear/select/uniform.hpp>
#include <string>
#include <vector>

namespace gear::select {

/// Selection among the newest `newest` committed trajectories: uniform, or weighted by age.
struct recency {
  /// K: how many of the most recent reservations are candidates (>= 1).
  std::int64_t newest = 1024;
  /// 0: uniform over the candidates. h > 0: a candidate of age a (insertions since it, the newest
  /// having age 0) has weight 2^(-a / h), so its weight halves every h insertions.
  double half_life = 0;

  static constexpr bool reads_dense = false;  // draws among the newest tickets
  template <class Space>
  class state;
};

}  // namespace gear::select

namespace gear::detail {

/// A sum tree over the slots of a ring: leaves hold one value per slot; every inner node is
/// recomputed from its two children whenever a leaf below it changes, never adjusted by a delta,
/// so each node is a fixed function of the leaves (no drift, however many updates) and a range
/// sum over tickets costs O(log N). Ticket t lives in slot t % capacity.
template <class T>
class ring_sum_tree {
 public:
  ring_sum_tree() = default;
  explicit ring_sum_tree(std::int64_t capacity) : capacity_(capacity) {
    while (leaves_ < static_cast<std::size_t>(capacity)) leaves_ *= 2;
    nodes_.assign(2 * leaves_, T{});
  }

  void set(std::size_t slot, T value) {
    std::size_t k = leaves_ + slot;
    nodes_[k] = value;
    for (k /= 2; k >= 1; k /= 2) nodes_[k] = nodes_[2 * k] + nodes_[2 * k + 1];
  }
  [[nodiscard]] T at(std::size_t slot) const noexcept { return nodes_[leaves_ + slot]; }
  /// Every slot 0, keeping the memory.
  void clear() noexcept { std::fill(nodes_.begin(), nodes_.end(), T{}); }

  /// Sum over the slots of the tickets [lo, hi) (hi - lo <= capacity).
  [[nodiscard]] T sum(std::uint64_t lo, std::uint64_t hi) const noexcept {
    if (hi <= lo) return T{};
    const auto a = static_cast<std::size_t>(lo % static_cast<std::uint64_t>(capacity_));
    const auto n = static_cast<std::size_t>(hi - lo);
    const auto cap = static_cast<std::size_t>(capacity_);
    if (a + n <= cap) return range(a, a + n);
    return range(a, cap) + range(0, a + n - cap);
  }
  /// The inner nodes as recomputed from the leaves alone (for tests: equal to nodes()).
  [[nodiscard]] std::vector<T> rebuilt() const {
    std::vector<T> r = nodes_;
    for (std::size_t k = leaves_ - 1; k >= 1; --k) r[k] = r[2 * k] + r[2 * k + 1];
    return r;
  }
  [[nodiscard]] const std::vector<T>& nodes() const noexcept { return nodes_; }

 private:
  /// Sum of the slots [lo, hi): the canonical cover, bottom up.
  [[nodiscard]] T range(std::size_t lo, std::size_t hi) const noexcept {
    T left{}, right{};
    for (lo += leaves_, hi += leaves_; lo < hi; lo /= 2, hi /= 2) {
      if (lo & 1) left = left + nodes_[lo++];
      if (hi & 1) right = nodes_[--hi] + right;
    }
    return left + right;
  }

  std::int64_t capacity_ = 0;
  std::size_t leaves_ = 1;
  std::vector<T> nodes_;  // [1] the root; leaves from leaves_
};

/// Which slots hold committed trajectories, with O(log N) counts (and, with a half-life, age
/// weights) over ring ranges of tickets.
class committed_slots {
 public:
  explicit committed_slots(std::int64_t capacity)
      : capacity_(capacity),
        slot_of_(static_cast<std::uint64_t>(capacity)),
        flags_(static_cast<std::size_t>(capacity), 0),
        tickets_(static_cast<std::size_t>(capacity), 0),
        counts_(capacity) {}

  void set(std::uint64_t first_ticket, std::int64_t count, bool committed) {
    for (std::int64_t i = 0; i < count; ++i) {
      const std::uint64_t ticket = first_ticket + static_cast<std::uint64_t>(i);
      const auto slot = static_cast<std::size_t>(slot_of_(ticket));
      next_seen_ = std::max(next_seen_, ticket + 1);
      if (flags_[slot] == static_cast<std::uint8_t>(committed)) continue;
      flags_[slot] = static_cast<std::uint8_t>(committed);
      counts_.set(slot, committed ? 1 : 0);
      if (committed) tickets_[slot] = ticket;
      if (half_life_ > 0) {
        weights_.set(slot, committed ? weight(ticket) : 0.0);
        if (committed) note_weighted(slot);
      }
    }
  }

  /// Starts keeping age weights 2^((ticket - base) / h) of committed slots (h > 0), or stops (0).
  /// Allocates first (the weights and their list, once): throws std::bad_alloc unchanged; later
  /// rebases and commits allocate nothing.
  void set_half_life(double h) {
    if (h > 0 && weights_.nodes().empty()) {
      ring_sum_tree<double> fresh(capacity_);
      weighted_.reserve(flags_.size());
      weights_ = std::move(fresh);
    }
    half_life_ = h;
    rebase(next_seen_);
  }
  [[nodiscard]] double half_life() const noexcept { return half_life_; }
  /// Ticket whose weight is 1; weights are kept relative to it.
  [[nodiscard]] std::uint64_t base() const noexcept { return base_; }

  /// Moves the base up to next_ticket when weights would grow past 2^512; recomputes the weights
  /// of the slots that still matter (the newest 1100 half-lives, older ones weigh < 2^-1100 of
  /// the newest). Amortised O(log N) per insertion: a rebase visits the slots given a weight
  /// since the last one and the newest 1100 half-lives of tickets (every slot only while 1100
  /// half-lives span the capacity).
  void keep_in_range(std::uint64_t next_ticket) {
    if (half_life_ > 0 && static_cast<double>(next_ticket - base_) > 512 * half_life_)
      rebase(next_ticket);
  }

  /// Committed slots among the tickets [lo, hi) (hi - lo <= capacity).
  [[nodiscard]] std::int64_t count(std::uint64_t lo, std::uint64_t hi) const noexcept {
    return counts_.sum(lo, hi);
  }
  /// Sum of the weights of committed slots among the tickets [lo, hi).
  [[nodiscard]] double weight_sum(std::uint64_t lo, std::uint64_t hi) const noexcept {
    return weights_.sum(lo, hi);
  }
  /// The trees behind count() and weight_sum(), for inspection.
  [[nodiscard]] const ring_sum_tree<std::int64_t>& counts() const noexcept { return counts_; }
  [[nodiscard]] const ring_sum_tree<double>& weights() const noexcept { return weights_; }

 private:
  [[nodiscard]] double weight(std::uint64_t ticket) const noexcept {
    return std::exp2((static_cast<double>(ticket) - static_cast<double>(base_)) / half_life_);
  }
  /// Records that `slot` may hold a non-zero weight, for the next rebase to clear; past capacity
  /// entries, the next rebase clears the whole tree instead.
  void note_weighted(std::size_t slot) {
    if (weighted_all_) return;
    if (weighted_.size() >= flags_.size()) {
      weighted_all_ = true;
      weighted_.clear();
    } else {
      weighted_.push_back(slot);
    }
  }
  /// Weights relative to next_ticket: the committed slots of the newest 1100 half-lives of
  /// tickets get theirs again, every other slot 0.
  void rebase(std::uint64_t next_ticket) {
    base_ = next_ticket;
    if (half_life_ <= 0) {
      weights_ = ring_sum_tree<double>();
      weighted_.clear();
      weighted_all_ = false;
      return;
    }
    const auto span = static_cast<std::uint64_t>(std::min(1100.0 * half_life_, 1e18));
    if (weighted_all_ || span >= flags_.size()) {
      weights_.clear();
    } else {
      for (const std::size_t slot : weighted_) weights_.set(slot, 0.0);
    }
    weighted_.clear();
    weighted_all_ = false;
    auto reweigh = [&](std::size_t slot) {
      if (flags_[slot] != 0 && tickets_[slot] + span >= next_ticket) {
        weights_.set(slot, weight(tickets_[slot]));
        note_weighted(slot);
      }
    };
    if (span >= flags_.size()) {
      for (std::size_t slot = 0; slot < flags_.size(); ++slot) reweigh(slot);
    } else {
      for (std::uint64_t t = next_ticket > span ? next_ticket - span : 0; t < next_ticket; ++t)
        reweigh(static_cast<std::size_t>(slot_of_(t)));
    }
  }

  std::int64_t capacity_;
  modulus slot_of_;  // ticket -> slot without a division
  std::vector<std::uint8_t> flags_;
  std::vector<std::uint64_t> tickets_;  // ticket of each committed slot
  ring_sum_tree<std::int64_t> counts_;
  double half_life_ = 0;
  std::uint64_t base_ = 0;
  std::uint64_t next_seen_ = 0;        // one past the newest ticket set so far
  ring_sum_tree<double> weights_;      // age weights of committed slots (half_life_ > 0)
  std::vector<std::size_t> weighted_;  // slots given a weight since the last rebase
  bool weighted_all_ = false;          // too many to list: the next rebase clears every slot
};

/// The ticket window of a recency draw.
struct recency_window {
  std::uint64_t first = 0;      ///< oldest candidate ticket
  std::uint64_t size = 0;       ///< tickets in the window
  std::int64_t candidates = 0;  ///< committed slots among them (m)
  double half_life = 0;         ///< 0: uniform; else age weights 2^(-age / half_life)
  std::uint64_t base = 0;       ///< ticket of weight 1
  double total_weight = 0;      ///< weights of the candidates, relative to base
};

/// The candidates of a window in slot arrays (the device's or the host's copy), weighed
/// relative to the newest one (weight 1: their sum never underflows).
struct candidate_slots {
  const std::int64_t* lengths = nullptr;
  const std::uint64_t* tickets = nullptr;
  std::uint64_t capacity = 0;

  GEAR_HD bool committed(std::uint64_t ticket) const {
    const auto slot = static_cast<std::int64_t>(ticket % capacity);
    return lengths[slot] > 0 && tickets[slot] == ticket;
  }
  /// One past the ticket of w's newest candidate; 0 without any.
  GEAR_HD std::uint64_t newest_end(const recency_window& w) const {
    for (std::uint64_t k = w.size; k > 0; --k)
      if (committed(w.first + k - 1)) return w.first + k;
    return 0;
  }
  /// Weight of `ticket` relative to the newest candidate (ticket top - 1); 0 unless committed.
  GEAR_HD double weight(const recency_window& w, std::uint64_t top, std::uint64_t ticket) const {
    if (!committed(ticket)) return 0.0;
    if (w.half_life <= 0) return 1.0;
    return exp2(-static_cast<double>(top - 1 - ticket) / w.half_life);
  }
  /// Sum of the candidates' weights relative to the newest one (ticket top - 1).
  GEAR_HD double sum_below(const recency_window& w, std::uint64_t top) const {
    double total = 0;
    for (std::uint64_t ticket = top; ticket > w.first; --ticket)
      total += weight(w, top, ticket - 1);
    return total;
  }
};

inline recency_window make_recency_window(const slot_table& t, const committed_slots& c,
                                          std::int64_t newest) {
  recency_window w;
  w.size = static_cast<std::uint64_t>(std::min<std::int64_t>(newest, t.occupied));
  w.first = t.next_ticket - w.size;
  w.candidates = c.count(w.first, t.next_ticket);
  if (c.half_life() > 0) {
    w.half_life = c.half_life();
    w.base = c.base();
    w.total_weight = c.weight_sum(w.first, t.next_ticket);
    // Every candidate far below the base (the newest tickets pending): their weights underflow
    // relative to it. Summed again relative to the newest candidate, on the host's copy of the
    // slots: O(window), only then.
    if (!(w.total_weight >= 0x1p-900) && w.candidates > 0) {
      const candidate_slots host{t.host_lengths, t.host_tickets,
                                 static_cast<std::uint64_t>(t.capacity)};
      const std::uint64_t top = host.newest_end(w);
      w.base = top - 1;
      w.total_weight = host.sum_below(w, top);
    }
  }
  return w;
}

/// The age (0 = newest) of one draw from the truncated geometric distribution
/// P(a) proportional to 2^(-a / h) over a in [0, size), by inversion of its CDF.
GEAR_HD inline std::uint64_t draw_age(double u, double half_life, std::uint64_t size) {
  const double ln_q = -0.69314718055994530942 / half_life;       // q = 2^(-1/h)
  const double mass = -expm1(ln_q * static_cast<double>(size));  // 1 - q^size
  const double a = floor(log1p(-u * mass) / ln_q);
  if (!(a >= 0)) return 0;
  return a >= static_cast<double>(size) ? size - 1 : static_cast<std::uint64_t>(a);
}

/// The probability with which `slot` was drawn from window w.
GEAR_HD inline float recency_probability(const slot_table& t, const recency_window& w,
                                         std::int64_t slot) {
  if (slot < 0) return 0.0f;
  if (w.half_life <= 0) return 1.0f / static_cast<float>(w.candidates);
  const double age = static_cast<double>(t.tickets[slot]) - static_cast<double>(w.base);
  return static_cast<float>(exp2(age / w.half_life) / w.total_weight);
}

/// The exact draw of one row by a scan of the window (recency_row's fallback): the candidates'
/// weights (relative to the newest candidate, weight 1, so they never all underflow) are summed,
/// then the draw u in [0, 1) is found among them. O(window) per row; -1 only without any
/// candidate.
GEAR_HD inline std::int64_t recency_scan(const slot_table& t, const recency_window& w, double u) {
  const candidate_slots c{t.lengths, t.tickets, static_cast<std::uint64_t>(t.capacity)};
  const std::uint64_t top = c.newest_end(w);
  if (top == 0) return -1;
  const double total = c.sum_below(w, top);
  const std::int64_t newest = static_cast<std::int64_t>((top - 1) % c.capacity);
  const double target = u * total;
  double sum = 0;
  std::int64_t last = newest;
  for (std::uint64_t ticket = top; ticket-- > w.first;) {
    const double x = c.weight(w, top, ticket);
    if (x <= 0) continue;
    last = static_cast<std::int64_t>(ticket % c.capacity);
    sum += x;
    if (target < sum) return last;
  }
  return last;  // rounding: the last candidate
}

/// Rejection draws recency_row makes before it falls back to an exact scan of the window.
inline constexpr std::uint32_t recency_attempts = 64;

/// recency_row's draws: the slot of the first that hits a committed slot, -1 if every one misses.
GEAR_HD inline std::int64_t recency_draws(const slot_table& t, const selection_request& r,
                                          const recency_window& w, std::int64_t row) {
  for (std::uint32_t attempt = 0; attempt < recency_attempts; ++attempt) {
    std::uint64_t ticket;
    if (w.half_life > 0) {
      const double u = static_cast<double>(r.draw.below(std::uint64_t{1} << 53,
                                                        static_cast<std::uint64_t>(row), attempt)) *
                       0x1p-53;
      ticket = w.first + w.size - 1 - draw_age(u, w.half_life, w.size);
    } else {
      ticket = w.first + r.draw.below(w.size, static_cast<std::uint64_t>(row), attempt);
    }
    const auto slot = static_cast<std::int64_t>(ticket % static_cast<std::uint64_t>(t.capacity));
    if (t.lengths[slot] > 0) return slot;
  }
  return -1;
}

/// The draw in [0, 1) of row's exact scan (recency_row's fallback).
GEAR_HD inline double recency_scan_draw(const selection_request& r, std::int64_t row) {
  return static_cast<double>(r.draw.below(std::uint64_t{1} << 53, static_cast<std::uint64_t>(row),
                                          recency_attempts)) *
         0x1p-53;
}

/// Selects the slot of one row (see gear::select::recency): up to recency_attempts draws from
/// the whole window, redrawn while they hit a slot that is not committed; then, if every one
/// missed (few candidates among many pending slots), one exact scan. -1 only without candidates.
GEAR_HD inline std::int64_t recency_row(const slot_table& t, const selection_request& r,
                                        const recency_window& w, std::int64_t row) {
  const std::int64_t slot = recency_draws(t, r, w, row);
  return slot >= 0 ? slot : recency_scan(t, w, recency_scan_draw(r, row));
}

/// Row function of recency selection (see selection_policy_for's row_selector).
struct recency_rows {
  slot_table table;
  selection_request request;
  recency_window window;
  static constexpr bool per_thread = true;  // each thread may draw a row on its own

  GEAR_HD selected_row operator()(std::int64_t row) const {
    const std::int64_t slot = recency_row(table, request, window, row);
    return {slot, probability(slot), 1.0f};
  }
  /// The probability of a row's `slot` (-1: none).
  GEAR_HD float probability(std::int64_t slot) const {
    return recency_probability(table, window, slot);
  }
};

inline void validate_recency(const slot_table& t, const committed_slots& c, std::int64_t newest) {
  GEAR_REQUIRE(make_recency_window(t, c, newest).candidates > 0, errc::not_enough_items,
               "none of the newest " + std::to_string(newest) + " reservations is committed");
}

/// The smallest half-life other than 0: below it even the newest candidates' relative weights
/// (2^(-1/h) per insertion) underflow double precision within a few insertions.
inline constexpr double min_half_life = 1.0 / 1024;

inline void validate_half_life(double half_life) {
  GEAR_REQUIRE(std::isfinite(half_life) && (half_life == 0 || half_life >= min_half_life),
               errc::invalid_argument,
               "recency needs half_life 0 (uniform) or a finite value >= 1/1024, got " +
                   std::to_string(half_life));
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
    validate_half_life(policy.half_life);
    committed_.set_half_life(policy.half_life);
  }

  /// Changes the half-life (0: uniform). O(capacity) at most. Throws errc::invalid_argument
  /// unless 0 or finite and >= 1/1024 (min_half_life); std::bad_alloc, unchanged.
  void set_half_life(double half_life) {
    validate_half_life(half_life);
    committed_.set_half_life(half_life);
    policy_.half_life = half_life;
  }
  [[nodiscard]] double half_life() const noexcept { return policy_.half_life; }

  /// Changes K. Throws errc::invalid_argument below 1.
  void set_newest(std::int64_t newest) {
    validate_newest(newest);
    policy_.newest = newest;
  }
  [[nodiscard]] std::int64_t newest() const noexcept { return policy_.newest; }
  /// Which slots are committed, with their counts and weights, as the state keeps them.
  [[nodiscard]] const committed_slots& committed() const noexcept { return committed_; }
  /// The settings as they are now.
  [[nodiscard]] const select::recency& policy() const noexcept { return policy_; }

  void validate(const slot_table& t, std::int64_t) const {
    validate_recency(t, committed_, policy_.newest);
  }

  void on_commit(const slot_table& t, std::uint64_t first, std::int64_t count, cuda::stream_ref) {
    committed_.keep_in_range(t.next_ticket);
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
    detail::select_rows_on_host(detail::recency_rows{t, r, window(t)}, r);
  }
};

}  // namespace gear::select
