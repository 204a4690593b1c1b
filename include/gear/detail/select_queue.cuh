#pragma once
// Device side of gear::select::fifo and lifo. The rows are chosen on the host (queue_rows, in
// select/queue.hpp) into pinned staging, which the GPU reads through its mapping: a small gather
// reads them there itself (choose_rows, then the gather: one launch per sample); otherwise one
// select launch writes them to the request first. No copy is enqueued and nothing is read back:
// the rows stay on the host too (host_rows), so a sample that removes what it returns counts them
// there, without synchronising.

#include <algorithm>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/select_rows.cuh>
#include <gear/detail/staging_ring.hpp>
#include <gear/select/concept.hpp>
#include <gear/select/queue.hpp>
#include <span>
#include <vector>

namespace gear::detail {

/// Rows chosen on the host, as a row function: slot `row` of mapped pinned memory, probability
/// and weight 1.
struct chosen_rows {
  const std::int64_t* slots = nullptr;  // the GPU's address of the staging area
  GEAR_HD selected_row operator()(std::int64_t row) const { return {slots[row], 1.0f, 1.0f}; }
};

template <bool OldestFirst>
class queue_state<OldestFirst, exec::device> {
 public:
  explicit queue_state(std::int64_t capacity)
      : links_(OldestFirst ? 0 : static_cast<std::size_t>(capacity)) {}
  void validate(const slot_table& t, std::int64_t batch) const { validate_queue(t, batch); }

  /// Chooses the rows on the host into the next staging area and returns the row function that
  /// reads them there (host_rows() holds them too). The areas are a ring of four, so a caller
  /// waits on the host only when its stream is four samples behind. Call rows_enqueued() once
  /// every launch that reads them is enqueued, or has failed. Throws errc::out_of_memory,
  /// errc::cuda_error, with the state as it was.
  [[nodiscard]] chosen_rows choose_rows(const slot_table& t, const selection_request& r) {
    const auto rows = static_cast<std::size_t>(r.batch);
    auto* slots = reinterpret_cast<std::int64_t*>(staging_.acquire(rows * sizeof(std::int64_t)));
    chosen_.assign(rows, -1);  // before the cursor moves; -1 counts as no row
    queue_rows(t, OldestFirst, r.batch, chosen_.data(), cursor_, links_.data());
    std::copy(chosen_.begin(), chosen_.end(), slots);
    return {reinterpret_cast<const std::int64_t*>(staging_.device_address())};
  }
  /// Ends the use of the area choose_rows() filled: the launches that read it are on `stream`.
  void rows_enqueued(cuda::stream_ref stream) { staging_.copied(stream); }

  /// Chooses the rows, then one launch writes them to the request's outputs.
  void select(const slot_table& t, const selection_request& r, cuda::stream_ref stream) {
    const chosen_rows rows = choose_rows(t, r);
    try {
      select_rows_on_device(rows, r, stream);
    } catch (...) {
      rows_enqueued(stream);  // the launch may have been enqueued
      throw;
    }
    rows_enqueued(stream);
  }

  /// The slots the last selection chose (host memory), until the next one.
  [[nodiscard]] std::span<const std::int64_t> host_rows() const noexcept { return chosen_; }

 private:
  staging_ring<4> staging_;
  std::vector<std::int64_t> chosen_;
  std::uint64_t cursor_ = 0;
  std::vector<lifo_link> links_;
};

}  // namespace gear::detail
