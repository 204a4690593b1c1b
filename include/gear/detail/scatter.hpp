#pragma once
// Writing a batch of packed trajectories into their slots: the description shared by the host
// loop and the device kernel (scatter.cuh).

#include <cstddef>
#include <cstdint>
#include <gear/layout.hpp>
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
  const scatter_row* rows = nullptr;  ///< [count], in device memory
};

}  // namespace gear::detail
