#pragma once
// Queue and stack selection: select::fifo returns the oldest committed trajectories in insertion
// order, select::lifo the newest, newest first. Both consume: the buffer removes every trajectory
// a sample returns, so each is returned exactly once, as from a queue or a stack. Rows are
// deterministic (probability 1, weight 1); a batch needs at least as many committed trajectories
// as rows (errc::not_enough_items otherwise).
//
// The order is computed on the host from its copy of the metadata; the device state copies the B
// slots to the GPU with one stream-ordered copy. fifo keeps a cursor on the oldest ticket that may
// still be returned, moved past evicted and removed tickets once, so draining a queue of N costs
// O(N) in all (pending slots, e.g. open writers, hold the cursor: they may still commit). lifo
// scans down from the newest ticket, O(B + removed tickets above the newest live one).

#include <algorithm>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>
#include <gear/error.hpp>
#include <gear/select/concept.hpp>
#include <string>

namespace gear::detail {

/// Writes the slots of the `batch` oldest (oldest_first) or newest committed trajectories of the
/// table, in that order, to slots (host memory). Requires batch <= t.live. `cursor` (fifo): no
/// ticket below it can be returned any more; advanced here.
inline void queue_rows(const slot_table& t, bool oldest_first, std::int64_t batch,
                       std::int64_t* slots, std::uint64_t& cursor) {
  const auto cap = static_cast<std::uint64_t>(t.capacity);
  const std::uint64_t begin =
      std::max(cursor, t.next_ticket - static_cast<std::uint64_t>(t.occupied));
  std::int64_t n = 0;
  if (oldest_first) {
    // Tickets whose slot was reserved again, or that were removed, are gone for good.
    cursor = begin;
    while (cursor < t.next_ticket) {
      const auto slot = static_cast<std::size_t>(cursor % cap);
      if (t.host_tickets[slot] == cursor && t.host_states[slot] != 0) break;
      ++cursor;
    }
    for (std::uint64_t ticket = cursor; n < batch && ticket < t.next_ticket; ++ticket) {
      const auto slot = static_cast<std::int64_t>(ticket % cap);
      if (t.host_lengths[slot] > 0) slots[n++] = slot;
    }
  } else {
    for (std::uint64_t ticket = t.next_ticket; n < batch && ticket > begin;) {
      const auto slot = static_cast<std::int64_t>(--ticket % cap);
      if (t.host_lengths[slot] > 0) slots[n++] = slot;
    }
  }
}

inline void validate_queue(const slot_table& t, std::int64_t batch) {
  GEAR_REQUIRE(batch <= t.live, errc::not_enough_items,
               "a queue or stack returns each trajectory once: " + std::to_string(batch) +
                   " rows asked, " + std::to_string(t.live) + " trajectories stored");
}

/// The host and device states of fifo and lifo (OldestFirst: fifo).
template <bool OldestFirst, class Space>
class queue_state;

template <bool OldestFirst>
class queue_state<OldestFirst, exec::host> {
 public:
  void validate(const slot_table& t, std::int64_t batch) const { validate_queue(t, batch); }
  void select(const slot_table& t, const selection_request& r, cuda::stream_ref) {
    queue_rows(t, OldestFirst, r.batch, r.slots, cursor_);
    std::fill_n(r.probabilities, r.batch, 1.0f);
    std::fill_n(r.weights, r.batch, 1.0f);
  }

 private:
  std::uint64_t cursor_ = 0;
};

template <bool OldestFirst>
class queue_state<OldestFirst, exec::device> {
 public:
  void validate(const slot_table& t, std::int64_t batch) const { validate_queue(t, batch); }

  /// Computes the rows on the host, then one stream-ordered copy each of slots, probabilities and
  /// weights from pinned staging; waits for the previous sample's copies before reusing it.
  void select(const slot_table& t, const selection_request& r, cuda::stream_ref stream) {
    const auto rows = static_cast<std::size_t>(r.batch);
    const std::size_t bytes = rows * (sizeof(std::int64_t) + 2 * sizeof(float));
    if (ready_.get() != nullptr)
      GEAR_CUDA_TRY(cudaEventSynchronize(ready_.get()));
    else
      ready_ = event::make();
    if (staging_.size() < bytes) staging_ = allocation(memory_kind::pinned_host, bytes);
    auto* slots = staging_.as<std::int64_t>();
    auto* ones = reinterpret_cast<float*>(slots + rows);
    queue_rows(t, OldestFirst, r.batch, slots, cursor_);
    std::fill_n(ones, 2 * rows, 1.0f);
    GEAR_CUDA_TRY(cudaMemcpyAsync(r.slots, slots, rows * sizeof(std::int64_t),
                                  cudaMemcpyHostToDevice, stream.get()));
    GEAR_CUDA_TRY(cudaMemcpyAsync(r.probabilities, ones, rows * sizeof(float),
                                  cudaMemcpyHostToDevice, stream.get()));
    GEAR_CUDA_TRY(cudaMemcpyAsync(r.weights, ones + rows, rows * sizeof(float),
                                  cudaMemcpyHostToDevice, stream.get()));
    GEAR_CUDA_TRY(cudaEventRecord(ready_.get(), stream.get()));
  }

 private:
  allocation staging_;
  event ready_;
  std::uint64_t cursor_ = 0;
};

}  // namespace gear::detail

namespace gear::select {

/// The oldest committed trajectories first, each returned once (a queue).
struct fifo {
  static constexpr bool consumes = true;
  template <class Space>
  struct state : detail::queue_state<true, Space> {
    state(const fifo&, std::int64_t /*capacity*/) {}
  };
};

/// The newest committed trajectories first, each returned once (a stack).
struct lifo {
  static constexpr bool consumes = true;
  template <class Space>
  struct state : detail::queue_state<false, Space> {
    state(const lifo&, std::int64_t /*capacity*/) {}
  };
};

}  // namespace gear::select
