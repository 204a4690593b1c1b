#pragma once
// Writing a batch of packed trajectories into their slots: the description shared by the host
// loop and the device kernel (scatter.cuh).

#include <cstddef>
#include <cstdint>
#include <gear/detail/buffer/mirror.hpp>
#include <gear/spec.hpp>

namespace gear::detail {

/// One trajectory of an insert: its slot, where its steps start in the packed input, its length
/// and its ticket.
struct scatter_row {
  std::int64_t slot = 0;
  std::int64_t src_step = 0;
  std::int64_t length = 0;
  std::uint64_t ticket = 0;
};

/// What a scatter reads from device memory: a counter of finished blocks (zero when copied in),
/// then one row per trajectory.
struct scatter_table {
  unsigned long long blocks_done = 0;
  std::uint64_t padding = 0;

  static std::size_t bytes(std::int64_t count) noexcept {
    return sizeof(scatter_table) + static_cast<std::size_t>(count) * sizeof(scatter_row);
  }
  GEAR_HD scatter_row* rows() noexcept { return reinterpret_cast<scatter_row*>(this + 1); }
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
  scatter_table* table = nullptr;     ///< in device memory
  /// Device mirror the last block to finish commits every row to (a committed record each);
  /// nothing is committed if its arrays are null.
  slot_mirror commit{};
  std::int64_t capacity = 1;
};

}  // namespace gear::detail
