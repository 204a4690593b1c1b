#pragma once
// Writing a batch of packed trajectories into their slots: the description shared by the host
// loop and the device kernel (scatter.cuh).

#include <cstddef>
#include <cstdint>
#include <gear/spec.hpp>

namespace gear::detail {

/// One trajectory of an insert: its slot, where its steps start in the packed input, its length,
/// and the slot's generation and ticket once committed.
struct scatter_row {
  std::int64_t slot = 0;
  std::int64_t src_step = 0;
  std::int64_t length = 0;
  std::uint64_t ticket = 0;
  std::uint32_t generation = 0;
};

/// A buffer's per-slot metadata arrays, laid out from one base address: lengths (int64),
/// generations (uint32, padded to a multiple of 8 bytes), tickets (uint64), each [capacity]. The
/// host copy and the device mirror share this layout.
struct slot_metadata {
  std::int64_t* lengths = nullptr;
  std::uint32_t* generations = nullptr;
  std::uint64_t* tickets = nullptr;

  static constexpr std::int64_t generations_padded(std::int64_t capacity) {
    return (capacity + 1) / 2 * 2;
  }
  /// Bytes of the three arrays.
  static constexpr std::size_t bytes(std::int64_t capacity) {
    return static_cast<std::size_t>(capacity * 8 + generations_padded(capacity) * 4 +
                                    capacity * 8);
  }
  static slot_metadata at(std::byte* base, std::int64_t capacity) noexcept {
    slot_metadata m;
    m.lengths = reinterpret_cast<std::int64_t*>(base);
    m.generations = reinterpret_cast<std::uint32_t*>(m.lengths + capacity);
    m.tickets = reinterpret_cast<std::uint64_t*>(m.generations + generations_padded(capacity));
    return m;
  }
};

/// Source (packed, trajectories back to back) and destination (slot segments) of one column.
struct scatter_column {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;  ///< column segment of slot 0
  std::int64_t slot_stride = 0;
  std::int64_t step_bytes = 0;
};

struct scatter_args {
  scatter_column columns[max_columns];
  int num_columns = 0;
  std::int64_t count = 0;             ///< trajectories
  std::int64_t max_count_length = 0;  ///< longest trajectory of this insert
  const scatter_row* rows = nullptr;  ///< [count], readable where the scatter runs
  /// Device mirror to commit each row's metadata to (length, generation, ticket); none if null.
  slot_metadata commit{};
};

}  // namespace gear::detail
