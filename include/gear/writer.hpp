#pragma once
// gear::writer: writes one trajectory step by step into a reserved slot, then commits it.
//
//   auto w = buf.make_writer(stream);
//   for (...) w.append(obs_ptr, &action, &reward, &done);   // one pointer per column
//   gear::key k = w.commit();
//
// Each step is copied during append, from pageable or pinned host memory alike, so the caller may
// reuse its step buffer at once. For GPU buffers steps gather in pinned staging and move into the
// slot with one stream-ordered copy per column every few steps and at commit; for storage::host
// the CPU writes the slot at once. A writer holds its buffer's state, not the buffer object: the
// buffer may be moved while writers are open, not destroyed.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cuda/stream_ref>
#include <gear/detail/buffer/slots.hpp>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <gear/ref.hpp>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace gear {

template <class Core>
class writer {
  using spec = typename Core::spec_type;
  static constexpr std::size_t columns = spec::num_columns;
  static constexpr std::int64_t staging_target_bytes = std::int64_t{256} << 10;

 public:
  /// Reserves one slot (its occupant is evicted in stream order). Does not synchronise.
  /// Throws errc::cuda_error, errc::out_of_memory.
  writer(Core& core, cuda::stream_ref stream)
      : core_(&core), stream_(stream), reservation_(detail::reserve_slots(core, 1, stream)) {
    chunk_steps_ = steps_per_chunk(core.max_length_);
  }

  /// The pinned staging one writer of a GPU buffer of trajectories up to `max_length` steps
  /// holds from its first append to its commit: room for a chunk of steps of every column.
  [[nodiscard]] static std::size_t staging_bytes(std::int64_t max_length) noexcept {
    return chunk_bytes(steps_per_chunk(max_length));
  }
  writer(writer&& o) noexcept
      : core_(std::exchange(o.core_, nullptr)),
        stream_(o.stream_),
        reservation_(o.reservation_),
        steps_(o.steps_),
        flushed_(o.flushed_),
        chunk_steps_(o.chunk_steps_),
        lease_(std::exchange(o.lease_, std::nullopt)) {}
  writer& operator=(writer&&) = delete;
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;
  /// Gives the slot up if the trajectory was not committed.
  ~writer() {
    if (core_ == nullptr) return;
    std::optional<detail::device_scope> scope;
    try {
      scope.emplace(core_->device_);
    } catch (...) {
      // The abandon below then fails to enqueue and marks the buffer unusable: never silent.
    }
    if (lease_) {
      const auto held = lock();
      core_->staging_.give_back(*lease_);
    }
    detail::abandon_slot(*core_, reservation_.first_ticket, stream_);
  }

  /// Steps written so far.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  /// The slot being written.
  [[nodiscard]] std::int64_t slot() const noexcept { return reservation_.slot(0); }

  /// Appends one step: one pointer per column, in spec order, each to one step's elements in host
  /// memory, copied before the call returns.
  /// Throws (appending nothing) errc::writer_full past max_length, errc::null_pointer,
  /// errc::invalid_reservation after commit or takeover, errc::out_of_memory, errc::cuda_error.
  template <class... T>
  void append(const T*... step) {
    static_assert(sizeof...(T) == columns, "writer::append: one pointer per column");
    [&]<std::size_t... C>(std::index_sequence<C...>) {
      static_assert(
          (std::is_same_v<std::remove_cv_t<T>, typename spec::template column_t<C>::element_type> &&
           ...),
          "writer::append: pointer types must match the spec's column types");
    }
    (std::make_index_sequence<columns>{});
    const auto held = lock();
    check_open();
    const detail::device_scope scope(core_->device_);
    GEAR_REQUIRE(
        steps_ < core_->max_length_, errc::writer_full,
        "trajectory already has max_length = " + std::to_string(core_->max_length_) + " steps");
    const void* ptrs[] = {static_cast<const void*>(step)...};
    for (std::size_t c = 0; c < columns; ++c)
      GEAR_REQUIRE(ptrs[c] != nullptr, errc::null_pointer,
                   "column '" + std::string(spec::names[c]) + "': step pointer is null");
    if constexpr (!Core::on_device) {
      for (std::size_t c = 0; c < columns; ++c)
        std::memcpy(core_->regions_.host[c].at(slot(), steps_), ptrs[c],
                    static_cast<std::size_t>(spec::step_bytes[c]));
    } else {
      if (!lease_) lease_ = core_->staging_.acquire(chunk_bytes(), 0);
      const std::int64_t k = steps_ - flushed_;
      for (std::size_t c = 0; c < columns; ++c)
        std::memcpy(staged(c) + k * spec::step_bytes[c], ptrs[c],
                    static_cast<std::size_t>(spec::step_bytes[c]));
      if (k + 1 == chunk_steps_) {
        ++steps_;
        try {
          flush();
        } catch (...) {
          --steps_;  // the step stays staged; the append failed
          throw;
        }
        return;
      }
    }
    ++steps_;
  }

  /// Commits the steps written so far as one trajectory and returns its key. Stream-ordered;
  /// does not synchronise. Throws (the writer stays open) errc::empty_trajectory with no steps,
  /// errc::invalid_reservation after takeover, errc::out_of_memory, errc::cuda_error.
  key commit_async() {
    const detail::device_scope scope(core_ != nullptr ? core_->device_ : -1);
    {
      const auto held = lock();
      check_open();
      GEAR_REQUIRE(steps_ >= 1, errc::empty_trajectory, "the writer has no steps to commit");
      if constexpr (Core::on_device) flush();
    }
    key k{};
    const std::int64_t length = steps_;
    detail::commit_slots(*core_, reservation_, std::span<const std::int64_t>(&length, 1),
                         std::span<key>(&k, 1), stream_);
    core_ = nullptr;
    return k;
  }
  /// commit_async, then synchronises the stream (the key is valid either way).
  key commit() {
    Core* core = core_;
    const key k = commit_async();
    const detail::device_scope scope(core->device_);
    core->synchronize(stream_);
    return k;
  }

 private:
  /// Steps staged before a flush: about staging_target_bytes, at least 1, at most max_length.
  [[nodiscard]] static std::int64_t steps_per_chunk(std::int64_t max_length) noexcept {
    std::int64_t step_total = 0;
    for (std::size_t c = 0; c < columns; ++c) step_total += spec::step_bytes[c];
    return std::clamp<std::int64_t>(staging_target_bytes / std::max<std::int64_t>(step_total, 1), 1,
                                    max_length);
  }
  [[nodiscard]] static std::size_t chunk_bytes(std::int64_t chunk_steps) noexcept {
    std::int64_t bytes = 0;
    for (std::size_t c = 0; c < columns; ++c)
      bytes += align_up(chunk_steps * spec::step_bytes[c], segment_alignment);
    return static_cast<std::size_t>(bytes);
  }
  [[nodiscard]] std::size_t chunk_bytes() const noexcept { return chunk_bytes(chunk_steps_); }
  [[nodiscard]] std::byte* staged(std::size_t column) const noexcept {
    std::byte* p = lease_->host;
    for (std::size_t c = 0; c < column; ++c)
      p += align_up(chunk_steps_ * spec::step_bytes[c], segment_alignment);
    return p;
  }

  /// Copies the staged steps [flushed_, steps_) into the slot, one copy per column, in stream
  /// order; the staging is reused once the copies have read it.
  void flush() {
    if (!lease_ || steps_ == flushed_) return;
    const std::int64_t n = steps_ - flushed_;
    // Ordered as a write: a later reservation of this slot on another stream waits for it.
    core_->order_before(stream_, Core::write);
    core_->enqueue([&] {
      for (std::size_t c = 0; c < columns; ++c)
        GEAR_CUDA_TRY(cudaMemcpyAsync(core_->regions_.host[c].at(slot(), flushed_), staged(c),
                                      static_cast<std::size_t>(n * spec::step_bytes[c]),
                                      cudaMemcpyDefault, stream_.get()));
      const detail::staging_pool::lease done = *lease_;
      lease_.reset();
      flushed_ = steps_;
      core_->staging_.release_after(done, stream_.get());
      core_->order_after(stream_, Core::write);
    });
  }

  /// The buffer's mutex (none once committed; check_open then throws).
  [[nodiscard]] std::unique_lock<std::mutex> lock() const {
    return core_ != nullptr ? core_->lock() : std::unique_lock<std::mutex>{};
  }

  void check_open() const {
    GEAR_REQUIRE(core_ != nullptr, errc::invalid_reservation,
                 "the writer was committed or moved from: it holds no slot");
    core_->check_usable(stream_);
    GEAR_REQUIRE(core_->ring_.is_pending(reservation_.first_ticket), errc::invalid_reservation,
                 "the writer's slot was taken over by newer reservations");
  }

  Core* core_;
  cuda::stream_ref stream_;
  reservation reservation_;
  std::int64_t steps_ = 0;
  std::int64_t flushed_ = 0;
  std::int64_t chunk_steps_ = 1;
  std::optional<detail::staging_pool::lease> lease_;
};

}  // namespace gear
