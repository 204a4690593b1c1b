#pragma once
// Selection one row at a time on the CPU, for policies that draw each row on their own (uniform,
// recency): the loop behind their host select(), given the policy's row function; and the row
// function of rows the host drew for the GPU (a device state's mirror_rows, staged).

#include <cstdint>
#include <gear/config.hpp>
#include <gear/select/concept.hpp>
#include <vector>

namespace gear::detail {

/// Writes rows(row) for every row of r to r's outputs (host memory).
template <class Rows>
void select_rows_on_host(const Rows& rows, const selection_request& r) {
  for (std::int64_t row = 0; row < r.batch; ++row) {
    const selected_row s = rows(row);
    r.slots[row] = s.slot;
    r.probabilities[row] = s.probability;
    r.weights[row] = s.weight;
  }
}

/// The slots rows(row) draws for the `batch` rows, into `out` (host memory). Throws
/// std::bad_alloc with `out` as it was.
template <class Rows>
void draw_slots_on_host(const Rows& rows, std::int64_t batch, std::vector<std::int64_t>& out) {
  out.resize(static_cast<std::size_t>(batch));
  for (std::int64_t row = 0; row < batch; ++row)
    out[static_cast<std::size_t>(row)] = rows(row).slot;
}

/// Rows the host drew (a device state's mirror_rows, staged by the buffer in the request's
/// chosen_rows_device) as a row function: slot `row` of that memory, with the probability the
/// policy's row function `Rows` gives that slot (its member probability(slot)) and weight 1.
template <class Rows>
struct staged_rows {
  Rows rows;
  const std::int64_t* slots = nullptr;  // the GPU's address of the staged rows
  static constexpr bool per_thread = true;
  GEAR_HD selected_row operator()(std::int64_t row) const {
    const std::int64_t slot = slots[row];
    return {slot, rows.probability(slot), 1.0f};
  }
};

}  // namespace gear::detail
