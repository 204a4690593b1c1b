#pragma once
// Writing a batch of packed trajectories into their slots: the description shared by the host
// loop and the device kernel (scatter.cuh).

#include <cstddef>
#include <cstdint>
#include <gear/layout.hpp>
#include <gear/spec.hpp>

namespace gear::detail {

/// One trajectory of an insert: its slot, where its steps start in the packed input, its length
/// and its ticket. With `staged` set, the row's packed input is its own: every column's steps of
/// `staged_steps` in all, one column after the other at segment_alignment (a landing insert's
/// staging, landing.hpp), and the columns' `src` are not used.
struct scatter_row {
  std::int64_t slot = 0;
  std::int64_t src_step = 0;
  std::int64_t length = 0;
  std::uint64_t ticket = 0;
  const std::byte* staged = nullptr;
  std::int64_t staged_steps = 0;
};

/// Source (packed, trajectories back to back) and destination (slot segments) of one column.
struct scatter_column {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;  ///< column segment of slot 0
  std::int64_t slot_stride = 0;
  std::int64_t step_bytes = 0;
};

/// Where column c of packed staging for `steps` steps starts: the columns before it, each padded
/// to segment_alignment.
template <class Args>
GEAR_HD constexpr std::int64_t staged_column_offset(const Args& a, int c, std::int64_t steps) {
  std::int64_t at = 0;
  for (int k = 0; k < c; ++k) {
    const std::int64_t bytes = steps * a.columns[k].step_bytes;
    at += (bytes + segment_alignment - 1) / segment_alignment * segment_alignment;
  }
  return at;
}

struct scatter_args {
  scatter_column columns[max_columns];
  int num_columns = 0;
  std::int64_t count = 0;             ///< trajectories
  std::int64_t max_count_length = 0;  ///< longest trajectory of this insert
  const scatter_row* rows = nullptr;  ///< [count], in device memory
};

}  // namespace gear::detail
