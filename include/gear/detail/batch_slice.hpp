#pragma once
// detail::batch_slice: rows [first, first + rows) of a gear::batch, which a buffer samples into as
// if they were a batch of their own (sharded_buffer: each shard writes its share of the rows
// straight into the caller's batch). Its selection workspace is its own (the share's), not the
// batch's: the shards select at once.

#include <cstddef>
#include <cstdint>
#include <gear/batch.hpp>
#include <gear/detail/selection_workspace.hpp>
#include <gear/key.hpp>

namespace gear::detail {

template <trajectory_spec Spec>
class batch_slice {
 public:
  /// Rows [first, first + rows) of `whole`, selected with `workspace` (of at least `rows` rows).
  /// Requires the rows within `whole`.
  batch_slice(const batch<Spec>& whole, std::int64_t first, std::int64_t rows,
              const selection_workspace& workspace) noexcept
      : whole_(&whole), first_(first), rows_(rows), workspace_(&workspace) {}

  [[nodiscard]] std::int64_t batch_size() const noexcept { return rows_; }
  [[nodiscard]] std::int64_t window_length() const noexcept { return whole_->window_length(); }
  [[nodiscard]] memory_kind where() const noexcept { return whole_->where(); }
  [[nodiscard]] bool holds_memory() const noexcept { return whole_->holds_memory(); }

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
  [[nodiscard]] const selection_workspace& workspace() const noexcept { return *workspace_; }

 private:
  const batch<Spec>* whole_;
  std::int64_t first_, rows_;
  const selection_workspace* workspace_;
};

}  // namespace gear::detail
