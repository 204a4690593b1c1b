#pragma once
// detail::batch_slice: rows [first, first + rows) of a gear::batch, which a buffer samples into as
// if they were a batch of their own (sharded_buffer: each shard writes its share of the rows
// straight into the caller's batch). Its scratch and arrivals word are its own: the selection's
// workspace of the share, not the batch's.

#include <cstddef>
#include <cstdint>
#include <gear/batch.hpp>
#include <gear/key.hpp>

namespace gear::detail {

template <trajectory_spec Spec>
class batch_slice {
 public:
  /// Rows [first, first + rows) of `whole`, with `scratch_size` words of scratch at `scratch`
  /// (for a selection policy: a power of two >= 2 * rows) and an arrivals word (0 between
  /// samples; selection_request::arrivals). Requires the rows within `whole`.
  batch_slice(const batch<Spec>& whole, std::int64_t first, std::int64_t rows,
              std::uint64_t* scratch, std::int64_t scratch_size, unsigned* arrivals) noexcept
      : whole_(&whole),
        first_(first),
        rows_(rows),
        scratch_(scratch),
        scratch_size_(scratch_size),
        arrivals_(arrivals) {}

  [[nodiscard]] std::int64_t batch_size() const noexcept { return rows_; }
  [[nodiscard]] std::int64_t window_length() const noexcept { return whole_->window_length(); }
  [[nodiscard]] memory_kind where() const noexcept { return whole_->where(); }

  [[nodiscard]] std::byte* column_data(std::size_t c) const noexcept {
    return whole_->column_data(c) + first_ * window_length() * Spec::step_bytes[c];
  }
  [[nodiscard]] std::uint8_t* mask_data() const noexcept {
    return whole_->mask_data() + first_ * window_length();
  }
  [[nodiscard]] key* keys_data() const noexcept { return whole_->keys_data() + first_; }
  [[nodiscard]] std::int64_t* slots_data() const noexcept { return whole_->slots_data() + first_; }
  [[nodiscard]] float* probabilities_data() const noexcept {
    return whole_->probabilities_data() + first_;
  }
  [[nodiscard]] float* weights_data() const noexcept { return whole_->weights_data() + first_; }
  [[nodiscard]] std::uint64_t* scratch_data() const noexcept { return scratch_; }
  [[nodiscard]] std::int64_t scratch_size() const noexcept { return scratch_size_; }
  [[nodiscard]] unsigned* arrivals_data() const noexcept { return arrivals_; }

 private:
  const batch<Spec>* whole_;
  std::int64_t first_, rows_;
  std::uint64_t* scratch_;
  std::int64_t scratch_size_;
  unsigned* arrivals_;
};

}  // namespace gear::detail
