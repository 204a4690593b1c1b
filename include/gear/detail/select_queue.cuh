#pragma once
// Device side of gear::select::fifo and lifo. The rows are chosen on the host (queue_rows, in
// select/queue.hpp) into pinned staging (its own, or a consuming sample's lease), which the GPU
// reads through its mapping: a small gather reads them there itself (with_chosen_rows around the
// gather: one launch per sample); otherwise one select launch writes them to the request first.
// No copy is enqueued and nothing is read back: the rows stay on the host too (host_rows), so a
// sample that removes what it returns counts them there, without synchronising.

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
  const std::int64_t* slots = nullptr;  // the GPU's address of the staged rows
  static constexpr bool per_thread = true;
  GEAR_HD selected_row operator()(std::int64_t row) const { return {slots[row], 1.0f, 1.0f}; }
};

template <bool OldestFirst>
class queue_state<OldestFirst, exec::device> : public queue_order<OldestFirst> {
 public:
  using queue_order<OldestFirst>::queue_order;

  /// Staging for batches of up to `batch` rows, allocated now (replay_buffer::reserve_staging).
  /// Throws errc::out_of_memory or errc::cuda_error with the state as it was.
  void reserve_staging(std::int64_t batch) {
    chosen_.reserve(static_cast<std::size_t>(batch));
    this->reserve_plan(batch);
    staging_.reserve(static_cast<std::size_t>(batch) * sizeof(std::int64_t));
  }

  /// Chooses the rows on the host into the next staging area (or the request's, if it has one),
  /// then calls launch(rows), the row function that reads them there, to enqueue the kernels that
  /// do; the area is refilled only after they have run (a ring of four areas, so a caller waits
  /// on the host only when its stream is four samples behind). host_rows() holds the rows too.
  /// Throws errc::out_of_memory or errc::cuda_error before launch runs, with the state as it
  /// was, and what launch throws.
  template <class Launch>
  void with_chosen_rows(const slot_table& t, const selection_request& r, cuda::stream_ref stream,
                        Launch&& launch) {
    const auto rows = static_cast<std::size_t>(r.batch);
    const bool own = r.chosen_rows_host == nullptr;  // else the caller's: no area, no event
    auto* slots =
        own ? reinterpret_cast<std::int64_t*>(staging_.acquire(rows * sizeof(std::int64_t)))
            : r.chosen_rows_host;
    const auto* device = own ? reinterpret_cast<const std::int64_t*>(staging_.device_address())
                             : r.chosen_rows_device;
    chosen_.resize(rows);  // before the cursor moves (choose writes -1 past the rows it finds)
    this->choose(t, r.batch, chosen_.data());
    std::copy(chosen_.begin(), chosen_.end(), slots);
    if (!own) {
      launch(chosen_rows{device});
      return;
    }
    try {
      launch(chosen_rows{device});
    } catch (...) {
      staging_.copied(stream);  // a launch may have been enqueued
      throw;
    }
    staging_.copied(stream);
  }

  /// Chooses the rows, then one launch writes them to the request's outputs.
  void select(const slot_table& t, const selection_request& r, cuda::stream_ref stream) {
    with_chosen_rows(t, r, stream,
                     [&](const chosen_rows& rows) { select_rows_on_device(rows, r, stream); });
  }

  /// The slots the last selection chose (host memory), until the next one.
  [[nodiscard]] std::span<const std::int64_t> host_rows() const noexcept { return chosen_; }

 private:
  staging_ring<4> staging_;
  std::vector<std::int64_t> chosen_;
};

}  // namespace gear::detail
