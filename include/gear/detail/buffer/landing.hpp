#pragma once
// Landing: host trajectories bound for a GPU buffer's device memory, used by several streams.
//
// Such an insert copies its trajectories into pinned staging with the CPU (during the call, as
// every host insert does), enqueues their upload into the device part of that staging on its own
// stream (the copy engines; it waits for nothing another stream does), reserves their slots (the
// evicted occupants leave the host view at once) and returns. Its bytes are *published* later, by
// a call that settles: one kernel on that call's stream (landing_publish.cuh) places the uploaded
// bytes into the slots (device to device), applies the commit records with the reservations'
// eviction records, and frees the staging it read. The publish is a write in stream_order's sense:
// it follows every read and write other streams enqueued before it (the gathers that may read the
// evicted occupants included), and later reads on any stream follow it. So the slots are written
// only in stream order, and a learner's sample never waits for bytes still crossing PCIe: only
// for a placement of what has arrived already, a few microseconds of its stream.
//
// When: every call that orders itself on a stream, but a landing insert (and a writer's append),
// settles first (settle_landing), on its own stream. A settle publishes every insert whose upload
// has finished (event queries, one per insert or fewer: see note_finished_uploads) and those the
// call must see, whatever their progress (its stream then waits for their upload): a sample's own
// stream's, those a call names by key, or all of them. A landing insert settles on the buffer's own
// stream only when no sample is in flight (actors inserting alone), once alone_batch inserts have
// landed since the last settle, or past max_landing inserts in flight (then it publishes them all).
// The evicted occupants' records go with every settle, so a call never sees a slot the host view
// has already given away. So a sample on another stream sees a host insert once its upload has
// finished and a settle has published it; a sample on the insert's own stream, or any call naming
// its keys, sees it as stream order says. Host queries (size, contains) count landing inserts as
// stored; length() counts a trajectory once published. A call that settles and then fails (a sample
// finding too few trajectories, an allocation) keeps what its settle published: inserts that had
// returned already, so what it changed is when they became visible to sampling and length(),
// nothing a call has seen.
//
// Cost: staging of pinned and device memory per insert in flight, held until it is published.
// Streams: each landing insert leaves its upload queued on the caller's stream, and a settle
// takes a stream handle for the stream it named (stream_order.hpp): synchronise a stream before
// destroying it, or a new stream given the same handle may be taken for it.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/buffer/insert_steps.hpp>
#include <optional>
#include <span>
#include <thread>
#include <vector>

namespace gear::detail {

/// Landing inserts in flight before an insert publishes them all (bounds the staging, up to one
/// more per thread: each checks before it lets go of the mutex to copy).
inline constexpr std::size_t max_landing = 256;
/// Landing inserts since the last settle before an insert publishes those uploaded, while no
/// sample is in flight: one settle's queries and launch serve that many inserts.
inline constexpr std::size_t alone_batch = 16;

/// Which landing inserts a settle publishes whatever their progress.
struct landing_force {
  enum class kind { none, stream, keys, all } what = kind::none;
  cudaStream_t stream{};
  std::span<const key> keys{};

  template <class Landing>
  [[nodiscard]] bool operator()(const Landing& l) const noexcept {
    switch (what) {
      case kind::all:
        return true;
      case kind::stream:
        return l.stream == stream;
      case kind::keys:
        for (const key& k : keys)
          if (l.names(k.ticket)) return true;
        return false;
      default:
        return false;
    }
  }
};

/// True when a host insert on `stream` lands (rather than scattering on `stream` itself): the
/// buffer is GPU-resident for every column and not used from `stream` alone. A buffer bound to
/// one stream (stream_order::bind) never lands: an insert on another stream is refused when it
/// orders itself.
template <class Core>
bool lands(const Core& b, cudaStream_t stream) noexcept {
  if constexpr (!Core::on_device || !Core::all_in_device_memory) {
    (void)b, (void)stream;
    return false;
  } else {
    return !b.order_.only_lane(stream) && !b.order_.bound();
  }
}

/// Where a settle's lease (or its launch's parameters) holds what: its journal of slot records
/// (`journal` bytes: journal_bytes), then `pieces` landing pieces, then its signals
/// (landing_publish.cuh).
struct settle_layout {
  std::size_t pieces_at = 0, signals_at = 0;
  settle_layout(std::size_t journal, std::int64_t pieces)
      : pieces_at(journal),  // a multiple of sizeof(slot_record)
        signals_at(journal + static_cast<std::size_t>(pieces) * sizeof(landing_piece)) {}
  /// The bytes of the whole, with `signals` signals.
  [[nodiscard]] std::size_t bytes(std::int64_t signals) const noexcept {
    return signals_at + static_cast<std::size_t>(signals) * sizeof(staging_pool::signal);
  }
};

/// Writes to `out` the pieces of the landing inserts `commit[i]` names: each pending trajectory's
/// columns, from the device staging into the slots (num_columns per pending ticket). Returns
/// their chunks (landing_chunk bytes each, the last of a piece shorter).
template <class Core>
std::int64_t write_landing_pieces(const Core& b, std::span<const char> commit,
                                  landing_piece* out) noexcept {
  std::int64_t chunks = 0;
  for (std::size_t i = 0; i < commit.size(); ++i) {
    if (!commit[i]) continue;
    const auto& l = b.landing_[i];
    std::int64_t at = 0;  // the trajectory's first step in the staging
    for (std::size_t t = 0; t < l.lengths.size(); ++t) {
      const std::uint64_t ticket = l.first_ticket + t;
      std::int64_t column_at = 0;  // column c's staging: the columns before it, each aligned
      for (std::size_t c = 0; c < Core::num_columns && b.ring_.is_pending(ticket); ++c) {
        const std::int64_t step = Core::spec_type::step_bytes[c];
        *out++ = {
            l.lease.device + column_at + at * step,
            b.regions_.kernel[c].base + b.ring_.slot_of(ticket) * b.regions_.kernel[c].slot_stride,
            l.lengths[t] * step};
        chunks += (l.lengths[t] * step + landing_chunk - 1) / landing_chunk;
        column_at += packed_column_bytes<typename Core::spec_type>(l.steps, c);
      }
      at += l.lengths[t];
    }
  }
  return chunks;
}

/// Publishes what `force` names and every landing insert whose upload has finished, and applies
/// the pending records of every landing reservation (see the top of this file), in one launch on
/// `stream`. Expects the mutex held. Throws (errc::out_of_memory, errc::cuda_error) before
/// changing anything; a failure while enqueueing makes the buffer unusable.
template <class Core>
void settle_landing(Core& b, const landing_force& force, cuda::stream_ref stream) {
  if constexpr (Core::on_device) {
#if defined(GEAR_DEVICE_BACKEND)
    if (b.landing_.empty() && b.landing_records_.empty() && b.ring_.pending_index_changes() == 0)
      return;
    refuse_capture(stream);  // before anything changes or is enqueued
    note_finished_uploads(std::span<landing_insert>(b.landing_),
                          [&](const landing_insert& l) { return b.staging_.reached(l.lease); });
    // What goes now: every insert whose upload has finished, and those the call must see (whose
    // upload its stream then waits for). An insert whose tickets newer reservations all took over
    // is dropped.
    const std::size_t n = b.landing_.size();
    std::vector<char> commit(n), alive(n);
    std::int64_t commits = 0, inserts = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& l = b.landing_[i];
      std::int64_t pending = 0;
      for (std::size_t t = 0; t < l.lengths.size(); ++t)
        pending += b.ring_.is_pending(l.first_ticket + t);
      alive[i] = pending > 0;
      commit[i] = alive[i] && (l.uploaded || force(l));
      commits += commit[i] ? pending : 0;
      inserts += commit[i];
    }
    if (commits == 0 && b.landing_records_.empty() && b.ring_.pending_index_changes() == 0 &&
        std::find(alive.begin(), alive.end(), char{0}) == alive.end())
      return;
    // The pending records to apply: one per slot, its latest reservation's, unless that one is
    // committed now (its commit record evicts the old occupant just as well). Records of one apply
    // must name distinct slots: the journal applies them in parallel.
    auto applies = [&](const slot_record& r) {
      const std::uint64_t ticket = r.ticket();
      if (b.ring_.ticket(b.ring_.slot_of(ticket)) != ticket) return false;
      for (std::size_t i = 0; i < n; ++i) {
        const auto& l = b.landing_[i];
        if (commit[i] && l.names(ticket)) return !b.ring_.is_pending(ticket);
      }
      return true;
    };
    std::int64_t records = commits;
    for (const slot_record& r : b.landing_records_) records += applies(r);
    const std::int64_t pieces = commits * static_cast<std::int64_t>(Core::num_columns);
    // The settle's records, pieces and signals (one per lease the launch frees: the committed
    // inserts', and its own if it has one): in the launch's parameters if they fit, else in a
    // lease of its own, read by the launch on `stream`.
    const settle_layout layout(b.journal_bytes(records), pieces);
    const bool inlined = layout.bytes(inserts) <= landing_inline_bytes;
    landing_publish_inline in_launch;
    std::optional<staging_pool::lease> own;  // none when the publish travels in its parameters
    if (!inlined) own = b.staging_.acquire(layout.bytes(inserts + 1), 0);
    // Where the settle writes: its own lease, or the launch's parameters posing as one for
    // journal_of (that one never reaches the pool: only `own` is given back or freed).
    const staging_pool::lease lease =
        own ? *own : staging_pool::lease{0, 0, in_launch.data, in_launch.data, nullptr};
    try {
      b.scratch_rows_.reserve(static_cast<std::size_t>(commits));
      b.scratch_leases_.reserve(static_cast<std::size_t>(inserts) + 1);
      b.order_before(stream, Core::write);
      for (std::size_t i = 0; i < n; ++i) {  // forced, not seen uploaded: wait for the upload
        const auto& l = b.landing_[i];
        if (commit[i] && !l.uploaded && l.stream != stream.get())
          GEAR_CUDA_TRY(cudaStreamWaitEvent(stream.get(), b.staging_.marked(l.lease), 0));
      }
    } catch (...) {
      b.give_back(own);
      throw;
    }

    b.enqueue([&] {
      // The pieces first, while the tickets they name are still pending.
      const std::int64_t chunks = write_landing_pieces(
          b, commit, reinterpret_cast<landing_piece*>(lease.host + layout.pieces_at));
      auto* record = reinterpret_cast<slot_record*>(lease.host);
      for (const slot_record& r : b.landing_records_)
        if (applies(r)) *record++ = r;
      for (const auto& [first, count] : b.landing_evictions_)
        run_evict_hook(b, first, count, stream);
      // The commit: the ring, whose records the launch applies with the evictions'.
      std::vector<std::int64_t>& committed = b.scratch_rows_;  // tickets, for the commit hook
      committed.clear();
      for (std::size_t i = 0; i < n; ++i) {
        if (!commit[i]) continue;
        const auto& l = b.landing_[i];
        for (std::size_t t = 0; t < l.lengths.size(); ++t) {
          const std::uint64_t ticket = l.first_ticket + t;
          if (!b.ring_.is_pending(ticket)) continue;
          const reservation one{ticket, 1, b.capacity_, b.ring_.buffer_id()};
          b.ring_.commit(one, std::span<const std::int64_t>(&l.lengths[t], 1), record++);
          committed.push_back(static_cast<std::int64_t>(ticket));
        }
      }
      landing_publish_args args;
      args.journal = b.journal_of(lease, 0, records);
      // The leases the launch frees: each by its signal, or, without a signal word, by an event
      // after the launch. The settle's own, if it has one, goes last (landing_publish_kernel).
      auto* signal_out = reinterpret_cast<staging_pool::signal*>(lease.host + layout.signals_at);
      auto& freed = b.scratch_leases_;
      freed.clear();
      std::int64_t signals = 0;
      auto free_after = [&](const staging_pool::lease& l) {
        const staging_pool::signal s = b.staging_.signal_of(l);
        if (s.word != nullptr) signal_out[signals++] = s;
        freed.push_back({&l, s.word != nullptr});
      };
      for (std::size_t i = 0; i < n; ++i)
        if (commit[i]) free_after(b.landing_[i].lease);
      if (own) free_after(*own);  // last: the launch frees it once it has read the others
      args.pieces = reinterpret_cast<const landing_piece*>(lease.mapped + layout.pieces_at);
      args.piece_count = pieces;
      args.signals =
          reinterpret_cast<const staging_pool::signal*>(lease.mapped + layout.signals_at);
      args.signal_count = signals;
      args.arrivals = b.publish_arrivals();
      if (inlined) {
        in_launch.args = args;
        in_launch.index_at = static_cast<std::uint32_t>(
            reinterpret_cast<const std::byte*>(args.journal.index) - lease.mapped);
        in_launch.pieces_at = static_cast<std::uint32_t>(layout.pieces_at);
        in_launch.signals_at = static_cast<std::uint32_t>(layout.signals_at);
        launch_landing_publish(args, in_launch, chunks, stream);
      } else {
        launch_landing_publish(args, args, chunks, stream);
      }
      for (const auto& [l, signalled] : freed)
        signalled ? b.staging_.release_on_signal(*l) : b.staging_.release_after(*l, stream.get());
      for_each_ticket_run(committed, [&](std::uint64_t first, std::int64_t count) {
        run_commit_hook(b, first, count, stream);
      });
      b.order_after(stream, Core::write, /*bytes=*/pieces > 0);
      // Committed inserts' leases were ended above; an insert taken over whole gives its lease
      // back (reused once its upload has finished).
      std::size_t kept = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (commit[i]) continue;
        if (!alive[i]) {
          b.staging_.give_back(b.landing_[i].lease);
          continue;
        }
        if (kept != i) b.landing_[kept] = std::move(b.landing_[i]);  // not onto itself
        ++kept;
      }
      b.landing_.resize(kept);
      b.landing_records_.clear();
      b.landing_evictions_.clear();
      b.landed_since_settle_ = 0;
    });
#else
    static_assert(dependent_false<Core>,
                  "gear: GPU storage needs <gear/gear.cuh>, compiled by nvcc");
#endif
  } else {
    (void)b, (void)force, (void)stream;
  }
}

/// Before the next reservation of `count` slots takes over an open reservation (the ring came
/// round to it uncommitted), waits for the device: a buffer_ref kernel on any stream may still
/// be filling it, and neither the CPU nor a stream's copy or scatter may write under it (a kernel
/// that never ends, holding a reservation, would hold this call and the buffer too). A landing
/// insert's slots need no wait (only a settle's publish, a write in stream order, fills them),
/// nor do a bound buffer's (filled on its stream).
template <class Core>
void wait_for_takeovers(Core& b, std::int64_t count) {
  if constexpr (Core::on_device) {
    if (b.order_.bound()) return;
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t slot =
          b.ring_.slot_of(b.ring_.next_ticket() + static_cast<std::uint64_t>(i));
      if (b.ring_.state(slot) == slot_state::pending && !b.is_landing(b.ring_.ticket(slot))) {
        GEAR_CUDA_TRY(cudaDeviceSynchronize());
        return;
      }
    }
  } else {
    (void)b, (void)count;
  }
}

/// The landing insert (see the top of this file), after check_insert, with the mutex `held`.
/// `staged_at[c]` / `staged_bytes`: the packed layout of every column (each aligned to
/// segment_alignment, as write_landing_pieces reads it), the same in both parts of the staging.
template <class Core, class Spec, std::size_t N>
void land_trajectories(Core& b, std::unique_lock<std::mutex>& held, const trajectories<Spec>& in,
                       std::span<key> keys_out, cuda::stream_ref stream, std::int64_t steps,
                       const std::array<std::int64_t, N>& staged_at, std::int64_t staged_bytes) {
  const auto count = static_cast<std::int64_t>(in.lengths.size());
  // Inserts publish on the buffer's own stream only while no sample is in flight (actors alone:
  // a learner's next call publishes otherwise, on its stream), once alone_batch have landed since
  // the last settle; past max_landing, everything goes.
  if (b.landing_.size() >= max_landing)
    settle_landing(b, landing_force{landing_force::kind::all}, b.publisher());
  else if (b.landed_since_settle_ + 1 >= alone_batch && !b.order_.reads_in_flight())
    settle_landing(b, landing_force{}, b.publisher());
  // The lease is this call's alone: leasing it (the staging pool has its own mutex), the CPU
  // copy into it and the upload need no buffer mutex. The upload goes on this call's stream, and
  // the lease's event after it says when it has finished.
  held.unlock();
  check_stream_handle(stream.get());  // (insert_trajectories refused a capturing stream)
  const auto bytes = static_cast<std::size_t>(staged_bytes);
  const staging_pool::lease lease = b.staging_.acquire(bytes, bytes);
  const std::int64_t total[] = {steps};  // packed as given: one piece per column
  try {
    copy_host_columns(
        in, total, staged_bytes, [](std::size_t) { return true; },
        [&](std::size_t c, std::size_t) { return lease.host + staged_at[c]; });
  } catch (...) {
    b.staging_.give_back(lease);
    throw;
  }
  const cudaError_t uploaded =
      cudaMemcpyAsync(lease.device, lease.host, bytes, cudaMemcpyHostToDevice, stream.get());
  const cudaError_t recorded = uploaded == cudaSuccess
                                   ? cudaEventRecord(b.staging_.marked(lease), stream.get())
                                   : cudaSuccess;
  try {
    GEAR_CUDA_TRY(uploaded);
    GEAR_CUDA_TRY(recorded);
  } catch (...) {
    // A failed upload enqueued nothing; an upload with no event waits for the device.
    if (uploaded == cudaSuccess)
      b.staging_.give_back_unsafe(lease);
    else
      b.staging_.give_back(lease);
    throw;
  }
  b.staging_.note_marked(lease);  // given back from here, the lease waits for the upload
  held.lock();
  // Everything that can fail, before the ring changes.
  typename Core::landing_insert l;
  try {
    b.check_usable();
    b.order_.check_bound(stream.get());  // a device_rng sample may have bound it meanwhile
    wait_for_takeovers(b, count);
    b.landing_.reserve(b.landing_.size() + 1);
    b.landing_records_.reserve(b.landing_records_.size() + static_cast<std::size_t>(count));
    b.landing_evictions_.reserve(b.landing_evictions_.size() + 1);
    l = {lease,
         stream.get(),
         std::this_thread::get_id(),
         0,
         steps,
         std::vector<std::int64_t>(in.lengths.begin(), in.lengths.end())};
  } catch (...) {
    b.staging_.give_back(lease);
    throw;
  }
  // Change: nothing below throws.
  const std::size_t at = b.landing_records_.size();
  b.landing_records_.resize(at + static_cast<std::size_t>(count));
  const reservation r = b.reserve_in_ring(count, b.landing_records_.data() + at);
  l.first_ticket = r.first_ticket;
  for (std::int64_t i = 0; i < count; ++i)
    keys_out[static_cast<std::size_t>(i)] =
        b.key_of(r.first_ticket + static_cast<std::uint64_t>(i));
  b.landing_evictions_.emplace_back(r.first_ticket, count);
  b.landing_.push_back(std::move(l));
  ++b.landed_since_settle_;
  b.order_.note_unlaned_stream();  // this stream has no lane: the buffer may not bind from now
}

}  // namespace gear::detail
