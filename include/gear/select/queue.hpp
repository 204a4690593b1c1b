#pragma once
// Queue and stack selection: select::fifo returns the oldest committed trajectories in insertion
// order, select::lifo the newest, newest first. Both consume: the buffer removes every trajectory
// a sample returns, so each is returned exactly once, as from a queue or a stack. Rows are
// deterministic (probability 1, weight 1); a batch needs at least as many committed trajectories
// as rows (errc::not_enough_items otherwise).
//
// The order is computed on the host from its copy of the metadata; the device state
// (detail/select_queue.cuh) hands the B slots to the GPU through mapped pinned memory. fifo keeps a
// cursor on the oldest ticket that may still be returned, moved past evicted and removed tickets
// once, so draining a queue of N costs O(N) in all (pending slots, e.g. open writers, hold the
// cursor: they may still commit). lifo scans down from the newest ticket and crosses runs of
// removed tickets by skip links it compresses as it goes, so draining a stack of N costs O(N) in
// all too.

#include <algorithm>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/modulus.hpp>
#include <gear/error.hpp>
#include <gear/select/concept.hpp>
#include <span>
#include <string>
#include <vector>

namespace gear::detail {

/// lifo's skip links over removed tickets: for a slot whose ticket `ticket` was removed (or its
/// writer abandoned), `resume` is the ticket bound to go on scanning down from (exclusive) past
/// it and the removed tickets just below it. Set by each scan with path compression, so
/// draining a stack of N costs O(N) in all, amortised; a removed ticket never comes back, so a
/// link stays true.
struct lifo_link {
  std::uint64_t ticket = ~std::uint64_t{0};
  std::uint64_t resume = 0;
};

/// Writes the slots of the `batch` oldest (oldest_first) or newest committed trajectories of the
/// table, in that order, to slots (host memory; -1 past the last one found). Requires batch <=
/// t.live. `cursor` (fifo): no ticket below it can be returned any more; advanced here. `links`
/// (lifo, [capacity]): see lifo_link. `runs` (unless null; room for `batch` runs): the rows'
/// tickets as runs of consecutive ones, in the rows' order (fifo's ascend, lifo's descend).
inline void queue_rows(const slot_table& t, const modulus& slot_of, bool oldest_first,
                       std::int64_t batch, std::int64_t* slots, std::uint64_t& cursor,
                       lifo_link* links = nullptr, std::vector<ticket_run>* runs = nullptr) {
  const auto cap = static_cast<std::size_t>(t.capacity);
  const std::uint64_t begin =
      std::max(cursor, t.next_ticket - static_cast<std::uint64_t>(t.occupied));
  std::int64_t n = 0;
  if (runs != nullptr) runs->clear();
  // Rows n.. take a stretch of k committed slots from `slot` on, up (a queue) or down (a stack),
  // of consecutive tickets from `ticket` on. Their tickets join the open run if they follow on
  // (the run is kept in locals, which stores to slots cannot alias), else close it and open one.
  std::uint64_t run_first = 0;
  std::int64_t run_count = 0;
  const auto close = [&] {
    if (runs != nullptr && run_count > 0) runs->push_back({run_first, run_count});
  };
  const auto take = [&](std::size_t slot, std::uint64_t ticket, std::size_t k) {
    if (k == 0) return;
    const auto first = static_cast<std::int64_t>(slot);
    const auto count = static_cast<std::int64_t>(k);
    if (oldest_first)
      for (std::int64_t i = 0; i < count; ++i) slots[n + i] = first + i;
    else
      for (std::int64_t i = 0; i < count; ++i) slots[n + i] = first - i;
    n += count;
    const std::uint64_t low = oldest_first ? ticket : ticket - (k - 1);
    const bool follows =
        run_count > 0 && (oldest_first ? ticket == run_first + static_cast<std::uint64_t>(run_count)
                                       : ticket + 1 == run_first);
    if (!follows) {
      close();
      run_first = low;
      run_count = count;
    } else {
      run_first = std::min(run_first, low);  // a stack's run grows down
      run_count += count;
    }
  };
  // How many slots from `slot` on, up or down, hold committed trajectories, up to `most`.
  const auto committed_stretch = [&](std::size_t slot, std::size_t most) {
    std::size_t k = 0;
    if (oldest_first)
      while (k < most && t.host_lengths[slot + k] > 0) ++k;
    else
      while (k < most && t.host_lengths[slot - k] > 0) ++k;
    return k;
  };
  if (oldest_first) {
    // Tickets whose slot was reserved again, or that were removed, are gone for good.
    // The slot walks with the ticket (one division, not one per ticket: see modulus.hpp).
    cursor = begin;
    auto slot = static_cast<std::size_t>(slot_of(cursor));
    const auto next_slot = [&] {
      if (++slot == cap) slot = 0;
    };
    while (cursor < t.next_ticket) {
      if (t.host_tickets[slot] == cursor && t.host_states[slot] != 0) break;
      ++cursor;
      next_slot();
    }
    // From the cursor up, each stretch of committed slots (to the ring's end) is taken whole;
    // a slot that holds nothing committed (pending, removed) is stepped over.
    for (std::uint64_t ticket = cursor; n < batch && ticket < t.next_ticket;) {
      const std::size_t most = std::min({static_cast<std::size_t>(batch - n),
                                         static_cast<std::size_t>(t.next_ticket - ticket),
                                         cap - slot});
      const std::size_t k = committed_stretch(slot, most);
      take(slot, ticket, k);
      const std::size_t step = k < most ? k + 1 : k;
      ticket += step;
      slot += step;
      if (slot == cap) slot = 0;
    }
  } else {
    // Scan down from the newest ticket. A run of removed tickets is crossed by its links; once
    // the scan stops below a run (a live or pending ticket, or the oldest slot), every ticket of
    // the run links there.
    // Both walks below mostly step down one ticket at a time: the slot steps with it, and a
    // remainder is taken only after a jump (as fifo's walk, one division per jump).
    struct slot_walk {
      const modulus& slot_of;
      std::size_t cap;
      std::uint64_t ticket = 0;  // the last ticket asked for (none yet: slot_of below)
      std::size_t slot = cap;
      std::size_t operator()(std::uint64_t k) {
        if (slot != cap && k + 1 == ticket)
          slot = slot == 0 ? cap - 1 : slot - 1;
        else if (slot == cap || k != ticket)
          slot = static_cast<std::size_t>(slot_of(k));
        ticket = k;
        return slot;
      }
    };
    slot_walk scan_slot{slot_of, cap}, run_slot{slot_of, cap};
    std::uint64_t top = t.next_ticket;  // the next ticket looked at is top - 1
    std::uint64_t run_top = top;        // the run of removed tickets crossed since run_top
    auto close_run = [&](std::uint64_t resume) {
      if (links == nullptr) return;
      for (std::uint64_t r = run_top; r > resume;) {
        --r;
        const auto slot = run_slot(r);
        lifo_link& l = links[slot];
        if (l.ticket == r) {  // linked before: follow it (its targets are at most r)
          const std::uint64_t next = l.resume;
          l.resume = resume;
          r = std::max(next, resume);
        } else if (t.host_tickets[slot] == r && t.host_states[slot] == 0) {
          l = {r, resume};
        }
      }
    };
    while (n < batch && top > begin) {
      const std::uint64_t ticket = top - 1;
      const auto slot = scan_slot(ticket);
      const bool removed = t.host_tickets[slot] == ticket && t.host_states[slot] == 0;
      if (removed) {
        const lifo_link* l = links != nullptr ? &links[slot] : nullptr;
        top = l != nullptr && l->ticket == ticket ? std::max(l->resume, begin) : ticket;
        continue;
      }
      close_run(top);
      // A stretch of committed slots down from here (to the ring's start) is taken whole; a
      // pending slot is stepped over.
      const std::size_t most = std::min(
          {static_cast<std::size_t>(batch - n), static_cast<std::size_t>(top - begin), slot + 1});
      const std::size_t k = committed_stretch(slot, most);
      take(slot, ticket, k);
      const std::size_t step = std::max<std::size_t>(k, 1);
      top -= step;
      run_top = top;
      scan_slot.ticket = top;  // the walk stands at the stretch's last ticket
      scan_slot.slot = slot - (step - 1);
    }
    close_run(top);
  }
  close();
  std::fill(slots + n, slots + batch, std::int64_t{-1});
}

inline void validate_queue(const slot_table& t, std::int64_t batch) {
  GEAR_REQUIRE(batch <= t.live, errc::not_enough_items,
               "a queue or stack returns each trajectory once: " + std::to_string(batch) +
                   " rows asked, " + std::to_string(t.live) + " trajectories stored");
}

/// What the host and device states of fifo and lifo share (OldestFirst: fifo): fifo's cursor,
/// lifo's skip links, and the rows they give.
template <bool OldestFirst>
class queue_order {
 public:
  explicit queue_order(std::int64_t capacity)
      : slot_of_(static_cast<std::uint64_t>(capacity)),
        links_(OldestFirst ? 0 : static_cast<std::size_t>(capacity)) {}
  void validate(const slot_table& t, std::int64_t batch) const { validate_queue(t, batch); }

  /// Host memory for the runs of batches of up to `batch` rows, allocated now
  /// (reserve_staging). Throws std::bad_alloc with the order as it was.
  void reserve_plan(std::int64_t batch) { runs_.reserve(static_cast<std::size_t>(batch)); }

  /// The rows of the last choose() were all removed (gear::consumed_hook): fifo's cursor moves
  /// past those at its head, lifo links over each run of consecutive tickets among them, so the
  /// next selection does not step over them one ticket at a time.
  void on_consumed() noexcept {
    if (!armed_) return;
    armed_ = false;
    if constexpr (OldestFirst) {
      // Through the first run, if it starts at the cursor (choose() started there).
      if (!runs_.empty() && runs_.front().first == cursor_)
        cursor_ += static_cast<std::uint64_t>(runs_.front().count);
    } else {
      for (const ticket_run& run : runs_) {
        const std::uint64_t top = run.first + static_cast<std::uint64_t>(run.count) - 1;
        links_[static_cast<std::size_t>(slot_of_(top))] = {top, run.first};
      }
    }
  }

  /// The tickets of the last choose()'s rows as runs of consecutive ones (gear::host_chosen_runs),
  /// until the next one: the removal of a sample that returns them is planned run by run. Empty
  /// once they were consumed, or if no choose() came since (a derived state's own select).
  [[nodiscard]] std::span<const ticket_run> chosen_runs() const noexcept {
    return armed_ ? std::span<const ticket_run>(runs_) : std::span<const ticket_run>();
  }

 protected:
  /// Writes the slots of the next `batch` rows to `slots` (host memory) and prepares
  /// on_consumed. Throws std::bad_alloc with the order as it was.
  void choose(const slot_table& t, std::int64_t batch, std::int64_t* slots) {
    armed_ = false;
    reserve_plan(batch);
    queue_rows(t, slot_of_, OldestFirst, batch, slots, cursor_, links_.data(), &runs_);
    armed_ = true;
  }

 private:
  modulus slot_of_;
  std::uint64_t cursor_ = 0;
  std::vector<lifo_link> links_;
  // The last choose()'s rows as runs of tickets (its plan for on_consumed, and chosen_runs()).
  bool armed_ = false;
  std::vector<ticket_run> runs_;
};

/// The host and device states of fifo and lifo (the device one is in detail/select_queue.cuh).
template <bool OldestFirst, class Space>
class queue_state;

template <bool OldestFirst>
class queue_state<OldestFirst, exec::host> : public queue_order<OldestFirst> {
 public:
  using queue_order<OldestFirst>::queue_order;
  void select(const slot_table& t, const selection_request& r, cuda::stream_ref) {
    this->choose(t, r.batch, r.slots);
    std::fill_n(r.probabilities, r.batch, 1.0f);
    std::fill_n(r.weights, r.batch, 1.0f);
  }
};

}  // namespace gear::detail

namespace gear::select {

/// The oldest committed trajectories first, each returned once (a queue).
struct fifo {
  static constexpr bool consumes = true;
  static constexpr bool reads_dense = false;  // the order is the tickets'
  template <class Space>
  struct state : detail::queue_state<true, Space> {
    state(const fifo&, std::int64_t capacity) : detail::queue_state<true, Space>(capacity) {}
  };
};

/// The newest committed trajectories first, each returned once (a stack).
struct lifo {
  static constexpr bool consumes = true;
  static constexpr bool reads_dense = false;  // the order is the tickets'
  template <class Space>
  struct state : detail::queue_state<false, Space> {
    state(const lifo&, std::int64_t capacity) : detail::queue_state<false, Space>(capacity) {}
  };
};

}  // namespace gear::select
