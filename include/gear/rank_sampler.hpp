#pragma once
// gear::rank_sampler: data-parallel learners that draw disjoint rows of one buffer, step by step,
// with no coordinator.
//
// R learner ranks (threads of one process, each with its own stream and its batch on its own GPU)
// share a buffer (a sharded_buffer over the machine's GPUs, or one replay_buffer). Ranks whose
// rows may overlap need nothing of this: each samples the buffer with an rng of its own seed. A
// rank_sampler gives ranks rows that do not overlap within a step:
//
//   step t of the ranks is one joint draw of R x B rows from the buffer, by its own law (with a
//   selection without replacement, R x B distinct trajectories), put in a uniformly random order;
//   rank r takes positions [r B, (r + 1) B) of it. So every rank's batch alone has the law of a
//   batch of B drawn from the buffer, and no trajectory is in two ranks' batches of one step.
//   Probabilities are the buffer's; importance weights are normalised over the joint draw, so all
//   ranks' weights of a step are on one scale.
//
// Whichever rank calls first for step t makes the draw, on a stream of the sampler's on the
// staging device (a replay_buffer's own device; else the current device when the sampler was
// made), ordered after that rank's stream; every rank, the first included, then copies its rows
// into its batch on its own stream (one kernel, reading the staging over peer access where the
// rank's device is another). So on the GPU a rank's copy of step t follows the step's draw, and
// with it the work the drawing rank had enqueued before its call, and the draws of all steps
// follow each other. On the host, a rank `rounds_ahead` steps ahead of the slowest waits, up to
// `wait`, for that rank to take its step (the step's staging is reused); the draw that reuses a
// staging waits for that staging's draw of rounds_ahead steps before (which every rank has
// since taken a step after); a rank whose calls come from another device than before waits once
// for its earlier copies; and the first draw, the buffer's first call from the sampler's
// stream, may synchronise the device once (replay_buffer.hpp: a second stream's first call). Keep
// the ranks' collective operations (a gradient all-reduce) after their sample calls in each step,
// and make the first step's calls before any collective: then none of these waits can wait for a
// rank that is itself waiting. With host storage, everything is done in the call.
//
// The draw sees what the calls that returned before it started left in the buffer (the buffer's
// own contract): a step's rows can include trajectories inserted after a slower rank's call of the
// step before; that does not break disjointness, which holds within each step.
//
// Memory: `rounds_ahead` staging batches of R x B rows on the staging device, made with the
// sampler; afterwards only a rank's events, made by its first call from a device.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <gear/batch.hpp>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>
#include <gear/detail/row_copy.hpp>
#include <gear/detail/shard_streams.hpp>
#include <gear/error.hpp>
#include <gear/rng.hpp>
#include <gear/strong_types.hpp>
#include <gear/window.hpp>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#if defined(GEAR_DEVICE_BACKEND)
#include <gear/detail/row_copy.cuh>
#endif

namespace gear {

/// Learner ranks that share a rank_sampler.
using rank_count = strong_int<struct rank_count_tag>;

/// How far ranks may drift apart, and how long a rank waits for the slowest.
struct rank_sampler_options {
  /// Steps the fastest rank may be ahead of the slowest before it waits (staging batches kept).
  std::int64_t rounds_ahead = 2;
  /// How long a rank that is rounds_ahead steps ahead waits before errc::timeout (at most a
  /// year).
  std::chrono::milliseconds wait{60000};
};

template <class Buffer>
class rank_sampler {
 public:
  using buffer_type = Buffer;
  using batch_type = typename Buffer::batch_type;
  static constexpr bool on_device = Buffer::on_device;

  /// R = `ranks` ranks of `rows_per_rank` rows of window `w` each per step, drawn from `buf` with
  /// `g` (every step takes two of its calls). The staging batches are made on the staging device
  /// (a replay_buffer's own; else the current device). Throws errc::invalid_argument (ranks,
  /// rows_per_rank or rounds_ahead below 1, rounds_ahead above 1024), errc::empty_window, and what
  /// making a batch throws.
  rank_sampler(Buffer& buf, gear::rank_count ranks, gear::batch_size rows_per_rank, const window& w,
               rng g, rank_sampler_options options = {})
      : buf_(&buf),
        ranks_(ranks.value),
        rows_(rows_per_rank.value),
        window_(w),
        rng_(g),
        options_(options) {
    options_.wait = std::clamp(options_.wait, std::chrono::milliseconds{0},
                               std::chrono::milliseconds{std::chrono::hours{24 * 366}});
    GEAR_REQUIRE(
        ranks_ >= 1 && rows_ >= 1 && options_.rounds_ahead >= 1 && options_.rounds_ahead <= 1024,
        errc::invalid_argument,
        "a rank_sampler needs at least 1 rank, 1 row per rank and rounds_ahead in [1, 1024], got " +
            std::to_string(ranks_) + ", " + std::to_string(rows_) + " and " +
            std::to_string(options_.rounds_ahead));
    GEAR_REQUIRE(w.length >= 1, errc::empty_window,
                 "window length must be at least 1, got " + std::to_string(w.length));
    GEAR_REQUIRE(ranks_ <= std::numeric_limits<std::int32_t>::max() / rows_, errc::invalid_argument,
                 std::to_string(ranks_) + " ranks of " + std::to_string(rows_) +
                     " rows exceed the 2^31 rows of one step");
    if constexpr (on_device) {
      if constexpr (requires { buf.device(); })
        device_ = buf.device();  // a replay_buffer samples on its own device
      else
        device_ = detail::current_device_ordinal();
    }
    const detail::device_scope scope(device_);
    if constexpr (on_device)
      GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&draw_stream_, cudaStreamNonBlocking));
    try {
      rounds_.reserve(static_cast<std::size_t>(options_.rounds_ahead));
      for (std::int64_t k = 0; k < options_.rounds_ahead; ++k) rounds_.emplace_back(*this);
      next_.assign(static_cast<std::size_t>(ranks_), 0);
      lanes_.resize(static_cast<std::size_t>(ranks_));
    } catch (...) {
      destroy();
      throw;
    }
  }
  rank_sampler(const rank_sampler&) = delete;
  rank_sampler& operator=(const rank_sampler&) = delete;
  /// Waits for the draws and the copies enqueued so far (they use the staging batches).
  ~rank_sampler() { destroy(); }

  [[nodiscard]] std::int64_t ranks() const noexcept { return ranks_; }
  [[nodiscard]] std::int64_t rows_per_rank() const noexcept { return rows_; }
  /// The device of the staging batches and the draws (-1 for host storage).
  [[nodiscard]] int staging_device() const noexcept { return device_; }
  /// The step rank `rank`'s next call takes (the steps it has taken).
  [[nodiscard]] std::uint64_t next_step(std::int64_t rank) const {
    const std::lock_guard<std::mutex> held(mutex_);
    check_rank(rank);
    return next_[static_cast<std::size_t>(rank)];
  }

  /// A batch for one rank on the current device (host memory for host storage).
  [[nodiscard]] batch_type make_batch() const {
    return batch_type(Buffer::batch_memory, gear::batch_size{rows_},
                      gear::window_length{window_.length});
  }

  /// Rank `rank`'s rows of its next step, into `out` (on the current device), stream-ordered
  /// after `stream`'s earlier work; `stream`'s later work sees them. Does not synchronise (a rank
  /// rounds_ahead steps ahead of the slowest waits on the host, see the top of this file).
  /// Throws, the rank's step not taken (its next call takes the same step) and, but for
  /// errc::cuda_error, the sampler as before the call: errc::invalid_argument (a rank outside
  /// [0, R)), errc::batch_mismatch (`out` not made for rows_per_rank rows of the window, or in
  /// the wrong memory), errc::timeout (the slowest rank did not take its step in time; the
  /// message names it), errc::wrong_memory (the rank's device cannot reach the staging device),
  /// what the buffer's sample_async throws for the joint draw, which then changes what that call
  /// would (errc::empty_buffer, errc::not_enough_items: fewer than R x B trajectories without
  /// replacement), errc::cuda_error (if the draw had been made, the step stays drawn).
  void sample_async(std::int64_t rank, batch_type& out, cuda::stream_ref stream) {
    check_rank(rank);
    detail::check_batch_memory(out);
    GEAR_REQUIRE(out.batch_size() == rows_ && out.window_length() == window_.length &&
                     out.where() == Buffer::batch_memory,
                 errc::batch_mismatch,
                 "rank " + std::to_string(rank) + "'s batch has " +
                     std::to_string(out.batch_size()) + " rows of " +
                     std::to_string(out.window_length()) + " steps; the sampler gives each rank " +
                     std::to_string(rows_) + " rows of " + std::to_string(window_.length) +
                     " (make it with make_batch())");
    std::unique_lock<std::mutex> held(mutex_);
    lane* l = nullptr;  // this rank's events (GPU): made first, what can fail before the draw
    if constexpr (on_device) l = &lane_of(rank);
    const std::uint64_t step = next_[static_cast<std::size_t>(rank)];
    const auto k = static_cast<std::size_t>(step % rounds_.size());
    round& r = rounds_[k];
    if (r.step != step) {
      const bool free =
          cv_.wait_for(held, options_.wait, [&] { return r.step == step || r.taken == ranks_; });
      GEAR_REQUIRE(free, errc::timeout,
                   "rank " + std::to_string(rank) + " waited " +
                       std::to_string(options_.wait.count()) + " ms for step " +
                       std::to_string(step) + ": rank " + std::to_string(slowest()) +
                       " has not taken step " + std::to_string(r.step) +
                       " (rounds_ahead = " + std::to_string(rounds_.size()) + ")");
      if (r.step != step) draw(r, k, step, l, stream);
    }
    take(r, k, rank, l, out, stream);
    next_[static_cast<std::size_t>(rank)] = step + 1;
    ++r.taken;
    held.unlock();
    cv_.notify_all();
  }
  /// sample_async, then synchronises the stream.
  void sample(std::int64_t rank, batch_type& out, cuda::stream_ref stream) {
    sample_async(rank, out, stream);
    if constexpr (on_device) GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  }
  void sample(std::int64_t rank, batch_type& out) requires(!on_device) {
    sample_async(rank, out, cuda::stream_ref{cudaStream_t{}});
  }

 private:
  static constexpr std::uint64_t no_step = ~std::uint64_t{0};

  /// One step's joint draw: R x B rows in staging, and the order the ranks take them in
  /// (positions [r B, (r + 1) B) of `order` are rank r's rows of staging).
  struct round {
    explicit round(const rank_sampler& s)
        : staging(Buffer::batch_memory, gear::batch_size{s.ranks_ * s.rows_},
                  gear::window_length{s.window_.length}),
          order_host(on_device ? memory_kind::pinned_host : memory_kind::host,
                     static_cast<std::size_t>(s.ranks_ * s.rows_) * sizeof(std::int32_t)),
          taken(s.ranks_) {
      if constexpr (on_device) {
        order_device = detail::allocation(memory_kind::device, order_host.size());
        drawn = detail::event::make();
      }
    }
    batch_type staging;
    detail::allocation order_host, order_device;
    detail::event drawn;           // on the staging device, after the draw and the order's copy
    std::uint64_t step = no_step;  // the step staging holds
    std::int64_t taken;            // ranks that took it (R: free for a later step)
  };
  /// A rank's events, on the device its calls came from (made again if that changes): `fork`
  /// orders a draw after the rank's stream, taken[k] follows its copy out of round k.
  struct lane {
    int device = -2;
    detail::event fork;
    std::vector<detail::event> taken;
    std::vector<bool> recorded;
  };

  void check_rank(std::int64_t rank) const {
    GEAR_REQUIRE(
        rank >= 0 && rank < ranks_, errc::invalid_argument,
        "rank " + std::to_string(rank) + " of a sampler of " + std::to_string(ranks_) + " ranks");
  }
  [[nodiscard]] std::int64_t slowest() const {
    return std::min_element(next_.begin(), next_.end()) - next_.begin();
  }

  /// The events of rank `rank` on the current device.
  lane& lane_of(std::int64_t rank) {
    lane& l = lanes_[static_cast<std::size_t>(rank)];
    const int here = detail::current_device_ordinal();
    if (l.device != here) {
      // The copies recorded on the old device's events must end before their rounds are reused.
      for (std::size_t k = 0; k < l.taken.size(); ++k)
        if (l.recorded[k]) GEAR_CUDA_TRY(cudaEventSynchronize(l.taken[k].get()));
      lane made;
      made.fork = detail::event::make();
      for (std::size_t k = 0; k < rounds_.size(); ++k) made.taken.push_back(detail::event::make());
      made.recorded.assign(rounds_.size(), false);
      if (here != device_)
        GEAR_REQUIRE(detail::enable_peer_access(here, device_), errc::wrong_memory,
                     "device " + std::to_string(here) + " cannot read the sampler's staging on " +
                         "device " + std::to_string(device_) +
                         ": no peer access (make the sampler on a device every rank reaches)");
      made.device = here;
      l = std::move(made);
    }
    return l;
  }

  /// Draws step `step` into round r = rounds_[index] (free), after the stream of the rank whose
  /// events are `l` (GPU): the buffer's joint sample into staging and the ranks' order. On
  /// failure r and the rng are as before (r still free).
  void draw(round& r, std::size_t index, std::uint64_t step, lane* l, cuda::stream_ref caller) {
    rng g = rng_;
    if constexpr (on_device) {
      GEAR_CUDA_TRY(cudaEventRecord(l->fork.get(), caller.get()));
      GEAR_CUDA_TRY(cudaStreamWaitEvent(draw_stream_, l->fork.get(), 0));
      // This round's last copies (on every rank's stream) end before the draw overwrites its
      // staging and its order on the device. Its order on the host (pinned, which a copy from
      // pageable memory would make the call wait for the draw's stream, and through it for the
      // drawing rank's stream) is rewritten once its copy of rounds_ahead steps ago has ended.
      for (lane& other : lanes_)
        if (other.device != -2 && other.recorded[index])
          GEAR_CUDA_TRY(cudaStreamWaitEvent(draw_stream_, other.taken[index].get(), 0));
      GEAR_CUDA_TRY(cudaEventSynchronize(r.drawn.get()));
      const detail::device_scope scope(device_);
      buf_->sample_async(r.staging, window_, g, cuda::stream_ref{draw_stream_});
      shuffle(r, g.next());
      GEAR_CUDA_TRY(cudaMemcpyAsync(r.order_device.data(), r.order_host.data(), r.order_host.size(),
                                    cudaMemcpyHostToDevice, draw_stream_));
      GEAR_CUDA_TRY(cudaEventRecord(r.drawn.get(), draw_stream_));
    } else {
      (void)caller, (void)index, (void)l;
      buf_->sample(r.staging, window_, g);
      shuffle(r, g.next());
    }
    rng_ = g;
    r.step = step;
    r.taken = 0;
  }

  /// A uniformly random order of the R x B rows (Fisher-Yates, one rng row per position).
  void shuffle(round& r, rng_draw d) const {
    auto* order = r.order_host.template as<std::int32_t>();
    const std::int64_t n = ranks_ * rows_;
    for (std::int64_t i = 0; i < n; ++i) order[i] = static_cast<std::int32_t>(i);
    for (std::int64_t i = n - 1; i > 0; --i)
      std::swap(
          order[i],
          order[d.below(static_cast<std::uint64_t>(i + 1), static_cast<std::uint64_t>(i), 0)]);
  }

  /// Copies rank `rank`'s rows of round r = rounds_[index] into `out` on `stream`, recording the
  /// rank's event `l` (GPU) of that round after the copy.
  void take(round& r, std::size_t index, std::int64_t rank, lane* l, batch_type& out,
            cuda::stream_ref stream) {
    const detail::row_parts parts = detail::row_parts::of(out, r.staging);
    const std::int64_t first = rank * rows_;
    if constexpr (on_device) {
#if defined(GEAR_DEVICE_BACKEND)
      GEAR_CUDA_TRY(cudaStreamWaitEvent(stream.get(), r.drawn.get(), 0));
      detail::copy_rows_on_device(parts, r.order_device.template as<std::int32_t>() + first, rows_,
                                  stream);
      GEAR_CUDA_TRY(cudaEventRecord(l->taken[index].get(), stream.get()));
      l->recorded[index] = true;
#else
      static_assert(detail::dependent_false<Buffer>,
                    "gear::rank_sampler on the GPU needs <gear/gear.cuh>, compiled by nvcc");
#endif
    } else {
      (void)stream, (void)index, (void)l;
      detail::copy_rows_on_host(parts, r.order_host.template as<std::int32_t>() + first, rows_);
    }
  }

  void destroy() noexcept {
    if (draw_stream_ == nullptr) return;
    (void)cudaStreamSynchronize(draw_stream_);
    for (lane& l : lanes_)
      for (std::size_t k = 0; k < l.taken.size(); ++k)
        if (l.recorded[k]) (void)cudaEventSynchronize(l.taken[k].get());
    (void)cudaStreamDestroy(draw_stream_);
    draw_stream_ = nullptr;
  }

  Buffer* buf_;
  std::int64_t ranks_, rows_;
  window window_;
  rng rng_;
  rank_sampler_options options_;
  int device_ = -1;
  cudaStream_t draw_stream_ = nullptr;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<round> rounds_;
  std::vector<std::uint64_t> next_;  // each rank's next step
  std::vector<lane> lanes_;
};

}  // namespace gear
