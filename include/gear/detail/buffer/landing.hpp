#pragma once
// Landing: host trajectories bound for a GPU buffer's device memory, used by several streams.
//
// Such an insert copies its trajectories into pinned staging with the CPU (during the call, as
// every host insert does), enqueues their copy into the staging's device part on the caller's
// stream, reserves their slots (the evicted occupants leave the host view at once) and returns.
// Nothing it enqueues touches a slot or the mirror, so it waits for no other stream and no other
// stream waits for it. Its bytes are *published* later, by calls that settle, in two steps:
//   scatter  from the device staging into the slots, on the buffer's own stream (publisher_),
//            after the reads enqueued before the insert evicted the slots' occupants (each insert
//            keeps those read marks), not after the reads enqueued since: it overlaps a learner's
//            gathers;
//   commit   once a later settle sees that scatter finished (an event query): one journal apply,
//            on the settling call's stream, brings the commit records to the mirror, with the
//            reservations' eviction records (applied at every settle).
// So a learner's sample never waits for a scatter or a copy of an insert it did not ask to see:
// only for one small journal apply. The apply is a write in stream_order's sense: it follows
// every read and write other streams enqueued before it, and later reads on other streams follow
// it. A write of slot bytes on another stream (a reservation, a direct insert) waits for the
// scatters in flight (buffer_core::wait_for_scatters), since it may take over a slot one of them
// is about to fill.
//
// When: every call but a landing insert settles first (settle_landing), on its own stream; a
// landing insert settles on the buffer's own stream, and only while no sample is in flight
// (actors inserting alone) or past max_landing inserts in flight. A settle
//   - commits the inserts whose scatter has finished;
//   - scatters the inserts whose copies have finished (an event query, no wait);
//   - scatters and commits the inserts the call must see whatever their progress (its stream
//     then waits for their copy and scatter): a sample's own stream's, those a call names by
//     key, or all of them.
// The evicted occupants' records go with every settle, so a call never sees a slot the host view
// has already given away. So a sample on another stream sees a host insert once its bytes are
// in its slots, and never waits for bytes still crossing PCIe; a sample on the insert's own
// stream, or any call naming its keys, sees it as stream order says. Host queries (size,
// contains) count landing inserts as stored.

#include <algorithm>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/buffer/insert_steps.hpp>
#include <gear/detail/scatter.hpp>
#include <optional>
#include <span>

namespace gear::detail {

/// Landing inserts in flight before an insert first publishes them all (bounds the staging).
inline constexpr std::size_t max_landing = 256;

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
/// buffer is GPU-resident for every column and not used from `stream` alone.
template <class Core>
bool lands(const Core& b, cudaStream_t stream) noexcept {
  if constexpr (!Core::on_device || !Core::all_in_device_memory) {
    (void)b, (void)stream;
    return false;
  } else {
    return !b.order_.only_lane(stream);
  }
}

/// Publishes what `force` names and every landing insert whose copy has finished, and applies the
/// pending records of every landing reservation (see the top of this file). Expects the mutex
/// held. Throws (errc::out_of_memory, errc::cuda_error) before changing anything; a failure while
/// enqueueing makes the buffer unusable.
template <class Core>
void settle_landing(Core& b, const landing_force& force, cuda::stream_ref stream) {
  if constexpr (Core::on_device) {
#if defined(GEAR_DEVICE_BACKEND)
    if (b.landing_.empty() && b.landing_records_.empty() && b.ring_.pending_index_changes() == 0)
      return;
    // Where each insert is: its copy finished (landed); its scatter enqueued on the buffer's own
    // stream, after which its lease's event was recorded again (scattering); that scatter
    // finished (scattered). A stream's copies finish in its order: past its first one still in
    // flight, none is asked.
    std::vector<cudaStream_t> in_flight;
    for (auto& l : b.landing_) {
      if (l.scattering) {
        if (!l.scattered) l.scattered = b.staging_.reached(l.lease);
      } else if (!l.landed &&
                 std::find(in_flight.begin(), in_flight.end(), l.stream) == in_flight.end()) {
        l.landed = b.staging_.reached(l.lease);
        if (!l.landed) in_flight.push_back(l.stream);
      }
    }
    // What goes now. Commit: every insert whose scatter has finished, and those the call must see
    // (whose scatter it then waits for). Scatter: those, and every landed one (a scatter runs on
    // the buffer's stream: it costs the calling stream nothing). An insert whose tickets newer
    // reservations all took over is dropped.
    const std::size_t n = b.landing_.size();
    std::vector<char> commit(n), scatter(n), alive(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& l = b.landing_[i];
      for (std::size_t t = 0; t < l.lengths.size() && !alive[i]; ++t)
        alive[i] = b.ring_.is_pending(l.first_ticket + t);
      commit[i] = alive[i] && (l.scattered || force(l));
      scatter[i] = alive[i] && !l.scattering && (commit[i] || l.landed);
    }
    std::int64_t rows = 0, commits = 0;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t t = 0; t < b.landing_[i].lengths.size(); ++t) {
        const bool pending = b.ring_.is_pending(b.landing_[i].first_ticket + t);
        rows += scatter[i] && pending;
        commits += commit[i] && pending;
      }
    if (rows == 0 && commits == 0 && b.landing_records_.empty() &&
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
    // Two leases: the scatter's rows (read on the buffer's stream) and the journal's records (read
    // on `stream`), each given back after the stream that reads it.
    const staging_pool::lease lease = b.staging_.acquire(b.journal_bytes(records), 0);
    std::optional<staging_pool::lease> rows_lease;
    try {
      if (rows > 0)
        rows_lease = b.staging_.acquire(static_cast<std::size_t>(rows) * sizeof(scatter_row), 0);
    } catch (...) {
      b.staging_.give_back(lease);
      throw;
    }
    // The scatter runs on the buffer's own stream after the copies it reads, the writes of the
    // slots' earlier occupants and the reads enqueued before the inserts evicted them (not every
    // read since: it overlaps the gathers enqueued after). The journal, on `stream`, commits only
    // what has been scattered already, or what the call must see (then it waits for its scatter):
    // a sample does not wait for the scatters it starts.
    try {
      b.scratch_rows_.reserve(static_cast<std::size_t>(commits));
      if (rows > 0) {
        const cuda::stream_ref p = b.publisher();
        if (b.scattered_.get() == nullptr) b.scattered_ = event::make();
        b.order_.join(p.get());
        std::vector<stream_order::read_mark> reads;
        for (std::size_t i = 0; i < n; ++i)
          if (scatter[i])
            for (const auto& m : b.landing_[i].reads) {
              auto same = std::find_if(reads.begin(), reads.end(),
                                       [&](const auto& r) { return r.lane == m.lane; });
              if (same == reads.end())
                reads.push_back(m);
              else
                same->count = std::max(same->count, m.count);
            }
        b.order_.wait_reads(p.get(), reads);
        b.order_.wait_last_write(p.get());
        for (std::size_t i = 0; i < n; ++i)
          if (scatter[i] && !b.landing_[i].landed)
            GEAR_CUDA_TRY(cudaStreamWaitEvent(p.get(), b.staging_.marked(b.landing_[i].lease), 0));
      }
      b.order_before(stream, Core::write);
      for (std::size_t i = 0; i < n; ++i)  // scattered earlier, not seen to have finished
        if (commit[i] && b.landing_[i].scattering && !b.landing_[i].scattered)
          GEAR_CUDA_TRY(
              cudaStreamWaitEvent(stream.get(), b.staging_.marked(b.landing_[i].lease), 0));
    } catch (...) {
      b.staging_.give_back(lease);
      if (rows_lease) b.staging_.give_back(*rows_lease);
      throw;
    }

    b.enqueue([&] {
      auto* record = reinterpret_cast<slot_record*>(lease.host);
      for (const slot_record& r : b.landing_records_)
        if (applies(r)) *record++ = r;
      for (const auto& [first, count] : b.landing_evictions_)
        run_evict_hook(b, first, count, stream);
      // The scatter, on the buffer's own stream; each scattered insert's event follows it.
      bool waits_for_scatter = false;
      if (rows > 0) {
        const cuda::stream_ref p{b.publisher_};
        auto* row = reinterpret_cast<scatter_row*>(rows_lease->host);
        for (std::size_t i = 0; i < n; ++i) {
          if (!scatter[i]) continue;
          const auto& l = b.landing_[i];
          std::int64_t at = 0;
          for (std::size_t t = 0; t < l.lengths.size(); ++t) {
            const std::uint64_t ticket = l.first_ticket + t;
            if (b.ring_.is_pending(ticket))
              *row++ = {b.ring_.slot_of(ticket), at, l.lengths[t], ticket, l.lease.device, l.steps};
            at += l.lengths[t];
          }
        }
        scatter_args args;
        args.count = rows;
        args.rows = reinterpret_cast<const scatter_row*>(rows_lease->mapped);
        for (std::size_t c = 0; c < Core::num_columns; ++c)
          args.columns[args.num_columns++] = {nullptr, b.regions_.kernel[c].base,
                                              b.regions_.kernel[c].slot_stride,
                                              b.regions_.kernel[c].step_bytes};
        scatter_in_groups(args, reinterpret_cast<const scatter_row*>(rows_lease->host), p);
        b.staging_.release_after(*rows_lease, p.get());
        GEAR_CUDA_TRY(cudaEventRecord(b.scattered_.get(), p.get()));
        for (std::size_t i = 0; i < n; ++i)
          if (scatter[i]) {
            GEAR_CUDA_TRY(cudaEventRecord(b.staging_.marked(b.landing_[i].lease), p.get()));
            b.landing_[i].scattering = true;
            waits_for_scatter = waits_for_scatter || commit[i];
          }
      }
      // Only what the call must see waits for the scatter just started.
      if (waits_for_scatter)
        GEAR_CUDA_TRY(cudaStreamWaitEvent(stream.get(), b.scattered_.get(), 0));
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
      b.apply_journal(lease, 0, records, stream);
      b.staging_.release_after(lease, stream.get());
      for (std::size_t i = 0; i < committed.size();) {  // the hook takes runs of tickets
        std::size_t end = i + 1;
        while (end < committed.size() && committed[end] == committed[end - 1] + 1) ++end;
        run_commit_hook(b, static_cast<std::uint64_t>(committed[i]),
                        static_cast<std::int64_t>(end - i), stream);
        i = end;
      }
      b.order_after(stream, Core::write);
      // Committed and dropped inserts leave; their staging is reused once its event (after the
      // scatter, or the copy for one never scattered) has passed.
      std::size_t kept = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (commit[i] || !alive[i]) {
          b.staging_.give_back(b.landing_[i].lease);
          continue;
        }
        if (kept != i) b.landing_[kept] = std::move(b.landing_[i]);  // not onto itself
        ++kept;
      }
      b.landing_.resize(kept);
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

/// The landing insert (see the top of this file), after check_insert, with the mutex `held`.
/// `staged_at[c]` / `staged_bytes`: the packed layout of every column, as staged_column_offset
/// computes it.
template <class Core, class Spec, std::size_t N>
void land_trajectories(Core& b, std::unique_lock<std::mutex>& held, const trajectories<Spec>& in,
                       std::span<key> keys_out, cuda::stream_ref stream, std::int64_t steps,
                       const std::array<std::int64_t, N>& staged_at, std::int64_t staged_bytes) {
  const auto count = static_cast<std::int64_t>(in.lengths.size());
  // Inserts publish only while no sample is in flight (with actors alone, say): on the buffer's
  // own stream, so that no actor's stream waits for another's copies. With a sample in flight
  // the learner's next call publishes, on its stream. Past max_landing, everything goes.
  if (b.landing_.size() >= max_landing)
    settle_landing(b, landing_force{landing_force::kind::all}, b.publisher());
  else if (!b.order_.reads_pending())
    settle_landing(b, landing_force{}, b.publisher());
  const auto bytes = static_cast<std::size_t>(staged_bytes);
  const staging_pool::lease lease = b.staging_.acquire(bytes, bytes);
  const cudaEvent_t landed = b.staging_.marked(lease);  // the lease's own: stable while leased
  held.unlock();
  // The lease is this call's alone: the CPU copy into it and its copy to the device, on the
  // caller's stream, need no mutex.
  const std::int64_t total[] = {steps};  // packed as given: one piece per column
  copy_host_columns(
      in, total, staged_bytes, [](std::size_t) { return true; },
      [&](std::size_t c, std::size_t) { return lease.host + staged_at[c]; });
  bool enqueued = false;
  try {
    GEAR_CUDA_TRY(
        cudaMemcpyAsync(lease.device, lease.host, bytes, cudaMemcpyHostToDevice, stream.get()));
    enqueued = true;
    GEAR_CUDA_TRY(cudaEventRecord(landed, stream.get()));
  } catch (...) {
    held.lock();
    if (enqueued)
      b.staging_.give_back_unsafe(lease);  // the copy may still run
    else
      b.staging_.give_back(lease);
    throw;
  }
  held.lock();
  b.staging_.note_marked(lease);  // the event recorded above follows the copy
  // Everything that can fail, before the ring changes.
  typename Core::landing_insert l;
  try {
    b.check_usable();
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
}

}  // namespace gear::detail
