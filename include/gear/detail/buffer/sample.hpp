#pragma once
// Sampling (replay_buffer::sample_async): checks, selection and the fused gather, and removal of
// trajectories that reached their number of returns (max_times_sampled, consuming policies).
// The rng advances only once everything that can fail before the launches has passed.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cuda/stream_ref>
#include <functional>
#include <gear/batch.hpp>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/buffer/slots.hpp>
#include <gear/detail/gather.hpp>
#include <gear/device_rng.hpp>
#include <gear/rng.hpp>
#include <gear/window.hpp>
#include <string>

namespace gear::detail {

/// Returns before removal: the policy's own (a consuming policy such as fifo returns each item
/// once) or the user's max_times_sampled; 0 for no limit.
template <class Core>
std::int64_t consume_limit(const Core& b) noexcept {
  if constexpr (consuming_policy<typename Core::selection_type>) return 1;
  return b.max_times_sampled_;
}

/// replay_buffer::set_max_times_sampled.
template <class Core>
void set_return_limit(Core& b, std::int64_t k) {
  GEAR_REQUIRE(k >= 0, errc::invalid_argument,
               "max_times_sampled must be >= 0, got " + std::to_string(k));
  const auto held = b.lock();
  GEAR_REQUIRE(k == 0 || !b.order_.bound(), errc::invalid_argument,
               "max_times_sampled cannot be set on a buffer bound to one stream (sampled with a "
               "gear::device_rng, whose replays would remove nothing, or updated from device "
               "memory in a CUDA graph)");
  if (k > 0 && b.times_sampled_.empty())
    b.times_sampled_.assign(static_cast<std::size_t>(b.capacity_), 0);
  b.max_times_sampled_ = k;
}

/// Throws unless the window and the batch suit the buffer (what does not depend on its contents).
template <class Core, class Batch>
void check_sample_arguments(const Core& b, const Batch& out, const window& w) {
  check_batch_memory(out);
  check_window(w, b.max_length_);
  GEAR_REQUIRE(out.window_length() == w.length, errc::batch_mismatch,
               "batch was made for windows of " + std::to_string(out.window_length()) +
                   " steps, the window has " + std::to_string(w.length));
  GEAR_REQUIRE(out.where() == (Core::on_device ? memory_kind::device : memory_kind::host),
               errc::batch_mismatch,
               "batch lives in the wrong memory for this buffer; make it with make_batch()");
}

/// Throws unless a batch can be drawn now: a committed trajectory, and what the policy needs.
template <class Core>
void check_contents(const Core& b, std::int64_t batch) {
  GEAR_REQUIRE(b.ring_.live() > 0, errc::empty_buffer, "no committed trajectory to sample from");
  b.selection_->validate(b.table(), batch);
}

/// The trajectories that the rows of a sample (`slots`, host memory) take to their limit of
/// returns, as runs of distinct tickets: a consuming policy's own runs of the rows it chose
/// (gear::host_chosen_runs), else b.removal_runs_. Under a limit above 1 the committed rows are
/// counted in b.times_sampled_ as they are read (their slots listed in b.drawn_slots_, for
/// unplan_returns to take back should the removal fail); nothing else changes. Throws
/// std::bad_alloc before anything changes.
template <class Core>
std::span<const ticket_run> plan_returns(Core& b, const std::int64_t* slots, std::int64_t rows) {
  using state = typename Core::state_type;
  std::vector<std::int64_t>& drawn = b.drawn_slots_;
  drawn.clear();
  if constexpr (consuming_policy<typename Core::selection_type> && host_chosen_runs<state>) {
    // Every row returned is removed: none stays to count. The runs are taken only if they hold
    // as many tickets as there are rows, the first row's among them at an end of the first run
    // (a state whose select did not choose through them has none, or stale ones).
    const std::span<const ticket_run> runs = b.selection_->chosen_runs();
    std::int64_t held = 0;
    for (std::int64_t row = 0; row < rows; ++row) held += slots[row] >= 0;
    if (!runs.empty() && held == tickets_in(runs) && slots[0] >= 0) {
      const std::uint64_t first = b.ring_.ticket(slots[0]);
      const ticket_run& r = runs.front();
      if (first == r.first || first == r.first + static_cast<std::uint64_t>(r.count) - 1)
        return runs;
    }
  }
  {
    const std::int64_t limit = consume_limit(b);
    std::vector<ticket_run>& runs = b.removal_runs_;
    runs.clear();
    runs.reserve(static_cast<std::size_t>(rows));  // may throw: before anything is counted
    if (limit > 1) drawn.reserve(static_cast<std::size_t>(rows));
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t slot = slots[row];
      if (slot < 0 || b.ring_.state(slot) != slot_state::committed) continue;
      if (limit > 1) {  // counted now; a slot drawn again past its limit is pushed again
        drawn.push_back(slot);
        if (++b.times_sampled_[static_cast<std::size_t>(slot)] < limit) continue;
      }
      runs.push_back({b.ring_.ticket(slot), 1});
    }
    // Sorted, distinct, and consecutive tickets merged into runs (in place: a run is written
    // only at or before the one read).
    std::sort(runs.begin(), runs.end(), [](const ticket_run& x, const ticket_run& y) {
      return x.first < y.first;
    });
    std::size_t n = 0;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const std::uint64_t ticket = runs[i].first;
      if (n > 0) {
        ticket_run& last = runs[n - 1];
        const std::uint64_t end = last.first + static_cast<std::uint64_t>(last.count);
        if (ticket < end) continue;  // drawn twice
        if (ticket == end) {
          ++last.count;
          continue;
        }
      }
      runs[n++] = {ticket, 1};
    }
    runs.resize(n);
    return runs;
  }
}

/// Takes back the returns plan_returns counted, when their removal failed (before the ring
/// changed, leaving the buffer as it was; or after, which made it unusable).
template <class Core>
void unplan_returns(Core& b) noexcept {
  for (const std::int64_t slot : b.drawn_slots_) --b.times_sampled_[static_cast<std::size_t>(slot)];
  b.drawn_slots_.clear();
}

/// Tells a consuming policy's state that the rows it chose last were all removed (the removal of
/// a sample's rows has just changed the ring): gear::consumed_hook.
template <class Core>
void note_consumed(Core& b) noexcept {
  if constexpr (consuming_policy<typename Core::selection_type> &&
                consumed_hook<typename Core::state_type>) {
    static_assert(noexcept(b.selection_->on_consumed()),
                  "gear::consumed_hook: on_consumed() must be noexcept (the buffer calls it once "
                  "the removal has changed the ring, where nothing may fail any more)");
    b.selection_->on_consumed();
  }
}

/// Counts the rows of a finished sample (`slots` in host memory) and removes the trajectories
/// that reached the limit, with the records lease `removal` (room for every row) acquired before
/// the sample. The counts stay changed only once the removal is enqueued.
template <class Core>
void count_returns(Core& b, const std::int64_t* slots, std::int64_t rows, cuda::stream_ref stream,
                   const std::optional<staging_pool::lease>& removal) {
  const std::span<const ticket_run> runs = plan_returns(b, slots, rows);
  try {
    remove_runs(b, runs, stream, removal);
  } catch (...) {
    unplan_returns(b);
    throw;
  }
  note_consumed(b);
}

/// Throws unless a sample with a gear::device_rng may run (see replay_buffer::sample_async).
template <class Core>
void check_device_draws(const Core& b, const device_rng& g, cuda::stream_ref stream) {
  static_assert(Core::on_device, "gear::device_rng draws samples on the GPU: use gear::rng");
  static_assert(device_counted<typename Core::state_type>,
                "gear::device_rng: this selection policy computes its draws on the host (it "
                "does not declare reads_device_counts), so a replayed CUDA graph would draw "
                "the same rows every time; sample it with gear::rng (select::uniform and "
                "select::prioritized sample with a device_rng)");
  static_assert(!consuming_policy<typename Core::selection_type>,
                "gear::device_rng: a consuming policy (select::fifo, lifo) removes what it "
                "returns, on the host; sample it with gear::rng");
  GEAR_REQUIRE(b.max_times_sampled_ == 0, errc::invalid_argument,
               "a buffer with max_times_sampled set removes what it returns, on the host: "
               "sample it with gear::rng, not a gear::device_rng");
  g.check_use(b.device_, stream.get());
  b.order_.check_bind(stream.get());
}

#if defined(GEAR_DEVICE_BACKEND)
/// The selection and gather of a sample whose rows the host knows before the gather, which
/// removes what it returns or counts returns: once the rows are known (chosen on the host by
/// fifo or lifo, or `rows`, the host's draw of them: gear::host_row_mirroring; those the GPU
/// reads are staged in `removal` after the room for its records, where sample_into points
/// `request`), the removal changes the ring and
/// its records are applied to the mirror by the gather's last block to read its row's metadata
/// (one launch where a separate apply took two), which then signals that the lease is free (no
/// event, no query). The call is a write as well as a read. A failure from the policy's eviction
/// hook on makes the buffer unusable; `removal` is handed on once enqueued.
template <class Core>
void remove_in_gather(Core& b, const slot_table& table, selection_request request,
                      const gather_args& args, std::optional<staging_pool::lease>& removal,
                      cuda::stream_ref stream, const std::int64_t* rows) {
  b.order_before(stream, Core::write, /*capturable=*/true);  // a capture was refused: sample_into
  bool changed = false;
  const staging_pool::signal done = b.staging_.signal_of(*removal);
  try {
    select_and_gather_on_device(*b.selection_, table, request, args, stream, [&] {
      if constexpr (host_chosen_rows<typename Core::state_type>)
        rows = b.selection_->host_rows().data();
      const std::span<const ticket_run> runs = plan_returns(b, rows, request.batch);
      const std::int64_t n = tickets_in(runs);
      changed = true;  // from the policy's eviction hook on (it may change its state)
      remove_in_ring(b, runs, b.records_of(removal), stream);
      note_consumed(b);
      return journal_epilogue{b.journal_of(*removal, 0, n), request.arrivals, done};
    });
    // The gather's last block signals when it reads the records and the rows no more.
    const staging_pool::lease handed = *removal;
    removal.reset();
    if (done.word != nullptr)
      b.staging_.release_on_signal(handed);
    else
      b.staging_.release_after(handed, stream.get());
    b.order_after(stream, Core::write, /*bytes=*/false);
    b.order_after(stream, Core::read);
  } catch (const std::exception& e) {
    if (changed) b.failure_ = e.what();
    // A kernel enqueued before the failure (a select launch ahead of the gather) may read the
    // rows in the lease: it is reused only after a device-wide wait.
    if (removal) b.staging_.give_back_unsafe(*removal);
    removal.reset();
    throw;
  }
}
#endif

/// sample_async with `g`: a gear::rng (draw numbers from the host, advanced when the call
/// succeeds) or a gear::device_rng (draw numbers in device memory, read and advanced by the
/// kernels; the buffer is bound to the stream).
template <class Core, class Batch, class Draws>
void sample_into(Core& b, Batch& out, const window& w, Draws& g, cuda::stream_ref stream) {
  constexpr bool device_draws = std::same_as<Draws, device_rng>;
  const auto held = b.lock();
  if constexpr (device_draws)
    b.check_usable();  // may be captured into a CUDA graph
  else
    b.check_usable(stream);  // its draws would be frozen into a graph: refused in a capture
  check_sample_arguments(b, out, w);  // before anything is published
  if constexpr (device_draws) check_device_draws(b, g, stream);
  // Landing inserts (landing.hpp): this stream's own, and those already on the device, are
  // published; if the rest are needed for the sample to be valid at all (an empty buffer, too few
  // trajectories for a batch without replacement), they are published too. (A buffer that may
  // bind to this stream has none: it has known one stream only.)
  if constexpr (!device_draws)
    settle_landing(b, landing_force{landing_force::kind::stream, stream.get()}, stream);
  if (!b.landing_.empty()) {
    try {
      check_contents(b, out.batch_size());
    } catch (const error& e) {
      if (e.code() == errc::empty_buffer || e.code() == errc::not_enough_items)
        settle_landing(b, landing_force{landing_force::kind::all}, stream);
    }
  }
  check_contents(b, out.batch_size());
  const slot_table table = b.table();
  const bool consumes = consume_limit(b) > 0;
  if (consumes && b.times_sampled_.empty())
    b.times_sampled_.assign(static_cast<std::size_t>(b.capacity_), 0);
  // `rows`: pinned memory for the sample's rows, read back from the GPU.
  std::optional<staging_pool::lease> rows, removal;
  // Rows chosen on the GPU are counted from the host's own draw of them where the policy makes
  // one (gear::host_row_mirroring: uniform, recency), which the GPU draws again (uniform with
  // replacement) or takes from staging (stages_mirror); else they are read back (this
  // synchronises). Rows chosen on the host (fifo, lifo) are counted from the host's copy. A
  // mirror is counted in the gather's launch (remove_in_gather, which needs the batch's arrivals
  // word); rows staged for the gather follow the removal's records in its lease.
  constexpr bool rows_on_host = host_chosen_rows<typename Core::state_type>;
  bool mirrored = false, staged = false;
  if constexpr (host_row_mirroring<typename Core::state_type>) {
    mirrored = consumes && out.workspace().arrivals() != nullptr && b.selection_->mirrors();
    staged = !rows_on_host && mirrored && b.selection_->stages_mirror();
  }
  const auto rows_bytes = static_cast<std::size_t>(out.batch_size()) * sizeof(std::int64_t);
  if (consumes)
    removal = b.lease_records(out.batch_size(), rows_on_host || staged ? rows_bytes : 0);
  if constexpr (Core::on_device && !rows_on_host)
    if (consumes && !mirrored) {
      try {
        rows = b.staging_.acquire(rows_bytes, 0);
      } catch (...) {
        b.give_back(removal);
        throw;
      }
    }

  rng advanced(0);
  selection_request request;
  request.batch = out.batch_size();
  if constexpr (device_draws) {
    request.draw = {g.seed(), 0};
    request.call_at = &g.counter()->call;
  } else {
    advanced = g;
    request.draw = advanced.next();
  }
  request.slots = out.slots_data();
  request.probabilities = out.probabilities_data();
  request.weights = out.weights_data();
  out.workspace().lend_to(request);
  gather_args args;
  args.num_columns = static_cast<int>(Core::num_columns);
  for (std::size_t c = 0; c < Core::num_columns; ++c)
    args.columns[c] = {b.regions_.kernel[c].base, b.regions_.kernel[c].slot_stride,
                       b.regions_.kernel[c].step_bytes, out.column_data(c)};
  args.batch = out.batch_size();
  args.win = w;
  args.draw = request.draw;
  args.slots = out.slots_data();
  args.lengths = table.lengths;
  args.tickets = table.tickets;
  args.shard = b.owner_.shard;
  args.incarnation = b.owner_.incarnation;
  args.mask = out.mask_data();
  args.keys = out.keys_data();
  const std::int64_t* slots = out.slots_data();
  // Rows chosen or drawn on the host are known before the gather: a sample that removes what it
  // returns, or counts its returns, then removes in the gather's launch (remove_in_gather).
  const bool removes_in_gather =
      Core::on_device && (rows_on_host || mirrored) && consumes && request.arrivals;
  if (removes_in_gather && (rows_on_host || staged)) {  // the rows the GPU reads, staged
    const std::size_t at = b.journal_bytes(request.batch);
    request.chosen_rows_host = reinterpret_cast<std::int64_t*>(removal->host + at);
    request.chosen_rows_device = reinterpret_cast<const std::int64_t*>(removal->mapped + at);
  }
  if constexpr (Core::on_device) {
#if defined(GEAR_DEVICE_BACKEND)
    try {
      if constexpr (host_row_mirroring<typename Core::state_type>)
        if (mirrored) {  // before anything is enqueued: it may allocate
          const std::span<const std::int64_t> drawn =
              b.selection_->mirror_rows(b.host_table(), request);
          slots = drawn.data();
          if (staged) std::copy(drawn.begin(), drawn.end(), request.chosen_rows_host);
        }
      slot_table drawn_from = table;
      if constexpr (device_draws) {
        drawn_from.live_at = b.mirror().live;
        args.counter = g.counter();
      }
      if (removes_in_gather) {
        remove_in_gather(b, drawn_from, request, args, removal, stream, slots);
      } else {
        // capturable: with a gear::rng, check_usable(stream) refused a capture above (one
        // driver query a call).
        b.order_before(stream, Core::read, /*capturable=*/true, /*binding=*/device_draws);
        select_and_gather_on_device(*b.selection_, drawn_from, request, args, stream,
                                    [] { return no_epilogue{}; });
        // The gather is enqueued: a write on another stream must wait for its read event, so a
        // failure to record it makes the buffer unusable rather than leaving it unordered.
        b.enqueue([&] { b.order_after(stream, Core::read, /*bytes=*/true, device_draws); });
      }
      if constexpr (rows_on_host) slots = b.selection_->host_rows().data();
      if constexpr (device_draws) {  // once nothing can be refused (checked: neither throws)
        b.order_.bind(stream.get());
        g.bind(stream.get());
      }
      if (rows) {  // read back
        const auto bytes = static_cast<std::size_t>(out.batch_size()) * 8;
        GEAR_CUDA_TRY(cudaMemcpyAsync(rows->host, out.slots_data(), bytes,
                                      cudaMemcpyDeviceToHost, stream.get()));
        b.synchronize(stream);
        slots = reinterpret_cast<const std::int64_t*>(rows->host);
      }
    } catch (...) {
      // The read-back copy, or a kernel reading the staged rows, may have been enqueued: the
      // entry waits for the device before reuse.
      if (rows) b.staging_.give_back_unsafe(*rows);
      b.give_back(removal);
      throw;
    }
#else
    static_assert(dependent_false<Core>,
                  "gear: GPU storage needs <gear/gear.cuh>, compiled by nvcc");
#endif
  } else {
    b.selection_->select(table, request, stream);
    gather_on_host(args);
  }
  if (consumes && !removes_in_gather) {
    try {
      count_returns(b, slots, out.batch_size(), stream, removal);
    } catch (...) {
      if (rows) b.staging_.give_back(*rows);
      b.give_back(removal);  // a no-op if the removal already handed it on
      throw;
    }
    // Read by the CPU after a synchronisation: free at once.
    if (rows) b.staging_.give_back(*rows);
  }
  ++b.calls_.samples;
  b.calls_.rows_sampled += static_cast<std::uint64_t>(out.batch_size());
  if constexpr (!device_draws) g = advanced;
}

}  // namespace gear::detail
