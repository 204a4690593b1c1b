#pragma once
// gear::sharded_buffer: one logical buffer over several local shards, each a replay_buffer of its
// own on its own GPU (or several on one), with the sharding laws of the remote transport
// (detail/remote/split.hpp):
//
//   insert     routed whole to one shard: on the caller's current device by default (round robin
//              among those), else round robin over all; keys name their shard and this buffer.
//   sample     the batch's B rows are split across the shards by a snapshot of their selection
//              masses (Multinomial(B, M_s / M) with replacement; multivariate hypergeometric on
//              their sizes without); every shard selects its share on its own GPU, on a stream of
//              its own, and gathers it straight into its rows of the caller's batch (rows come
//              grouped by shard). Probabilities are global, P_i = (M_s / M) * (p_i / M'_s) (M'_s
//              the shard's mass when it selected: exact for any snapshot), and importance weights
//              follow the local formula over the union. The snapshot: sizes for uniform (the
//              host's own count, always current); for prioritized, each shard's root as its last
//              sample left it (read back without waiting; the first sample reads it at once).
//   update, erase  routed to the shard each key names; every key checked first (bad input
//              changes nothing). Exponents: set_exponents sets every shard's.
//
// Selection: select::uniform and select::prioritized (whose union law the split reproduces).
// Threads: any call from any thread at once; samples are enqueued one at a time.
//
// A shard on another device than the caller's stream: its work is ordered after the caller's
// stream (an event) and the caller's stream after it. A batch is on the caller's device, which
// the shards' gathers write over peer access, enabled by the first sample that needs it; one
// whose devices cannot reach each other is refused (errc::wrong_memory) before anything runs.

#include <array>
#include <atomic>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <gear/batch.hpp>
#include <gear/detail/batch_slice.hpp>
#include <gear/detail/claim.hpp>
#include <gear/detail/remote/split.hpp>
#include <gear/detail/shard_routing.hpp>
#include <gear/detail/shard_snapshot.hpp>
#include <gear/detail/shard_streams.hpp>
#include <gear/replay_buffer.hpp>
#include <gear/select/prioritized.hpp>
#include <gear/select/uniform.hpp>
#include <gear/transport/concept.hpp>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace gear {

/// Where sharded_buffer::insert sends a call's trajectories.
enum class insert_route {
  device_first,  ///< a shard on the caller's current device (round robin), else round robin
  round_robin,   ///< every shard in turn
};

template <trajectory_spec Spec, class Storage = storage::host, class Selection = select::uniform>
class sharded_buffer {
  static_assert(std::same_as<Selection, select::uniform> ||
                    std::same_as<Selection, select::prioritized>,
                "gear::sharded_buffer: the split across shards reproduces select::uniform and "
                "select::prioritized over the union; other policies are not sharded");
  static constexpr bool prioritized = std::same_as<Selection, select::prioritized>;

 public:
  using shard_type = replay_buffer<Spec, Storage, Selection, transport::shard_view>;
  using batch_type = batch<Spec>;
  static constexpr bool on_device = shard_type::on_device;
  static constexpr memory_kind batch_memory = shard_type::batch_memory;
  /// The most shards one buffer has.
  static constexpr std::size_t max_shards = detail::max_local_shards;

  /// One shard of `per_shard` slots of up to `length` steps per entry of `devices`, made on that
  /// device (repeat a device for several shards on it; storage::host counts the entries only),
  /// its slots from `memory` (memory_resource.hpp). Shard s issues keys with key.shard == s.
  /// Throws errc::invalid_argument (no devices, over max_shards, no such device), as replay_buffer.
  sharded_buffer(std::span<const int> devices, gear::capacity per_shard, gear::max_length length,
                 Selection selection = {}, insert_route route = insert_route::device_first,
                 const memory_resources& memory = {})
      : selection_(selection), route_(route) {
    GEAR_REQUIRE(!devices.empty() && devices.size() <= max_shards, errc::invalid_argument,
                 "a sharded buffer takes 1 to " + std::to_string(max_shards) + " shards, got " +
                     std::to_string(devices.size()));
    const std::uint32_t incarnation = detail::next_local_incarnation();  // every shard's keys
    for (std::size_t s = 0; s < devices.size(); ++s) {
      const int device = on_device ? devices[s] : -1;
      if constexpr (on_device) detail::check_device_ordinal(device);
      const detail::device_scope scope(device);
      shards_.push_back(std::make_unique<shard_type>(
          per_shard, length, selection,
          transport::shard_view{{static_cast<std::uint32_t>(s), incarnation},
                                static_cast<std::uint32_t>(devices.size())}, memory));
      devices_.push_back(device);
    }
    streams_ = detail::shard_streams(devices_, on_device);
    snapshot_.assign(shards_.size(), {0, 0, true});
  }
  sharded_buffer(std::initializer_list<int> devices, gear::capacity per_shard,
                 gear::max_length length, Selection selection = {},
                 insert_route route = insert_route::device_first,
                 const memory_resources& memory = {})
      : sharded_buffer(std::span<const int>(devices.begin(), devices.size()), per_shard, length,
                       selection, route, memory) {}

  sharded_buffer(const sharded_buffer&) = delete;
  sharded_buffer& operator=(const sharded_buffer&) = delete;
  /// Waits for the shards' streams first (their selections use this buffer's workspaces).
  ~sharded_buffer() { streams_.synchronize_all_noexcept(); }

  // ---- queries -------------------------------------------------------------------------------

  [[nodiscard]] std::size_t shard_count() const noexcept { return shards_.size(); }
  /// Shard s (every call of a replay_buffer; its keys name s; its updates from device memory
  /// skip the keys of the other shards).
  [[nodiscard]] shard_type& shard(std::size_t s) { return *shards_.at(s); }
  [[nodiscard]] const shard_type& shard(std::size_t s) const { return *shards_.at(s); }
  /// The device shard s lives on (-1 for storage::host).
  [[nodiscard]] int device(std::size_t s) const { return devices_.at(s); }
  /// Trajectories of all shards together (each as replay_buffer::size counts them).
  [[nodiscard]] std::int64_t size() const noexcept {
    std::int64_t n = 0;
    for (const auto& s : shards_) n += s->size();
    return n;
  }
  [[nodiscard]] bool contains(const key& k) const noexcept {
    return k.shard < shards_.size() && shards_[k.shard]->contains(k);
  }

  /// replay_buffer::reserve_staging on every shard, with the same limits.
  void reserve_staging(const call_limits& limits) {
    for (auto& s : shards_) s->reserve_staging(limits);
  }

  // ---- insert --------------------------------------------------------------------------------

  /// Inserts the call's trajectories into one shard (insert_route) and writes their keys: as
  /// replay_buffer::insert_async, whose errors it throws (the shards unchanged).
  void insert_async(const trajectories<Spec>& in, std::span<key> keys_out,
                    cuda::stream_ref stream) {
    streams_.refuse_capture(stream);
    const std::size_t s = route_insert();
    const auto guard = host_tree_guard();
    streams_.run(s, stream,
                 [&](cuda::stream_ref on) { shards_[s]->insert_async(in, keys_out, on); });
  }
  void insert(const trajectories<Spec>& in, std::span<key> keys_out, cuda::stream_ref stream) {
    insert_async(in, keys_out, stream);
    streams_.synchronize(stream);
  }
  void insert(const trajectories<Spec>& in, std::span<key> keys_out) requires(!on_device) {
    insert_async(in, keys_out, detail::no_stream());
  }

  // ---- sample --------------------------------------------------------------------------------

  /// A batch of `rows` x `length` steps on the current device (host memory for storage::host).
  [[nodiscard]] batch_type make_batch(gear::batch_size rows, gear::window_length length) const {
    return batch_type(batch_memory, rows, length);
  }

  /// Samples out.batch_size() rows of window `w` from the union of the shards (see the top of
  /// this file), consuming one draw of g. Stream-ordered after `stream`'s earlier work; `stream`'s
  /// later work sees the batch. Does not synchronise (sample does) unless it reads every root
  /// (prioritized GPU shards: the first sample, one after a failure), grows the workspaces, or a
  /// prioritized shard under set_max_times_sampled reads back its rows.
  /// Throws (g unchanged; the batch's contents unspecified): errc::empty_buffer (no shard holds a
  /// trajectory, or, prioritized, none has a positive priority mass in the snapshot: a union
  /// whose priorities are all 0 is not sampled, unlike one buffer, which then draws uniformly;
  /// also a shard emptied since the snapshot, after which the next sample reads every mass
  /// again), errc::not_enough_items (without replacement, fewer in the union than rows),
  /// errc::invalid_argument (prioritized shards whose exponents differ: see set_exponents), and
  /// what replay_buffer::sample_async throws. A shard's removals after k returns
  /// (shard(s).set_max_times_sampled) stand when a later shard's share fails.
  void sample_async(batch_type& out, const window& w, rng& g, cuda::stream_ref stream) {
    streams_.refuse_capture(stream);
    detail::check_batch_memory(out);
    const std::lock_guard<std::mutex> held(streams_.mutex());
    rng advanced = g;
    const rng_draw draw = advanced.next();
    const std::int64_t rows = out.batch_size();
    const double beta = detail::beta_of(detail::common_selection(selection_, shards_));
    try {
      detail::take_shard_snapshot<prioritized, on_device>(shards_, devices_, streams_, snapshot_,
                                                          fresh_, stream);
      fresh_ = true;
      if (detail::draws_without_replacement(selection_))
        share_ = detail::remote::split_without_replacement(snapshot_, rows, draw);
      else
        detail::remote::split_with_replacement(snapshot_, rows, draw, share_, upto_);
    } catch (...) {
      fresh_ = false;  // every mass read again next time (a shard may hold mass the snapshot lost)
      throw;
    }
    if constexpr (on_device) {  // the batch is on the caller's device: every shard must reach it
      const int here = detail::current_device_ordinal();
      for (std::size_t s = 0; s < shards_.size(); ++s)
        if (share_[s] > 0) streams_.reach(devices_[s], here);
    }
    if (workspaces_.size() != shards_.size() ||
        workspaces_[0].size() < detail::claim_table_size(rows))
      grow_workspaces(rows);
    parts_ = {};
    const double total_mass = detail::remote::live_mass(snapshot_);
    std::int64_t first = 0;
    streams_.fork(stream);
    bool open = false;  // a shard started and not finished
    try {
      for (std::size_t s = 0; s < shards_.size(); first += share_[s], ++s) {
        // Every shard, with rows or not, reads its mass back for the next snapshot.
        streams_.start(s);
        open = true;
        if (share_[s] > 0) {
          detail::batch_slice<Spec> slice(out, first, share_[s], workspaces_[s]);
          rng shard_rng{detail::remote::share_seed(draw.seed, draw.call * max_shards + s)};
          shards_[s]->sample_async(slice, w, shard_rng, streams_.of(s));
          parts_.add(first, share_[s], snapshot_[s].mass / total_mass);
        }
        read_mass(s);
        streams_.finish(s);
        open = false;
      }
    } catch (...) {
      // What a shard enqueued into `out` (the failing one's too) precedes the caller's next work.
      try {
        if (open) streams_.finish_any();
        streams_.join(stream);
      } catch (...) {  // a broken context: the buffer that failed is unusable already
      }
      fresh_ = false;  // a shard found empty: ask every shard again next time
      throw;
    }
    streams_.join(stream);
    detail::make_global<on_device>(out.probabilities_data(), out.weights_data(), parts_, beta,
                                   stream);
    g = advanced;
  }
  /// sample_async, then synchronises the stream.
  void sample(batch_type& out, const window& w, rng& g, cuda::stream_ref stream) {
    sample_async(out, w, g, stream);
    streams_.synchronize(stream);
  }
  void sample(batch_type& out, const window& w, rng& g) requires(!on_device) {
    sample_async(out, w, g, detail::no_stream());
  }

  // ---- priorities and erase ------------------------------------------------------------------

  /// Sets alpha and beta on every shard (as select::prioritized's state does), all or none: if a
  /// shard refuses the alpha (a stored p^alpha out of range) or fails, those before it are set
  /// back. Samples and updates use the shards' exponents, which must agree (else they throw
  /// errc::invalid_argument). Call it while no other thread uses the buffer. Throws
  /// errc::invalid_argument, errc::cuda_error.
  void set_exponents(double alpha, double beta, cuda::stream_ref stream) requires prioritized {
    std::vector<Selection> was;  // each shard's own (they may differ: this call mends that)
    for (const auto& sh : shards_) was.push_back(sh->selection_state().policy());
    const auto set = [&](std::size_t s, double a, double b) {
      streams_.run(s, stream, [&](cuda::stream_ref on) {
        const detail::device_scope scope(devices_[s]);
        shards_[s]->selection_state().set_exponents(a, b, on);
      });
    };
    for (std::size_t s = 0; s < shards_.size(); ++s) try {
        set(s, alpha, beta);
      } catch (...) {
        for (std::size_t r = 0; r < s; ++r) set(r, was[r].alpha, was[r].beta);
        throw;
      }
    const std::lock_guard<std::mutex> held(streams_.mutex());
    fresh_ = false;  // the masses read back so far weigh the old alpha
  }

  /// Sets the priorities of `keys` (host spans) at the shards they name: stale keys are skipped
  /// and counted, as by replay_buffer::update_priorities_async. Every key's shard and every
  /// priority (as a shard checks it, with the shards' alpha now) are checked before any shard is
  /// asked. Throws (changing nothing) an earlier failed update from device memory (see below),
  /// errc::invalid_argument (sizes differ; shards whose exponents differ), errc::key_out_of_range
  /// (a shard this buffer does not have, or another incarnation of one), errc::invalid_priority;
  /// errc::out_of_memory, errc::cuda_error (shards asked before it keep their updates).
  priority_update_result update_priorities_async(std::span<const key> keys,
                                                 std::span<const float> priorities,
                                                 cuda::stream_ref stream) requires prioritized {
    streams_.refuse_capture(stream);
    (void)detail::validate_priorities(keys, priorities,
                                      detail::common_selection(selection_, shards_).alpha,
                                      shards_[0]->capacity());
    const detail::routed_keys by_shard = detail::route_keys(shards_.size(), keys, priorities);
    detail::check_owners(by_shard, [&](std::size_t s) { return shards_[s]->core().owner_; });
    const auto guard = host_tree_guard();
    std::unique_lock<std::mutex> updates;
    if constexpr (on_device) {  // every shard's failed updates from device memory before any
      updates = std::unique_lock<std::mutex>(updates_);
      raise_update_failures();
    }
    priority_update_result total;
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      if (by_shard.keys[s].empty()) continue;
      streams_.run(s, stream, [&](cuda::stream_ref on) {
        const detail::device_scope scope(devices_[s]);
        const priority_update_result r = detail::update_from_host(
            shards_[s]->core(), by_shard.keys[s], by_shard.priorities[s], on,
            /*raise_earlier=*/false);
        total.applied += r.applied;
        total.stale += r.stale;
      });
    }
    return total;
  }
  priority_update_result update_priorities(std::span<const key> keys,
                                           std::span<const float> priorities,
                                           cuda::stream_ref stream) requires prioritized {
    const priority_update_result r = update_priorities_async(keys, priorities, stream);
    streams_.synchronize(stream);
    return r;
  }
  priority_update_result update_priorities(std::span<const key> keys,
                                           std::span<const float> priorities) requires prioritized
      &&(!on_device) {
    return update_priorities_async(keys, priorities, detail::no_stream());
  }

  /// Sets priorities from `source` memory. memory_kind::host is the call above (its counts are
  /// dropped). memory_kind::device (GPU shards): `keys` and `priorities` in memory every shard's
  /// device reads (device memory, with peer access from the shards' devices, enabled here;
  /// managed; pinned), read in stream order by every shard's update kernels, each applying the
  /// pairs whose key names it and skipping the others'; keep them valid and unchanged until the
  /// update has run. No copy, no synchronisation, one update per shard. Checked on the GPU by
  /// every shard alike: a stale key is skipped and counted by its shard (stale_pairs); a key of a
  /// shard this buffer does not have, or a bad priority, fails the update in every shard, which
  /// then changes nothing; check_priority_updates raises it.
  /// Throws at once (changing nothing): an earlier failed update from device memory, once every
  /// update from device memory enqueued before has finished on the GPU (every shard's record of
  /// it raised as one error; this call then does nothing), errc::invalid_argument (shards whose
  /// exponents differ), errc::null_pointer, errc::misaligned_pointer, errc::wrong_memory (memory a
  /// shard cannot read; host storage); errc::cuda_error (shards asked before it keep their
  /// updates).
  void update_priorities_async(std::span<const key> keys, std::span<const float> priorities,
                               memory_kind source, cuda::stream_ref stream) requires prioritized {
    if (source == memory_kind::host) {
      (void)update_priorities_async(keys, priorities, stream);
      return;
    }
    GEAR_REQUIRE(source == memory_kind::device, errc::wrong_memory,
                 "update_priorities source must be memory_kind::host or ::device");
    GEAR_REQUIRE(on_device, errc::wrong_memory,
                 "host shards take priorities from host memory only: use memory_kind::host");
    streams_.refuse_capture(stream);
    (void)detail::common_selection(selection_, shards_);  // every shard checks with one alpha
    const std::lock_guard<std::mutex> held(updates_);
    raise_update_failures();
    GEAR_REQUIRE(keys.size() == priorities.size(), errc::invalid_argument,
                 "update_priorities needs one priority per key: " + std::to_string(keys.size()) +
                     " keys, " + std::to_string(priorities.size()) + " priorities");
    if (keys.empty()) return;
    streams_.reach_pointer(keys.data());
    streams_.reach_pointer(priorities.data());
    try {
      for (std::size_t s = 0; s < shards_.size(); ++s)
        streams_.run(s, stream, [&](cuda::stream_ref on) {
          const detail::device_scope scope(devices_[s]);
          detail::update_from_device(shards_[s]->core(), keys, priorities, on,
                                     /*raise_earlier=*/false);
        });
    } catch (...) {
      in_flight_.note(stream);  // the shards asked so far
      throw;
    }
    in_flight_.note(stream);
  }
  /// update_priorities_async from `source`, synchronous; from device memory it runs
  /// check_priority_updates before and after, so it throws only when this call changed nothing.
  void update_priorities(std::span<const key> keys, std::span<const float> priorities,
                         memory_kind source, cuda::stream_ref stream) requires prioritized {
    detail::update_synchronously(*this, keys, priorities, source, stream);
  }
  /// Synchronises the stream, then throws the earliest failed update from device memory not yet
  /// raised (every shard's record of it as one error).
  void check_priority_updates(cuda::stream_ref stream) requires prioritized {
    streams_.synchronize(stream);
    const std::lock_guard<std::mutex> held(updates_);
    raise_update_failures(/*wait=*/true);
  }
  /// Pairs the shards skipped as stale on the GPU so far: keys of updates from device memory, and
  /// of host-span updates that went stale before their update ran (synchronises).
  [[nodiscard]] std::uint64_t stale_pairs(cuda::stream_ref stream) requires prioritized
      && on_device {
    streams_.synchronize(stream);
    std::uint64_t n = 0;
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      const detail::device_scope scope(devices_[s]);
      n += shards_[s]->selection_state().stale_pairs(streams_.of(s));
    }
    return n;
  }

  /// Removes the trajectories `keys` from the shards they name. Every key is checked first (its
  /// shard, that the shard holds it, that it is named once), so bad input removes nothing; the
  /// shards named stay locked from the check to the removal, so no other thread's call (an insert
  /// that evicts, an erase) comes between. Throws errc::key_out_of_range, errc::stale_key,
  /// errc::cuda_error (a shard made unusable before); then, shards asked before it keeping their
  /// removals, errc::out_of_memory, errc::cuda_error, std::bad_alloc.
  void erase_async(std::span<const key> keys, cuda::stream_ref stream) {
    streams_.refuse_capture(stream);
    detail::routed_keys by_shard = detail::route_keys(shards_.size(), keys);
    detail::check_owners(by_shard, [&](std::size_t s) { return shards_[s]->core().owner_; });
    // The streams' mutex, then the shards' in order: the order every call takes them in.
    const std::lock_guard<std::mutex> turn(streams_.mutex());
    std::vector<std::unique_lock<std::mutex>> held;
    for (std::size_t s = 0; s < shards_.size(); ++s)
      if (!by_shard.keys[s].empty()) {
        held.push_back(shards_[s]->core().lock());
        const detail::device_scope scope(devices_[s]);
        shards_[s]->core().check_usable();  // a broken shard refuses before any shard removes
      }
    detail::check_erase(by_shard, [&](std::size_t s, const key& k) {
      return shards_[s]->core().contains(k);
    });
    for (std::size_t s = 0; s < shards_.size(); ++s)
      if (!by_shard.keys[s].empty())
        streams_.run_held(s, stream, [&](cuda::stream_ref on) {
          const detail::device_scope scope(devices_[s]);
          detail::erase_held_keys(shards_[s]->core(), by_shard.keys[s], on);
        });
  }
  void erase(std::span<const key> keys, cuda::stream_ref stream) {
    erase_async(keys, stream);
    streams_.synchronize(stream);
  }
  void erase(std::span<const key> keys) requires(!on_device) {
    erase_async(keys, detail::no_stream());
  }

 private:
  /// Raises the failed updates from device memory every shard has seen arrive (under updates_).
  /// The shards of one failed update record it each when their own kernels end, so nothing is
  /// taken while an update is still running (wait: wait for them all).
  void raise_update_failures(bool wait = false) {
    if constexpr (on_device) {
      if (!in_flight_.finished(wait)) return;
      detail::raise_first_of(shards_.size(), [&](std::size_t s) {
        const auto held = shards_[s]->core().lock();
        shards_[s]->selection_state().raise_update_failures();
      });
    }
  }

  std::size_t route_insert() {
    const std::size_t turn = next_.fetch_add(1, std::memory_order_relaxed);
    const bool local = on_device && route_ == insert_route::device_first;
    return detail::route_insert(turn, devices_, local ? detail::current_device_ordinal() : -1);
  }

  /// Host trees (storage::host, prioritized): sharded calls that change a shard's tree and a
  /// sample take turns, so that no such call comes between the sample's snapshot and its shares.
  [[nodiscard]] std::unique_lock<std::mutex> host_tree_guard() {
    if constexpr (prioritized && !on_device)
      return std::unique_lock<std::mutex>(streams_.mutex());
    else
      return {};
  }

  /// Reads shard s's root back after its sample, for the next snapshot (prioritized, GPU).
  void read_mass(std::size_t s) {
    if constexpr (prioritized && on_device) {
      const detail::device_scope scope(devices_[s]);
      streams_.read_back(s, shards_[s]->selection_state().root_data());
    }
  }

  /// Each shard's selection workspace, for shares of up to `rows` rows.
  void grow_workspaces(std::int64_t rows) {
    std::vector<detail::selection_workspace> grown;
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      const detail::device_scope scope(devices_[s]);
      grown.emplace_back(batch_memory, rows);
    }
    streams_.synchronize_all();  // the old ones may still be in use by a shard's selection
    workspaces_ = std::move(grown);
  }

  Selection selection_;
  insert_route route_;
  std::vector<std::unique_ptr<shard_type>> shards_;
  std::vector<int> devices_;
  detail::shard_streams streams_;
  std::atomic<std::size_t> next_{0};
  std::mutex updates_;  // updates from device memory and their failures, one call at a time
  detail::updates_in_flight in_flight_;  // under updates_
  // Sampling (under streams_.mutex()): the snapshot, the split, each shard's selection workspace
  // (on its device), and the rows each shard wrote with its factor M_s / M.
  std::vector<detail::remote::shard_share> snapshot_;
  bool fresh_ = false;
  std::vector<std::int64_t> share_;
  std::vector<double> upto_;
  std::vector<detail::selection_workspace> workspaces_;  // one per shard, on its device
  detail::shard_parts parts_;
};

}  // namespace gear
