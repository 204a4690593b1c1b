#pragma once
// Landing: host trajectories bound for a GPU buffer's device memory, used by several streams.
//
// Such an insert copies its trajectories into pinned staging with the CPU (during the call, as
// every host insert does), reserves their slots (the evicted occupants leave the host view at
// once) and returns: unless it settles or starts copies (below), or must lease new staging, it
// makes no CUDA call, so it waits for no stream and no stream waits for it (taking over an open
// reservation, it waits for the device first). Its bytes are *published* later, by calls that
// settle, in two steps:
//   copy    from the pinned staging straight into the slots, by the copy engines, on the buffer's
//           own stream (publisher_), after the reads enqueued before the insert evicted the
//           slots' occupants (each insert keeps those read marks) and the last write of slot
//           bytes; started by another call, not after the reads enqueued since nor after the
//           metadata writes of a learner's settles: it overlaps a learner's gathers and takes
//           none of their multiprocessors (a settle on publisher_ itself follows every read);
//   commit  once a later settle sees that copy finished (an event query): one journal apply, on
//           the settling call's stream, brings the commit records to the mirror, with the
//           reservations' eviction records (applied at every settle).
// So a learner's sample never waits for the bytes of an insert it did not ask to see: only for
// one small journal apply. The apply is a write in stream_order's sense: it follows every read
// and write other streams enqueued before it, and later reads on other streams follow it. A
// write of slot bytes on another stream (a reservation, a direct insert) waits for the copies in
// flight (buffer_core::wait_for_landing_copies), since it may take over a slot one of them is about
// to fill.
//
// When: every call but a landing insert settles first (settle_landing), on its own stream. A
// landing insert settles on the buffer's own stream only while no sample is in flight (actors
// inserting alone), once alone_batch inserts wait for their copy, or past max_landing inserts in
// flight; while a sample is in flight it only starts the copies waiting, once the buffer's stream
// has finished the copies before (start_landing_copies: the copy engines keep busy between a
// learner's calls, in batches as large as what arrived meanwhile). A settle
//   - commits the inserts whose copy has finished;
//   - starts the copy of every insert not yet copying, in one batch (no wait);
//   - copies and commits the inserts the call must see, whatever their progress (its stream then
//     waits for their copy): a sample's own stream's, those a call names by key, or all of them.
// The evicted occupants' records go with every settle, so a call never sees a slot the host view
// has already given away. So a sample on another stream sees a host insert once a settle has
// copied it, and never waits for bytes still crossing PCIe; a sample on the insert's own stream,
// or any call naming its keys, sees it as stream order says. Host queries (size, contains) count
// landing inserts as stored; length() counts a trajectory once published. A call that settles
// and then fails (a sample finding too few trajectories, an allocation) keeps what its settle
// published: inserts that had returned already, so what it changed is when they became visible
// to sampling and length(), nothing a call has seen.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/buffer/insert_steps.hpp>
#include <optional>
#include <span>
#include <vector>

namespace gear::detail {

/// Landing inserts in flight before an insert first publishes them all (bounds the staging, up to
/// one more per thread: each checks before it lets go of the mutex to copy).
inline constexpr std::size_t max_landing = 256;
/// Landing inserts waiting for their copy before an insert starts it, while no sample is in
/// flight: one settle's query, copy batch and journal apply serve that many inserts.
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

/// Removes the landing inserts `leaves(i)` names (committed, or all of whose tickets newer
/// reservations took over); their staging is reused once its event (after the copy, for one
/// copied) has passed.
template <class Core, class Leaves>
void drop_landing(Core& b, Leaves leaves) noexcept {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < b.landing_.size(); ++i) {
    if (leaves(i)) {
      b.staging_.give_back(b.landing_[i].lease);
      continue;
    }
    if (kept != i) b.landing_[kept] = std::move(b.landing_[i]);  // not onto itself
    ++kept;
  }
  b.landing_.resize(kept);
}

/// Host-to-device copies, in one batch where the runtime has it: `dst[i]` <- `src[i]`,
/// `bytes[i]` each, on `stream`. Throws errc::cuda_error.
inline void copy_to_device(std::span<void* const> dst, std::span<const void* const> src,
                           std::span<const std::size_t> bytes, cudaStream_t stream) {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 13000  // 12.8 and 12.9 spell it otherwise
  cudaMemcpyAttributes order{};
  order.srcAccessOrder = cudaMemcpySrcAccessOrderStream;  // the source is read in stream order
  order.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  std::size_t first = 0;
  for (std::size_t at = 0; at < dst.size(); at += 1024) {
    const std::size_t n = std::min<std::size_t>(1024, dst.size() - at);
    GEAR_CUDA_TRY(cudaMemcpyBatchAsync(
        const_cast<void**>(dst.data() + at), const_cast<const void**>(src.data() + at),
        const_cast<std::size_t*>(bytes.data() + at), n, &order, &first, 1, stream));
  }
#else
  for (std::size_t i = 0; i < dst.size(); ++i)
    GEAR_CUDA_TRY(cudaMemcpyAsync(dst[i], src[i], bytes[i], cudaMemcpyHostToDevice, stream));
#endif
}

/// The host-to-device copies of the landing inserts `copy[i]` names: the bytes of their tickets
/// still pending, from the staging into the slots.
struct landing_copies {
  std::vector<void*> dst;
  std::vector<const void*> src;
  std::vector<std::size_t> bytes;
};

template <class Core>
landing_copies list_landing_copies(const Core& b, std::span<const char> copy) {
  using spec = typename Core::spec_type;
  landing_copies out;
  for (std::size_t i = 0; i < copy.size(); ++i) {
    if (!copy[i]) continue;
    const auto& l = b.landing_[i];
    std::int64_t at = 0;  // the trajectory's first step in the staging
    for (std::size_t t = 0; t < l.lengths.size(); ++t) {
      const std::uint64_t ticket = l.first_ticket + t;
      std::int64_t column_at = 0;  // column c's staging: the columns before it, each aligned
      for (std::size_t c = 0; c < Core::num_columns && b.ring_.is_pending(ticket); ++c) {
        const std::int64_t step = spec::step_bytes[c];
        out.dst.push_back(b.regions_.kernel[c].base +
                          b.ring_.slot_of(ticket) * b.regions_.kernel[c].slot_stride);
        out.src.push_back(l.lease.host + column_at + at * step);
        out.bytes.push_back(static_cast<std::size_t>(l.lengths[t] * step));
        column_at += align_up(l.steps * step, segment_alignment);
      }
      at += l.lengths[t];
    }
  }
  return out;
}

/// Makes the buffer's own stream wait for what the copies of `copy[i]` must follow: the reads
/// enqueued before their inserts evicted the slots' occupants, and the last write of slot bytes
/// (not every read since, nor the metadata writes of a learner's settles: the copies overlap the
/// gathers enqueued after). Throws errc::cuda_error before enqueueing anything that matters.
template <class Core>
void order_landing_copies(Core& b, std::span<const char> copy) {
  const cuda::stream_ref p = b.publisher();
  if (b.copied_.get() == nullptr) b.copied_ = event::make();
  b.order_.join(p.get());
  std::vector<stream_order::read_mark> reads;
  for (std::size_t i = 0; i < copy.size(); ++i)
    if (copy[i])
      for (const auto& m : b.landing_[i].reads) {
        auto same = std::find_if(reads.begin(), reads.end(),
                                 [&](const auto& r) { return r.lane == m.lane; });
        if (same == reads.end())
          reads.push_back(m);
        else
          same->count = std::max(same->count, m.count);
      }
  b.order_.wait_reads(p.get(), reads);
  b.order_.wait_last_bytes_write(p.get());
}

/// Enqueues the copies (after order_landing_copies) on the buffer's own stream, in one batch;
/// each copied insert's event, and copied_, follow them. Call it inside Core::enqueue.
template <class Core>
void enqueue_landing_copies(Core& b, const landing_copies& list, std::span<const char> copy) {
  const cudaStream_t p = b.publisher_;
  copy_to_device(list.dst, list.src, list.bytes, p);
  GEAR_CUDA_TRY(cudaEventRecord(b.copied_.get(), p));
  ++b.copy_batches_;
  for (std::size_t i = 0; i < copy.size(); ++i)
    if (copy[i]) {
      auto& l = b.landing_[i];
      GEAR_CUDA_TRY(cudaEventRecord(b.staging_.marked(l.lease), p));
      b.staging_.note_marked(l.lease);
      l.batch = b.copy_batches_;
    }
}

/// True when some landing insert of `b` has not started its copy.
template <class Core>
bool landing_waits(const Core& b) noexcept {
  return std::any_of(b.landing_.begin(), b.landing_.end(),
                     [](const auto& l) { return l.batch == 0; });
}

/// Starts the copy of every landing insert not copying yet, commits nothing: what an insert does
/// while a sample is in flight once the copies enqueued before have finished (so that the copy
/// engines do not idle until the learner's next call). Expects the mutex held. Throws
/// (errc::cuda_error) before changing anything; a failure while enqueueing makes the buffer
/// unusable.
template <class Core>
void start_landing_copies(Core& b) {
  const std::size_t n = b.landing_.size();
  std::vector<char> copy(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto& l = b.landing_[i];
    for (std::size_t t = 0; t < l.lengths.size() && l.batch == 0 && !copy[i]; ++t)
      copy[i] = b.ring_.is_pending(l.first_ticket + t);
  }
  const landing_copies list = list_landing_copies(b, copy);
  if (list.dst.empty()) return;
  order_landing_copies(b, copy);
  b.enqueue([&] { enqueue_landing_copies(b, list, copy); });
}

/// Marks the landing inserts whose copy has finished (copied). Copies run in order on one
/// stream, and the events of one batch's inserts are recorded together: one query answers for a
/// whole batch, and a finished one for every earlier batch. Throws errc::cuda_error.
template <class Core>
void note_finished_copies(Core& b) {
  std::uint64_t finished_upto = 0, unfinished_from = ~std::uint64_t{0};
  for (auto& l : b.landing_) {
    if (l.batch == 0 || l.copied) continue;
    if (l.batch <= finished_upto) {
      l.copied = true;
    } else if (unfinished_from > l.batch) {
      l.copied = b.staging_.reached(l.lease);
      (l.copied ? finished_upto : unfinished_from) = l.batch;
    }
  }
}

/// Publishes what `force` names and every landing insert whose copy has finished, starts the copy
/// of every other one, and applies the pending records of every landing reservation (see the top
/// of this file). Expects the mutex held. Throws (errc::out_of_memory, errc::cuda_error) before
/// changing anything; a failure while enqueueing makes the buffer unusable.
template <class Core>
void settle_landing(Core& b, const landing_force& force, cuda::stream_ref stream) {
  if constexpr (Core::on_device) {
#if defined(GEAR_DEVICE_BACKEND)
    if (b.landing_.empty() && b.landing_records_.empty() && b.ring_.pending_index_changes() == 0)
      return;
    refuse_capture(stream);  // before anything changes or is enqueued
    note_finished_copies(b);
    // What goes now. Commit: every insert whose copy has finished, and those the call must see
    // (whose copy it then waits for). Copy: every insert not copying yet (on the buffer's stream:
    // it costs the calling stream nothing). An insert whose tickets newer reservations all took
    // over is dropped.
    const std::size_t n = b.landing_.size();
    std::vector<char> commit(n), copy(n), alive(n);
    std::int64_t commits = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& l = b.landing_[i];
      std::int64_t pending = 0;
      for (std::size_t t = 0; t < l.lengths.size(); ++t)
        pending += b.ring_.is_pending(l.first_ticket + t);
      alive[i] = pending > 0;
      commit[i] = alive[i] && (l.copied || force(l));
      copy[i] = alive[i] && l.batch == 0;
      commits += commit[i] ? pending : 0;
    }
    const landing_copies list = list_landing_copies(b, copy);
    if (list.dst.empty() && commits == 0 && b.landing_records_.empty() &&
        b.ring_.pending_index_changes() == 0 &&
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
    // The journal's records, read on `stream`, given back after it.
    const staging_pool::lease lease = b.staging_.acquire(b.journal_bytes(records), 0);
    // The journal, on `stream`, commits only what has been copied already, or what the call must
    // see (then it waits for its copy): a sample does not wait for the copies it starts.
    try {
      b.scratch_rows_.reserve(static_cast<std::size_t>(commits));
      if (!list.dst.empty()) order_landing_copies(b, copy);
      b.order_before(stream, Core::write);
      for (std::size_t i = 0; i < n; ++i)  // copied earlier, not seen to have finished
        if (commit[i] && b.landing_[i].batch != 0 && !b.landing_[i].copied)
          GEAR_CUDA_TRY(
              cudaStreamWaitEvent(stream.get(), b.staging_.marked(b.landing_[i].lease), 0));
    } catch (...) {
      b.staging_.give_back(lease);
      throw;
    }

    b.enqueue([&] {
      auto* record = reinterpret_cast<slot_record*>(lease.host);
      for (const slot_record& r : b.landing_records_)
        if (applies(r)) *record++ = r;
      for (const auto& [first, count] : b.landing_evictions_)
        run_evict_hook(b, first, count, stream);
      // The copies, on the buffer's own stream; only what the call must see waits for them.
      if (!list.dst.empty()) {
        enqueue_landing_copies(b, list, copy);
        bool waits_for_copy = false;
        for (std::size_t i = 0; i < n; ++i)
          waits_for_copy = waits_for_copy || (copy[i] && commit[i]);
        if (waits_for_copy) GEAR_CUDA_TRY(cudaStreamWaitEvent(stream.get(), b.copied_.get(), 0));
      }
      // The commit: the ring, then one journal apply of its records with the evictions'.
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
      apply_journal_on_device(b.journal_of(lease, 0, records), stream);
      b.staging_.release_after(lease, stream.get());
      for_each_ticket_run(committed, [&](std::uint64_t first, std::int64_t count) {
        run_commit_hook(b, first, count, stream);
      });
      b.order_after(stream, Core::write, /*bytes=*/false);
      drop_landing(b, [&](std::size_t i) { return commit[i] || !alive[i]; });
      b.landing_records_.clear();
      b.landing_evictions_.clear();
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
/// insert's slots need no wait (their copies are ordered on the buffer's stream:
/// wait_for_landing_copies), nor do a bound buffer's (filled on its stream).
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
/// segment_alignment, as settle_landing reads it).
template <class Core, class Spec, std::size_t N>
void land_trajectories(Core& b, std::unique_lock<std::mutex>& held, const trajectories<Spec>& in,
                       std::span<key> keys_out, cuda::stream_ref stream, std::int64_t steps,
                       const std::array<std::int64_t, N>& staged_at, std::int64_t staged_bytes) {
  const auto count = static_cast<std::int64_t>(in.lengths.size());
  // Inserts publish only while no sample is in flight (with actors alone, say), on the buffer's
  // own stream, once alone_batch wait for their copy. With a sample in flight the learner's next
  // call publishes, on its stream, and an insert only starts the copies waiting once the buffer's
  // stream has finished those before (so the copy engines do not idle until that call). Past
  // max_landing, everything goes.
  if (b.landing_.size() >= max_landing) {
    settle_landing(b, landing_force{landing_force::kind::all}, b.publisher());
  } else if (!b.order_.reads_pending()) {
    const auto waiting = std::count_if(b.landing_.begin(), b.landing_.end(),
                                       [](const auto& l) { return l.batch == 0; });
    if (static_cast<std::size_t>(waiting) + 1 >= alone_batch)
      settle_landing(b, landing_force{}, b.publisher());
  } else if (landing_waits(b) && (b.copied_.get() == nullptr || event_reached(b.copied_.get()))) {
    start_landing_copies(b);
  }
  // The lease is this call's alone: leasing it (the staging pool has its own mutex) and the CPU
  // copy into it need no buffer mutex.
  held.unlock();
  const staging_pool::lease lease = b.staging_.acquire(static_cast<std::size_t>(staged_bytes), 0);
  const std::int64_t total[] = {steps};  // packed as given: one piece per column
  copy_host_columns(
      in, total, staged_bytes, [](std::size_t) { return true; },
      [&](std::size_t c, std::size_t) { return lease.host + staged_at[c]; });
  held.lock();
  // Everything that can fail, before the ring changes.
  typename Core::landing_insert l;
  try {
    b.check_usable();
    refuse_capture(stream);
    check_stream_handle(stream.get());
    b.order_.check_bound(stream.get());  // a device_rng sample may have bound it meanwhile
    wait_for_takeovers(b, count);        // its copies will write the slots
    b.landing_.reserve(b.landing_.size() + 1);
    b.landing_records_.reserve(b.landing_records_.size() + static_cast<std::size_t>(count));
    b.landing_evictions_.reserve(b.landing_evictions_.size() + 1);
    l = {lease,
         stream.get(),
         0,
         steps,
         std::vector<std::int64_t>(in.lengths.begin(), in.lengths.end()),
         b.order_.read_marks()};
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
  b.order_.note_unlaned_stream();  // this stream has no lane: the buffer may not bind from now
}

}  // namespace gear::detail
