#pragma once
// The slot ring: which trajectory each slot holds, as a pure host state machine.
//
// The n-th reservation ever made gets ticket n and slot n % capacity; when the ring comes round,
// the slot's previous occupant is evicted. Each slot is
//
//   empty ──reserve──> pending ──commit──> committed ──remove / reserve again──> ...
//                        └──abandon──> empty
//
// and holds the ticket of its latest reservation. A key names a ticket; it is live while its slot
// still holds that ticket, committed. Tickets are 64-bit: keys never wrap.
//
// The committed slots are also kept dense: dense()[0, live) holds each once (in no particular
// order; a removal moves the last one into the hole), so uniform selection draws a position in
// [0, live) and is done, whatever the occupancy. The positions each transition writes are
// collected and handed out by take_index_changes() as index_records, for the device's copy. A
// ring made without the index (its buffer's policy reads none) keeps only the live count.
//
// Every transition is noexcept, allocates nothing and writes the slot_records that carry it to
// the device mirror (mirror.hpp) into memory the caller acquired beforehand, so a call can acquire
// everything that may fail first and change state last. Not synchronised: the buffer serialises
// the calls.

#include <algorithm>
#include <cstdint>
#include <gear/detail/buffer/mirror.hpp>
#include <gear/detail/modulus.hpp>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <gear/ref.hpp>
#include <span>
#include <string>
#include <vector>

namespace gear::detail {

enum class slot_state : std::uint8_t { empty = 0, pending = 1, committed = 2 };

/// Calls f(first, count) for each run of consecutive tickets in `tickets` (ascending one by one
/// within a run): the policy's hooks and the ring's removal take runs.
template <class Tickets, class F>
void for_each_ticket_run(const Tickets& tickets, F&& f) {
  for (std::size_t i = 0; i < tickets.size();) {
    std::size_t end = i + 1;
    while (end < tickets.size() && tickets[end] == tickets[end - 1] + 1) ++end;
    f(static_cast<std::uint64_t>(tickets[i]), static_cast<std::int64_t>(end - i));
    i = end;
  }
}

class slot_ring {
 public:
  /// `buffer_id` is stamped into reservations so that another buffer's are refused. `indexed`:
  /// keep the dense index of committed slots (without it, dense() is null and no transition
  /// writes index changes).
  slot_ring(std::int64_t capacity, std::uint64_t buffer_id, bool indexed = true)
      : capacity_(capacity),
        slot_of_(static_cast<std::uint64_t>(capacity)),
        buffer_id_(buffer_id),
        lengths_(static_cast<std::size_t>(capacity), 0),
        tickets_(static_cast<std::size_t>(capacity), 0),
        states_(static_cast<std::size_t>(capacity), slot_state::empty) {
    if (!indexed) return;
    const auto n = static_cast<std::size_t>(capacity);
    dense_.assign(n, 0);
    where_.assign(n, 0);
    touched_at_.assign(n, 0);
    touched_.reserve(n);
  }

  // ---- queries -------------------------------------------------------------------------------

  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  /// The number stamped into this ring's reservations.
  [[nodiscard]] std::uint64_t buffer_id() const noexcept { return buffer_id_; }
  /// Committed trajectories.
  [[nodiscard]] std::int64_t live() const noexcept { return live_; }
  /// Reserved slots not yet committed or abandoned.
  [[nodiscard]] std::int64_t pending() const noexcept { return pending_; }
  /// Since the ring was made: trajectories committed, committed ones evicted by a reservation,
  /// and committed ones removed.
  [[nodiscard]] std::uint64_t committed_total() const noexcept { return committed_total_; }
  [[nodiscard]] std::uint64_t evicted_total() const noexcept { return evicted_total_; }
  [[nodiscard]] std::uint64_t removed_total() const noexcept { return removed_total_; }
  /// The ticket the next reservation gets (reservations made so far).
  [[nodiscard]] std::uint64_t next_ticket() const noexcept { return next_ticket_; }
  /// Slots [0, occupied) have been reserved at least once.
  [[nodiscard]] std::int64_t occupied() const noexcept {
    return static_cast<std::int64_t>(
        std::min<std::uint64_t>(next_ticket_, static_cast<std::uint64_t>(capacity_)));
  }
  [[nodiscard]] std::int64_t slot_of(std::uint64_t ticket) const noexcept {
    return static_cast<std::int64_t>(slot_of_(ticket));
  }
  [[nodiscard]] std::int64_t length(std::int64_t slot) const noexcept { return lengths_[at(slot)]; }
  [[nodiscard]] std::uint64_t ticket(std::int64_t slot) const noexcept {
    return tickets_[at(slot)];
  }
  [[nodiscard]] slot_state state(std::int64_t slot) const noexcept { return states_[at(slot)]; }
  /// Committed lengths (0 unless committed) and tickets, [capacity], for host-side selection.
  [[nodiscard]] const std::int64_t* lengths() const noexcept { return lengths_.data(); }
  [[nodiscard]] const std::uint64_t* tickets() const noexcept { return tickets_.data(); }
  [[nodiscard]] const slot_state* states() const noexcept { return states_.data(); }
  /// [capacity]: positions [0, live) hold every committed slot once. Null without the index.
  [[nodiscard]] const std::int64_t* dense() const noexcept {
    return indexed() ? dense_.data() : nullptr;
  }
  [[nodiscard]] bool indexed() const noexcept { return !dense_.empty(); }  // capacity >= 1

  /// Index positions written since the last take_index_changes (at most capacity).
  [[nodiscard]] std::int64_t pending_index_changes() const noexcept {
    return static_cast<std::int64_t>(touched_.size());
  }
  /// Writes the dense index's changes since the last call, one record per position still below
  /// live with its final slot, to `out` (room for pending_index_changes()); returns how many.
  std::int64_t take_index_changes(index_record* out) noexcept {
    std::int64_t n = 0;
    for (const std::int64_t pos : touched_)
      if (pos < live_) out[n++] = {pos, dense_[at(pos)]};
    touched_.clear();
    ++epoch_;
    return n;
  }

  /// True when `ticket` is the committed occupant of its slot.
  [[nodiscard]] bool holds(std::uint64_t ticket) const noexcept {
    const std::int64_t slot = slot_of(ticket);
    return ticket < next_ticket_ && tickets_[at(slot)] == ticket &&
           states_[at(slot)] == slot_state::committed;
  }
  /// True when `ticket` is reserved and not yet committed or abandoned.
  [[nodiscard]] bool is_pending(std::uint64_t ticket) const noexcept {
    const std::int64_t slot = slot_of(ticket);
    return ticket < next_ticket_ && tickets_[at(slot)] == ticket &&
           states_[at(slot)] == slot_state::pending;
  }

  /// Committed trajectories the next reservation of `count` slots evicts.
  [[nodiscard]] std::int64_t evictions(std::int64_t count) const noexcept {
    return next_slots_in(count, slot_state::committed);
  }

  // ---- checks (throw, change nothing) --------------------------------------------------------

  /// Throws errc::invalid_reservation unless every slot of r is still pending for r in this ring.
  void check_reservation(const reservation& r) const {
    GEAR_REQUIRE(r.buffer == buffer_id_ && r.capacity == capacity_, errc::invalid_reservation,
                 "the reservation was made by another buffer");
    GEAR_REQUIRE(r.count >= 1 && r.count <= capacity_, errc::invalid_reservation,
                 "the reservation holds " + std::to_string(r.count) + " slots");
    for (std::int64_t i = 0; i < r.count; ++i) {
      const std::uint64_t ticket = r.first_ticket + static_cast<std::uint64_t>(i);
      GEAR_REQUIRE(is_pending(ticket), errc::invalid_reservation,
                   "slot " + std::to_string(slot_of(ticket)) + " (ticket " +
                       std::to_string(ticket) +
                       ") was taken over by newer reservations, abandoned or already committed");
    }
  }

  // ---- transitions (noexcept; records go to `out`, which has room for them) -------------------

  /// Reserves the next `count` slots (1 <= count <= capacity): evicts their committed occupants,
  /// marks them pending. Writes `count` pending records.
  reservation reserve(std::int64_t count, slot_record* out) noexcept {
    const reservation r{next_ticket_, count, capacity_, buffer_id_};
    for (std::int64_t i = 0; i < count; ++i) {
      const std::uint64_t ticket = r.first_ticket + static_cast<std::uint64_t>(i);
      const std::size_t s = at(slot_of(ticket));
      if (states_[s] == slot_state::committed) {
        unlist(slot_of(ticket));
        ++evicted_total_;
      } else if (states_[s] == slot_state::pending) {
        --pending_;  // an open reservation taken over
      }
      lengths_[s] = 0;
      tickets_[s] = ticket;
      states_[s] = slot_state::pending;
      if (out != nullptr) out[i] = slot_record::make(ticket, slot_record::pending);
    }
    next_ticket_ += static_cast<std::uint64_t>(count);
    pending_ += count;
    return r;
  }

  /// Commits the checked reservation r with `lengths` (each in [1, max_length]). Writes r.count
  /// committed records.
  void commit(const reservation& r, std::span<const std::int64_t> lengths,
              slot_record* out) noexcept {
    for (std::int64_t i = 0; i < r.count; ++i) {
      const std::uint64_t ticket = r.first_ticket + static_cast<std::uint64_t>(i);
      const std::size_t s = at(slot_of(ticket));
      const std::int64_t length = lengths[static_cast<std::size_t>(i)];
      lengths_[s] = length;
      states_[s] = slot_state::committed;
      list(slot_of(ticket));
      if (out != nullptr) out[i] = slot_record::make(ticket, slot_record::committed, length);
    }
    pending_ -= r.count;
    committed_total_ += static_cast<std::uint64_t>(r.count);
  }

  /// Empties the slot of a pending `ticket` (an abandoned writer). Returns false, writing
  /// nothing, if the ticket is no longer pending.
  bool abandon(std::uint64_t ticket, slot_record* out) noexcept {
    if (!is_pending(ticket)) return false;
    states_[at(slot_of(ticket))] = slot_state::empty;
    --pending_;
    if (out != nullptr) *out = slot_record::make(ticket, slot_record::removed);
    return true;
  }

  /// Removes committed trajectories given as runs of consecutive tickets (distinct, each held).
  /// Writes one record per ticket, run after run. A run clears its slots as ranges (up to the
  /// ring's end, then from its start).
  void remove(std::span<const ticket_run> runs, slot_record* out) noexcept {
    for (const ticket_run& r : runs) {
      remove_run(r.first, r.count, out);
      if (out != nullptr) out += r.count;
    }
  }
  /// The same for distinct tickets, each held, in any order (a run is found where they ascend
  /// one by one). Writes one record per ticket, in their order.
  void remove(std::span<const std::uint64_t> tickets, slot_record* out) noexcept {
    for_each_ticket_run(tickets, [&](std::uint64_t first, std::int64_t count) {
      remove_run(first, count, out);
      if (out != nullptr) out += count;
    });
  }

 private:
  /// Removes the committed trajectories of tickets [first, first + count), writing their records
  /// to out[0, count) (unless null).
  void remove_run(std::uint64_t first, std::int64_t count, slot_record* out) noexcept {
    removed_total_ += static_cast<std::uint64_t>(count);
    for (std::int64_t done = 0; done < count;) {
      const std::int64_t slot = slot_of(first + static_cast<std::uint64_t>(done));
      const std::int64_t run = std::min(count - done, capacity_ - slot);  // to the ring's end
      std::fill_n(states_.begin() + slot, run, slot_state::empty);
      std::fill_n(lengths_.begin() + slot, run, 0);
      if (indexed())
        for (std::int64_t k = 0; k < run; ++k) unlist(slot + k);
      else
        live_ -= run;
      if (out != nullptr)
        for (std::int64_t k = done; k < done + run; ++k)
          out[k] = slot_record::make(first + static_cast<std::uint64_t>(k), slot_record::removed);
      done += run;
    }
  }

  /// Slots of the next reservation of `count` that are now in `state`.
  [[nodiscard]] std::int64_t next_slots_in(std::int64_t count, slot_state state) const noexcept {
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < count; ++i)
      n += states_[at(slot_of(next_ticket_ + static_cast<std::uint64_t>(i)))] == state;
    return n;
  }
  static std::size_t at(std::int64_t slot) noexcept { return static_cast<std::size_t>(slot); }

  // The dense index: a committed slot joins at position live_; a leaving one's position takes
  // the last. Positions written are collected once per take_index_changes (touched_ has room for
  // every position, so push_back never allocates).
  void touch(std::int64_t pos) noexcept {
    if (touched_at_[at(pos)] == epoch_) return;
    touched_at_[at(pos)] = epoch_;
    touched_.push_back(pos);
  }
  void list(std::int64_t slot) noexcept {
    if (!indexed()) {
      ++live_;
      return;
    }
    dense_[at(live_)] = slot;
    where_[at(slot)] = live_;
    touch(live_);
    ++live_;
  }
  void unlist(std::int64_t slot) noexcept {
    if (!indexed()) {
      --live_;
      return;
    }
    const std::int64_t pos = where_[at(slot)];
    const std::int64_t last = dense_[at(live_ - 1)];
    dense_[at(pos)] = last;
    where_[at(last)] = pos;
    touch(pos);
    --live_;
  }

  std::int64_t capacity_;
  modulus slot_of_;  // ticket -> slot without a division
  std::uint64_t buffer_id_;
  std::vector<std::int64_t> lengths_;
  std::vector<std::uint64_t> tickets_;
  std::vector<slot_state> states_;
  // The dense index, [capacity] each if the ring keeps it (empty otherwise).
  std::vector<std::int64_t> dense_;        // [0, live_): the committed slots
  std::vector<std::int64_t> where_;        // a committed slot's position
  std::vector<std::uint64_t> touched_at_;  // the epoch a position was written in
  std::vector<std::int64_t> touched_;      // positions written this epoch
  std::uint64_t epoch_ = 1;
  std::uint64_t next_ticket_ = 0;
  std::int64_t live_ = 0;
  std::int64_t pending_ = 0;
  std::uint64_t committed_total_ = 0, evicted_total_ = 0, removed_total_ = 0;
};

}  // namespace gear::detail
