#pragma once
// detail::selection_workspace: what a selection may use besides its outputs, one per batch (and
// one per shard's share of a batch in a sharded_buffer, whose shards select at once):
//
//   scratch   [size] words, contents unspecified between samples
//   claims    [size] words, all 0 between samples: a selection that uses them leaves them 0
//   arrivals  one word, 0 between samples: the same
//
// size is a power of two >= 2 * rows. Zero-between-samples memory lets a selection finish in one
// launch: its blocks count their arrivals, and the last to arrive does what needs every row (the
// weights of a prioritized batch) and clears what the next sample needs clear (the claim table
// of uniform sampling without replacement), where otherwise a second launch or a memset would.
// One batch is filled by one sample at a time, so no two selections share a workspace at once.

#include <cstddef>
#include <cstdint>
#include <gear/detail/claim.hpp>
#include <gear/detail/memory.hpp>
#include <gear/select/concept.hpp>
#include <utility>

namespace gear::detail {

class selection_workspace {
 public:
  selection_workspace() = default;
  /// The workspace of a selection of up to `rows` rows, in memory of kind `where`, its claims and
  /// arrivals cleared (waited for). Throws errc::out_of_memory, errc::cuda_error.
  selection_workspace(memory_kind where, std::int64_t rows)
      : size_(claim_table_size(rows)),
        memory_(where,
                static_cast<std::size_t>(2 * size_) * sizeof(std::uint64_t) + sizeof(unsigned)) {
    const std::size_t words = static_cast<std::size_t>(size_) * sizeof(std::uint64_t);
    zero_now(memory_.data() + words, words + sizeof(unsigned), where);
  }

  selection_workspace(selection_workspace&& o) noexcept
      : size_(std::exchange(o.size_, 0)), memory_(std::move(o.memory_)) {}
  selection_workspace& operator=(selection_workspace&& o) noexcept {
    size_ = std::exchange(o.size_, 0);
    memory_ = std::move(o.memory_);
    return *this;
  }

  /// Words of scratch and of claims (0 once moved from: every pointer is then null).
  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint64_t* scratch() const noexcept {
    return memory_.device_as<std::uint64_t>();
  }
  [[nodiscard]] std::uint64_t* claims() const noexcept {
    return size_ == 0 ? nullptr : scratch() + size_;
  }
  [[nodiscard]] unsigned* arrivals() const noexcept {
    return size_ == 0 ? nullptr : reinterpret_cast<unsigned*>(scratch() + 2 * size_);
  }

  /// Points the request's workspace fields here.
  void lend_to(selection_request& r) const noexcept {
    r.scratch = scratch();
    r.scratch_size = size_;
    r.claims = claims();
    r.arrivals = arrivals();
  }

 private:
  std::int64_t size_ = 0;
  allocation memory_;
};

}  // namespace gear::detail
