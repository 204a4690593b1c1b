#pragma once
// Device side of gear::select::recency: one thread per row, or drawn inside the gather kernel
// (row_selector). The candidate count and weight total come from the host-side sum trees, so
// selection never synchronises.

#include <cuda/stream_ref>
#include <gear/detail/select_rows.cuh>
#include <gear/select/recency.hpp>
#include <optional>

namespace gear::select {

/// Device side: one kernel launch, stream-ordered, never synchronises.
template <>
class recency::state<exec::device> : public detail::recency_state_base {
 public:
  using recency_state_base::recency_state_base;

  void select(const slot_table& t, const selection_request& r, cuda::stream_ref stream) {
    detail::select_rows_on_device(detail::recency_rows{t, r, window(t)}, r, stream);
  }

  /// Every row is drawn on its own, so sample() draws inside the gather kernel.
  [[nodiscard]] std::optional<detail::recency_rows> row_selector(const slot_table& t,
                                                                 const selection_request& r) const {
    return detail::recency_rows{t, r, window(t)};
  }
};

}  // namespace gear::select
