#pragma once
// Selection one row at a time on the CPU, for policies that draw each row on their own (uniform,
// recency): the loop behind their host select(), given the policy's row function.

#include <cstdint>
#include <gear/select/concept.hpp>

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

}  // namespace gear::detail
