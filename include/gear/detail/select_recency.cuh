#pragma once
// Device side of gear::select::recency: one thread per row, or drawn inside the gather kernel
// (row_selector). The candidate count and weight total come from the host-side sum trees, so
// selection never synchronises. A sample under max_times_sampled draws its rows on the host
// (mirror_rows) and the GPU gathers those: the age draws use exp and log functions that may round
// differently on the two, so the GPU does not draw them again.

#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/recency_scan.hpp>
#include <gear/detail/select_rows.cuh>
#include <gear/select/recency.hpp>
#include <optional>
#include <span>
#include <variant>
#include <vector>

namespace gear::select {

/// Device side: one kernel launch, stream-ordered, never synchronises.
template <>
class recency::state<exec::device> : public detail::recency_state_base {
 public:
  using recency_state_base::recency_state_base;

  void select(const slot_table& t, const selection_request& r, cuda::stream_ref stream) {
    if (r.chosen_rows_device != nullptr)
      detail::select_rows_on_device(staged_rows(t, r), r, stream);
    else
      detail::select_rows_on_device(detail::recency_rows{t, r, window(t)}, r, stream);
  }

  /// Every row is drawn on its own, so sample() draws inside the gather kernel.
  [[nodiscard]] std::optional<
      std::variant<detail::recency_rows, detail::staged_rows<detail::recency_rows>>>
  row_selector(const slot_table& t, const selection_request& r) const {
    if (r.chosen_rows_device != nullptr) return staged_rows(t, r);
    return detail::recency_rows{t, r, window(t)};
  }

  /// Host memory for mirror_rows of batches of up to `batch` rows, allocated now
  /// (replay_buffer::reserve_staging). Throws std::bad_alloc with the state as it was.
  void reserve_staging(std::int64_t batch) { mirrored_.reserve(static_cast<std::size_t>(batch)); }

  /// (gear::host_row_mirroring) The host draws a sample's rows, and the GPU gathers them from
  /// r.chosen_rows_device, where the buffer stages them.
  [[nodiscard]] bool mirrors() const noexcept { return true; }
  [[nodiscard]] bool stages_mirror() const noexcept { return true; }
  /// The rows of `r` drawn on the host from `host_view` (the table as of the call, with the
  /// ring's host arrays): host memory, valid until the next call. Throws std::bad_alloc (nothing
  /// else changes).
  std::span<const std::int64_t> mirror_rows(const slot_table& host_view,
                                            const selection_request& r) {
    const detail::recency_window w = window(host_view);
    mirrored_.resize(static_cast<std::size_t>(r.batch));
    bool scanned = false;  // the scan's table, built at the first row whose draws all miss
    for (std::int64_t row = 0; row < r.batch; ++row) {
      std::int64_t slot = detail::recency_draws(host_view, r, w, row);
      if (slot < 0) {
        if (!scanned) scan_.build(host_view, w);
        scanned = true;
        slot = scan_.pick(detail::recency_scan_draw(r, row));
      }
      mirrored_[static_cast<std::size_t>(row)] = slot;
    }
    return mirrored_;
  }

 private:
  [[nodiscard]] detail::staged_rows<detail::recency_rows> staged_rows(
      const slot_table& t, const selection_request& r) const {
    return {detail::recency_rows{t, r, window(t)}, r.chosen_rows_device};
  }

  std::vector<std::int64_t> mirrored_;
  detail::recency_scan_table scan_;
};

}  // namespace gear::select
