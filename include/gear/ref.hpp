#pragma once
// gear::buffer_ref: a trivially copyable view of a buffer for use inside user kernels (a GPU
// simulator writing steps of reserved slots, a custom sampler reading metadata). It carries only
// the operations asked for in replay_buffer::ref(ops...):
//
//   gear::op::write_steps    step<I>(slot, t): pointer to step t of column I of a slot
//   gear::op::read_metadata  length(slot), ticket(slot)
//
// Addresses are those of the side that selects: device addresses for pinned_host, device and
// mixed storage, host addresses for host storage. The view does not own anything and is valid
// while its buffer lives.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <gear/config.hpp>
#include <gear/layout.hpp>
#include <tuple>
#include <type_traits>

namespace gear {

/// Operations a buffer_ref can carry.
namespace op {
struct write_steps {};
struct read_metadata {};
}  // namespace op

/// A range of slots reserved for writing, committed later with replay_buffer::commit.
/// Slot i of the reservation is (first_ticket + i) % capacity.
///
/// Writes through a ref are the producer's own: the buffer cannot see them. Once the ring wraps
/// onto a slot of this reservation (its first slot after capacity - count + 1 newer reserved
/// slots: each trajectory of an insert, each slot of a reserve, each writer takes one; from any
/// thread), the slot is taken over: its new occupant is written and may be committed and
/// sampled, and commit refuses this whole reservation (errc::invalid_reservation). So finish
/// writing before that can happen. GPU storage waits, at the takeover, for the device (a kernel
/// enqueued before it may still write); a kernel enqueued after it, or a host thread still
/// writing into storage::host, writes into the new occupant. A gear::writer has no such window:
/// it checks its slot under the buffer's mutex at every append.
struct reservation {
  std::uint64_t first_ticket = 0;
  std::int64_t count = 0;
  std::int64_t capacity = 1;
  std::uint64_t buffer = 0;  ///< the buffer that made it (commit refuses another's)

  GEAR_HD constexpr std::int64_t slot(std::int64_t i) const noexcept {
    return static_cast<std::int64_t>((first_ticket + static_cast<std::uint64_t>(i)) %
                                     static_cast<std::uint64_t>(capacity));
  }
};

/// The element types of a spec's columns, in order. buffer_ref is templated on this rather than on
/// the spec, so that kernels templated on a ref carry no column names (nvcc cannot name kernel
/// templates whose arguments hold class-type template arguments such as strings).
template <class... T>
struct element_types {
  static constexpr std::size_t size = sizeof...(T);
  template <std::size_t I>
  using at = std::tuple_element_t<I, std::tuple<T...>>;
};

template <class Elements, class... Ops>
class buffer_ref {
  static constexpr bool can_write = (std::same_as<Ops, op::write_steps> || ...);
  static constexpr bool can_read = (std::same_as<Ops, op::read_metadata> || ...);

 public:
  static constexpr std::size_t num_columns = Elements::size;

  buffer_ref(const std::array<detail::column_geometry, num_columns>& columns,
             const std::int64_t* lengths, const std::uint64_t* tickets, std::int64_t capacity,
             std::int64_t max_length)
      : lengths_(lengths), tickets_(tickets), capacity_(capacity), max_length_(max_length) {
    for (std::size_t c = 0; c < num_columns; ++c) columns_[c] = columns[c];
  }

  GEAR_HD std::int64_t capacity() const noexcept { return capacity_; }
  GEAR_HD std::int64_t max_length() const noexcept { return max_length_; }

  /// Step t of column I of `slot`; write into it (requires op::write_steps). Write only slots of
  /// a reservation that is not yet committed.
  template <std::size_t I>
  requires can_write GEAR_HD typename Elements::template at<I>* step(
      std::int64_t slot, std::int64_t t) const noexcept {
    return reinterpret_cast<typename Elements::template at<I>*>(columns_[I].at(slot, t));
  }

  /// Committed length of `slot`, 0 if empty or pending, as the stream's earlier work left it
  /// (requires op::read_metadata).
  GEAR_HD std::int64_t length(std::int64_t slot) const noexcept requires can_read {
    return lengths_[slot];
  }
  /// Ticket of the latest reservation of `slot`, as the stream's earlier work left it; a key names
  /// the slot's trajectory when its ticket is this one and length(slot) > 0
  /// (requires op::read_metadata).
  GEAR_HD std::uint64_t ticket(std::int64_t slot) const noexcept requires can_read {
    return tickets_[slot];
  }

 private:
  detail::column_geometry columns_[num_columns];
  const std::int64_t* lengths_;
  const std::uint64_t* tickets_;
  std::int64_t capacity_;
  std::int64_t max_length_;
};

}  // namespace gear
