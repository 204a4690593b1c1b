#pragma once
// gear::batch: the reusable output of sample(). It owns one allocation holding, for B rows of a
// window of L steps,
//
//   column c   [B][L][shape of c...]   the gathered steps, zero where the mask is 0
//   mask       [B][L]                  1 where the position holds a trajectory step
//   keys       [B]                     the sampled trajectories
//   probabilities, weights [B]         selection probability and importance weight of each row
//
// in host memory for host storage, in device memory otherwise, and beside it the selection's
// workspace (detail::selection_workspace). One batch is filled by one sample at a time: samples
// into one batch from two streams must be ordered by the caller (an event, or one stream), or
// each stream given its own batch. Two at once would race on its bytes and share its workspace,
// whose arrivals word could then stay non-zero: every later sample into the batch would finish
// its last-block work (weights, removals, clearing the claims of draws without replacement)
// early. Views are mdspans into it: pass them to kernels by value, or copy the bytes out. Make
// one batch per (B, L) and reuse it; sample() allocates nothing in it (a sample that removes what
// it returned leases pinned staging from the buffer for its readback, allocated the first time).

#include <array>
#include <cstddef>
#include <cstdint>
#include <cuda/std/mdspan>
#include <cuda/std/span>
#include <gear/detail/memory.hpp>
#include <gear/detail/selection_workspace.hpp>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <gear/spec.hpp>
#include <gear/strong_types.hpp>
#include <string>

namespace gear {

template <trajectory_spec Spec>
class batch {
  static constexpr std::size_t num_columns = Spec::num_columns;

 public:
  /// The [B, L, shape...] view type of column I.
  template <std::size_t I>
  using column_view = cuda::std::mdspan<const typename Spec::template column_t<I>::element_type,
                                        typename Spec::template column_t<I>::batch_extents>;
  using mask_view = cuda::std::mdspan<const std::uint8_t, cuda::std::dextents<std::int64_t, 2>>;

  /// Allocates a batch of `rows` rows of `length` steps in memory of kind `where`.
  /// Throws errc::invalid_argument for rows or length below 1, errc::out_of_memory (also for a
  /// batch of more than 2^62 bytes), errc::cuda_error.
  batch(memory_kind where, gear::batch_size rows, gear::window_length length)
      : rows_(rows.value), length_(length.value) {
    GEAR_REQUIRE(rows_ >= 1, errc::invalid_argument,
                 "batch size must be at least 1, got " + std::to_string(rows_));
    GEAR_REQUIRE(length_ >= 1, errc::invalid_argument,
                 "window length must be at least 1, got " + std::to_string(length_));
    // Bytes per row and step (the columns and the mask), and a row's own (key, slot,
    // probability, weight), with room for the alignment: no size below can overflow.
    constexpr std::int64_t per_step = [] {
      std::int64_t bytes = 1;
      for (std::size_t c = 0; c < num_columns; ++c) bytes += Spec::step_bytes[c];
      return bytes;
    }();
    constexpr std::int64_t most = std::int64_t{1} << 62;
    GEAR_REQUIRE(rows_ <= most / 4096 && length_ <= (most / rows_ - 4096) / per_step,
                 errc::out_of_memory,
                 "a batch of " + std::to_string(rows_) + " rows of " + std::to_string(length_) +
                     " steps of " + std::to_string(per_step - 1) +
                     " bytes would take more than 2^62 bytes");
    std::size_t at = 0;
    auto reserve = [&at](std::int64_t bytes) {
      const std::size_t here = at;
      at += static_cast<std::size_t>(align_up_256(bytes));
      return here;
    };
    for (std::size_t c = 0; c < num_columns; ++c)
      column_offset_[c] = reserve(rows_ * length_ * Spec::step_bytes[c]);
    mask_offset_ = reserve(rows_ * length_);
    keys_offset_ = reserve(rows_ * std::int64_t{sizeof(key)});
    slots_offset_ = reserve(rows_ * std::int64_t{sizeof(std::int64_t)});
    probabilities_offset_ = reserve(rows_ * std::int64_t{sizeof(float)});
    weights_offset_ = reserve(rows_ * std::int64_t{sizeof(float)});
    memory_ = detail::allocation(where, at);
    workspace_ = detail::selection_workspace(where, rows_);
  }

  [[nodiscard]] std::int64_t batch_size() const noexcept { return rows_; }
  [[nodiscard]] std::int64_t window_length() const noexcept { return length_; }
  /// Where the batch's bytes live.
  [[nodiscard]] memory_kind where() const noexcept { return memory_.kind(); }
  /// False only for a batch moved from, which holds no memory: no call samples into it.
  [[nodiscard]] bool holds_memory() const noexcept { return memory_.data() != nullptr; }

  /// Column I as a [B, L, shape...] view.
  template <std::size_t I>
  [[nodiscard]] column_view<I> column() const noexcept {
    using T = typename column_view<I>::element_type;
    return column_view<I>(reinterpret_cast<T*>(base() + column_offset_[I]), rows_, length_);
  }
  /// The column called Name as a [B, L, shape...] view.
  template <fixed_string Name>
  [[nodiscard]] auto column() const noexcept {
    constexpr std::size_t i = Spec::index_of(Name.view());
    static_assert(i < num_columns,
                  "gear::batch::column<Name>: the spec has no column of that name");
    return column<i>();
  }
  /// [B, L]: 1 where a position holds a step of the trajectory, 0 where it is padding.
  [[nodiscard]] mask_view mask() const noexcept {
    return mask_view(reinterpret_cast<const std::uint8_t*>(base() + mask_offset_), rows_, length_);
  }
  /// [B]: the key of each row's trajectory.
  [[nodiscard]] cuda::std::span<const key> keys() const noexcept {
    return {reinterpret_cast<const key*>(base() + keys_offset_), static_cast<std::size_t>(rows_)};
  }
  /// [B]: the probability with which each row's trajectory was drawn.
  [[nodiscard]] cuda::std::span<const float> probabilities() const noexcept {
    return {reinterpret_cast<const float*>(base() + probabilities_offset_),
            static_cast<std::size_t>(rows_)};
  }
  /// [B]: importance weights (all 1 for policies without importance sampling).
  [[nodiscard]] cuda::std::span<const float> weights() const noexcept {
    return {reinterpret_cast<const float*>(base() + weights_offset_),
            static_cast<std::size_t>(rows_)};
  }

  // For the buffer that fills the batch.
  [[nodiscard]] std::byte* column_data(std::size_t c) const noexcept {
    return base() + column_offset_[c];
  }
  [[nodiscard]] std::uint8_t* mask_data() const noexcept {
    return reinterpret_cast<std::uint8_t*>(base() + mask_offset_);
  }
  [[nodiscard]] key* keys_data() const noexcept {
    return reinterpret_cast<key*>(base() + keys_offset_);
  }
  [[nodiscard]] std::int64_t* slots_data() const noexcept {
    return reinterpret_cast<std::int64_t*>(base() + slots_offset_);
  }
  [[nodiscard]] float* probabilities_data() const noexcept {
    return reinterpret_cast<float*>(base() + probabilities_offset_);
  }
  [[nodiscard]] float* weights_data() const noexcept {
    return reinterpret_cast<float*>(base() + weights_offset_);
  }
  /// What the selection of a sample into this batch may use besides its outputs.
  [[nodiscard]] const detail::selection_workspace& workspace() const noexcept { return workspace_; }

 private:
  static constexpr std::int64_t align_up_256(std::int64_t x) noexcept {
    return (x + 255) / 256 * 256;
  }
  [[nodiscard]] std::byte* base() const noexcept { return memory_.device_data(); }

  std::int64_t rows_;
  std::int64_t length_;
  std::array<std::size_t, num_columns> column_offset_{};
  std::size_t mask_offset_ = 0, keys_offset_ = 0, slots_offset_ = 0, probabilities_offset_ = 0,
              weights_offset_ = 0;
  detail::allocation memory_;
  detail::selection_workspace workspace_;
};

namespace detail {

/// Throws errc::batch_mismatch for a batch (or a slice of one) moved from: it holds no memory.
template <class Batch>
void check_batch_memory(const Batch& out) {
  GEAR_REQUIRE(out.holds_memory(), errc::batch_mismatch,
               "batch holds no memory (it was moved from); make one with make_batch()");
}

}  // namespace detail

}  // namespace gear
