#pragma once
// Slot metadata as selection and gathers read it, and the records that change it.
//
// Every change of a slot is a slot_record: (ticket, rank, length), rank pending < committed <
// removed. Host-storage buffers keep the slot ring's own arrays; GPU buffers keep a mirror in
// device memory that only records change, applied in stream order by kernels (the journal, the
// threads of an insert's scatter, and the last block of a gather that removes what it returns). A
// record lands only if (ticket, rank) exceeds what the slot holds, so records applied late or
// twice, or from streams that race, can never bring back an older state:
//
//   order[slot] = (ticket + 1) << 2 | rank        0: never reserved (tickets below 2^62: a
//                                                 century at 10^9 reservations a second)
//   tickets[slot], lengths[slot]                  written by the record that raised order[slot]
//
// lengths[slot] > 0 exactly when the slot holds a committed trajectory.

#include <cstddef>
#include <cstdint>
#include <gear/config.hpp>

namespace gear::detail {

/// One change of one slot's metadata.
struct slot_record {
  enum rank_type : std::uint64_t { pending = 0, committed = 1, removed = 2 };

  std::uint64_t order = 0;  ///< (ticket + 1) << 2 | rank
  std::int64_t length = 0;  ///< committed length (committed records only)

  [[nodiscard]] static constexpr slot_record make(std::uint64_t ticket, rank_type rank,
                                                  std::int64_t length = 0) noexcept {
    return {(ticket + 1) << 2 | rank, rank == committed ? length : 0};
  }
  [[nodiscard]] GEAR_HD constexpr std::uint64_t ticket() const noexcept { return (order >> 2) - 1; }
  [[nodiscard]] GEAR_HD constexpr std::uint64_t rank() const noexcept { return order & 3; }
};

/// One write of the dense index of committed slots (slot_ring.hpp): dense[position] = slot. The
/// records of one apply name distinct positions, so applying them in parallel is exact.
struct index_record {
  std::int64_t position = 0;
  std::int64_t slot = 0;
};
static_assert(sizeof(index_record) == sizeof(slot_record));

/// Per-slot metadata arrays from one base address: lengths (int64), tickets (uint64), order
/// (uint64), and the dense index of committed slots (int64; [0, live) in use), each [capacity];
/// then the live count (one int64, written by each journal apply: what samples drawn with a
/// gear::device_rng read, so that a replayed graph sees the count of its time).
struct slot_mirror {
  std::int64_t* lengths = nullptr;
  std::uint64_t* tickets = nullptr;
  std::uint64_t* order = nullptr;
  std::int64_t* dense = nullptr;
  std::int64_t* live = nullptr;

  static constexpr std::size_t bytes(std::int64_t capacity) noexcept {
    return static_cast<std::size_t>(capacity) * 32 + sizeof(std::int64_t);
  }
  static slot_mirror at(std::byte* base, std::int64_t capacity) noexcept {
    slot_mirror m;
    m.lengths = reinterpret_cast<std::int64_t*>(base);
    m.tickets = reinterpret_cast<std::uint64_t*>(m.lengths + capacity);
    m.order = m.tickets + capacity;
    m.dense = reinterpret_cast<std::int64_t*>(m.order + capacity);
    m.live = m.dense + capacity;
    return m;
  }
};

/// One call's records (mapped pinned memory, read zero-copy) and the mirror they change: slot
/// records, and the dense index's changes.
struct journal_args {
  const slot_record* records = nullptr;
  std::int64_t count = 0;
  const index_record* index = nullptr;
  std::int64_t index_count = 0;
  slot_mirror mirror{};
  std::int64_t capacity = 1;
  std::int64_t live = 0;  ///< the live count once these records are applied (mirror.live)
};

/// Applies one record to a mirror of `capacity` slots (the journal kernel, an insert's scatter and
/// a gather's last block call it on the device; tests on the host). On the device a record that
/// raises order[slot] writes the slot's ticket and length, then looks again: if a newer record
/// raised the order meanwhile (a race between streams), it clears the length it may have written
/// after that record's.
GEAR_HD inline void apply_slot_record(const slot_mirror& m, std::int64_t capacity,
                                      const slot_record& r) noexcept {
  const std::uint64_t ticket = r.ticket();
  const auto slot = static_cast<std::int64_t>(ticket % static_cast<std::uint64_t>(capacity));
#if defined(__CUDA_ARCH__)
  auto* order = reinterpret_cast<unsigned long long*>(m.order + slot);
  const unsigned long long before = atomicMax(order, static_cast<unsigned long long>(r.order));
  if (before >= r.order) return;
  m.tickets[slot] = ticket;
  m.lengths[slot] = r.length;
  __threadfence();
  if (r.length != 0 && *static_cast<volatile unsigned long long*>(order) != r.order)
    m.lengths[slot] = 0;
#else
  if (m.order[slot] >= r.order) return;
  m.order[slot] = r.order;
  m.tickets[slot] = ticket;
  m.lengths[slot] = r.length;
#endif
}

}  // namespace gear::detail
