#pragma once
// gear::replay_buffer: the owning container of trajectories.
//
//   gear::replay_buffer<Spec, Storage, Selection, Transport>, all four chosen at compile time:
//   Spec, what a trajectory holds (gear::spec<gear::column<...>...>); Storage, where its bytes
//   live; Selection, which trajectories a batch takes; Transport, where the shards are.
//
// Slots form a ring: the n-th reservation ever made takes ticket n and slot n % capacity, so when
// the buffer is full the oldest trajectory is evicted first. A slot is empty, pending (reserved,
// being written) or committed (visible to sampling). Keys carry the 64-bit ticket: a key to an
// evicted or removed trajectory is stale forever, never confused with the slot's new occupant,
// and each buffer's keys carry an incarnation of its own: one buffer refuses another's keys.
//
// Selection and gathering run on the CPU for storage::host (<gear/gear.hpp>, no GPU needed), on
// the GPU otherwise (<gear/gear.cuh>, compiled by nvcc).
//
// ---- The contract: streams, what a call sees, what it waits for ------------------------------
//
// Every call that touches GPU memory takes a cuda::stream_ref last. Plain names (insert, sample,
// commit, erase, update_priorities) synchronise that stream before returning; _async names do not.
//
//   Host state is current when a call returns: size(), contains(), tickets_issued() report every
//   call that returned (contains(k) once insert_async returns, bytes in flight); length() a
//   trajectory's once it is committed (a landing insert's once a later call publishes it).
//
//   Device work is stream-ordered: every _async call acts as if it ran at its place in its
//   stream's order. Its metadata changes are slot records snapshotted during the call and applied
//   by a kernel in stream order (detail/buffer/mirror.hpp), so nothing a later call changes
//   reaches work enqueued earlier. A sample enqueued after commit_async(X) and before an insert
//   that evicts X returns X; a sample enqueued before erase_async(X) can return X.
//
//   A trajectory becomes visible to sampling only after all of its bytes are stored: its commit
//   records are applied after its scatter (a landing insert's placement, below), in stream order.
//
//   Memory a call reads: host memory (pageable or pinned: insert data, writer steps, priorities)
//   is copied during the call, reusable when it returns; device memory is read in stream order.
//
//   Waits: an _async call never waits for its stream, except (1) an insert of host data into
//   pinned_host or mixed storage waits on the host for the gathers that may read the slots it
//   evicts and the writes in flight to them (bound, below: for the stream), and an insert or
//   reserve taking over an open reservation waits for the device (a kernel may still fill it);
//   (2) a sample under set_max_times_sampled with prioritized rows reads them back (fifo, lifo,
//   uniform and recency know theirs on the host before the launch); (3) staging is reused
//   once the work that read it finished (512 entries; 4 areas for queue rows, 4 for host-span
//   priorities): a call waits only when that many are in flight, or for the device when a
//   host-span priority update outgrows its device copy (freeing the old one).
//
//   Threads and streams: any number of threads may call one buffer at once, each on its own
//   stream (or sharing streams), with no lock or event of the caller's. The buffer serialises its
//   host calls with a mutex and orders their GPU work with events (detail/buffer/stream_order.hpp):
//   a sample waits for the writes (commits, removals, priority updates, inserts) that other
//   streams enqueued before it, and a write waits for the samples and writes other streams
//   enqueued before it. So a trajectory is never visible before its bytes are stored, and no
//   slot is overwritten while a gather that may read it runs. One stream waits for nothing
//   (pinned_host / mixed record events, for (1)); a second stream's first call syncs the device.
//
//   Host inserts that land: once a buffer whose columns are all in device memory has been used
//   from a second stream, a host insert uploads its data to device staging on the caller's
//   stream, waiting for no other, and a later call publishes it once uploaded (one kernel places
//   the bytes after the gathers of the evicted slots, and commits: detail/buffer/landing.hpp). A
//   sample sees the inserts uploaded before it, its own stream's, and, rather than find too few,
//   all of them; erase and host-span updates publish the keys they name; size() counts them;
//   priority updates from device memory see them as stale.
//   selection_state() is not synchronised: change its settings while no other thread uses it.
//
// CUDA graphs: sample_async with a gear::device_rng (select::uniform, select::prioritized) and
// update_priorities_async from device memory can be captured and replayed; each replay does what
// the next eager call would, on the buffer as it is then (device_rng.hpp), with the capture's
// batch, window and policy settings; a buffer emptied since gives rows of slot -1, mask 0. Such a
// call binds the buffer to its stream (replays wait for no event): a later call on another
// stream, or any other call on a capturing stream, throws errc::invalid_argument, changes nothing.
//
// Errors: every call checks its input, then acquires what it needs (staging, allocations), and
// only then changes anything: a gear::error thrown before that leaves the buffer as it was. If
// enqueueing GPU work fails after that (in practice, a broken CUDA context), the buffer records
// the failure and every later call throws it (errc::cuda_error) rather than return wrong rows.
//
// Lifetime: the buffer keeps its state behind a pointer, so moving it keeps writers valid. Writers
// and refs must not outlive the buffer; synchronise its streams before destroying it.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cuda/stream_ref>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#define GEAR_REPLAY_BUFFER_INCLUDED 1
#include <gear/batch.hpp>
#include <gear/buffer_stats.hpp>
#include <gear/call_limits.hpp>
#include <gear/detail/batch_slice.hpp>
#include <gear/detail/buffer/call_limits.hpp>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/buffer/insert_pipeline.hpp>
#include <gear/detail/buffer/priorities.hpp>
#include <gear/detail/buffer/sample.hpp>
#include <gear/detail/buffer/slots.hpp>
#include <gear/device_rng.hpp>
#include <gear/error.hpp>
#include <gear/insert.hpp>
#include <gear/key.hpp>
#include <gear/memory_resource.hpp>
#include <gear/priority_update.hpp>
#include <gear/ref.hpp>
#include <gear/rng.hpp>
#include <gear/select/concept.hpp>
#include <gear/select/uniform.hpp>
#include <gear/spec.hpp>
#include <gear/storage/concept.hpp>
#include <gear/storage/host.hpp>
#include <gear/strong_types.hpp>
#include <gear/transport/concept.hpp>
#include <gear/transport/local.hpp>
#include <gear/window.hpp>
#include <gear/writer.hpp>

namespace gear {

template <trajectory_spec Spec, class Storage = storage::host, class Selection = select::uniform,
          transport_policy Transport = transport::local>
class replay_buffer {
  static constexpr std::size_t num_columns = Spec::num_columns;
  static_assert(storage_policy_for<Storage, num_columns>,
                "gear::replay_buffer: Storage must be gear::storage::host, pinned_host, device, "
                "mixed<one per column> (storage::none: include <gear/distributed.hpp>)");
  static_assert(detail::placement_consistent(Storage::template placement<num_columns>()),
                "gear::replay_buffer: storage::host columns cannot be mixed with GPU-read columns; "
                "use storage::pinned_host for host-resident columns");
  using core_type = detail::buffer_core<Spec, Storage, Selection, Transport>;

 public:
  using spec_type = Spec;
  using storage_type = Storage;
  using selection_type = Selection;
  using transport_type = Transport;
  using batch_type = batch<Spec>;
  using writer_type = writer<core_type>;
  /// The selection policy's state (selection_state()).
  using state_type = typename core_type::state_type;

  /// True when selection and gathering run on the GPU (every storage but storage::host).
  static constexpr bool on_device = core_type::on_device;
  using space = typename core_type::space;
  /// Memory that batches, metadata views and refs of this buffer live in.
  static constexpr memory_kind batch_memory = on_device ? memory_kind::device : memory_kind::host;

  static_assert(selection_policy_for<Selection, space>,
                "gear::replay_buffer: Selection does not provide state<exec::host> / "
                "state<exec::device> with validate() and select() (see gear/select/concept.hpp); "
                "for GPU storage include <gear/gear.cuh> and compile with nvcc");

  /// Allocates `slots` empty slots of `length` steps each (layout.hpp) on the current device,
  /// which the buffer keeps using whatever device is current at later calls, from `memory`'s
  /// resources where given (memory_resource.hpp). Throws errc::invalid_argument (capacity or
  /// max_length below 1, more than 2^40 slots), errc::no_device (GPU storage without a GPU),
  /// errc::out_of_memory, errc::wrong_memory and errc::misaligned_pointer (memory from a
  /// resource that does not fit: memory_resource.hpp), errc::cuda_error.
  replay_buffer(gear::capacity slots, gear::max_length length, Selection selection = {},
                Transport transport = {}, const memory_resources& memory = {}) {
    detail::check_buffer_shape(slots.value, length.value);
    core_ = std::make_unique<core_type>(slots.value, length.value, selection,
                                        std::move(transport), memory);
  }

  /// Writers and refs stay valid across a move; a call on the one moved from (but make_batch,
  /// which reads none of its state): invalid_argument.
  replay_buffer(replay_buffer&&) noexcept = default;
  replay_buffer& operator=(replay_buffer&&) noexcept = default;
  replay_buffer(const replay_buffer&) = delete;
  replay_buffer& operator=(const replay_buffer&) = delete;

  /// Allocates now the staging that calls up to `limits` lease (gear/call_limits.hpp): they then
  /// allocate nothing during the run. May wait for work that reads staging it replaces. Throws
  /// errc::invalid_argument (naming the limit), out_of_memory, cuda_error; std::bad_alloc.
  void reserve_staging(const call_limits& limits) {
    const detail::device_scope scope(core().device_);
    detail::reserve_call_staging(core(), limits);
  }

  // ---- queries (host state as of the last call that returned; never synchronise) -------------

  [[nodiscard]] std::int64_t capacity() const { return core().capacity_; }
  [[nodiscard]] std::int64_t max_length() const { return core().max_length_; }
  /// Stored trajectories: the committed ones, the ones sampling can return, and host inserts
  /// still on their way to device memory (see "Threads and streams" above).
  [[nodiscard]] std::int64_t size() const {
    const auto held = core().lock();
    return core().ring_.live() + core().landing_count();
  }
  [[nodiscard]] bool empty() const { return size() == 0; }
  /// Sizes, slot memory and counts since construction (buffer_stats.hpp), as of calls returned.
  [[nodiscard]] buffer_stats stats() const {
    const auto held = core().lock();
    return core().stats();
  }
  /// Reservations made so far (inserted trajectories plus pending ones): the next ticket.
  [[nodiscard]] std::uint64_t tickets_issued() const {
    const auto held = core().lock();
    return core().ring_.next_ticket();
  }
  /// The selection policy's settings, as the state holds them now.
  [[nodiscard]] Selection selection() const {
    const auto held = core().lock();
    if constexpr (requires { core().selection_->policy(); }) return core().selection_->policy();
    else return core().selection_settings_;
  }
  [[nodiscard]] const Transport& transport() const { return core().transport_; }
  /// The shard and incarnation every key of this buffer carries.
  [[nodiscard]] key_owner owner() const { return core().owner_; }
  /// The CUDA device the buffer lives on (-1 for storage::host).
  [[nodiscard]] int device() const { return core().device_; }

  /// Committed length of `slot` (0 if empty or pending). Throws errc::key_out_of_range.
  [[nodiscard]] std::int64_t length(std::int64_t slot) const {
    core().check_slot(slot);
    const auto held = core().lock();
    return core().ring_.length(slot);
  }
  /// Ticket of the latest reservation of `slot`. Throws errc::key_out_of_range.
  [[nodiscard]] std::uint64_t ticket(std::int64_t slot) const {
    core().check_slot(slot);
    const auto held = core().lock();
    return core().ring_.ticket(slot);
  }
  /// True when k names a committed trajectory still stored (as of the calls that returned).
  [[nodiscard]] bool contains(const key& k) const {
    const auto held = core().lock();
    return core().contains(k);
  }
  /// Throws errc::key_out_of_range (another shard) or errc::stale_key unless contains(k).
  void check_key(const key& k) const {
    const auto held = core().lock();
    core().check_key(k);
  }

  // ---- insert --------------------------------------------------------------------------------

  /// Inserts whole trajectories, evicting the oldest when full, and writes one key per trajectory
  /// to keys_out. Host data is copied during the call; device data is read in stream order. Does
  /// not synchronise (insert does); to write host-resident columns of a GPU buffer from host data
  /// it waits for the earlier gathers and writes of the evicted slots (see the contract above).
  /// Throws (leaving the buffer unchanged): errc::invalid_argument (no trajectories, more than
  /// capacity, keys_out too small), errc::empty_trajectory, errc::trajectory_too_long,
  /// errc::null_pointer, errc::wrong_type, errc::wrong_shape, errc::misaligned_pointer,
  /// errc::wrong_memory, errc::out_of_memory, errc::cuda_error.
  void insert_async(const trajectories<Spec>& in, std::span<key> keys_out,
                    cuda::stream_ref stream) {
    const detail::device_scope scope(core().device_);
    detail::insert_trajectories(core(), in, keys_out, stream);
  }
  /// insert_async, then synchronises the stream.
  void insert(const trajectories<Spec>& in, std::span<key> keys_out, cuda::stream_ref stream) {
    insert_async(in, keys_out, stream);
    synchronize(stream);
  }
  void insert(const trajectories<Spec>& in, std::span<key> keys_out) requires(!on_device) {
    insert_async(in, keys_out, detail::no_stream());
  }

  // ---- reserve / commit (producers that write slots themselves) ------------------------------

  /// Reserves `count` slots (evicting the oldest when full) to be written through ref() and then
  /// committed. Reserved slots are not sampled. Stream-ordered: the evicted occupants stay visible
  /// to work enqueued earlier; write the slots with work enqueued later on the same stream, and
  /// before a later call takes them over (gear::reservation says when). Does not synchronise.
  /// Throws (reserving nothing) errc::invalid_argument (count outside [1, capacity]),
  /// errc::out_of_memory, errc::cuda_error.
  [[nodiscard]] reservation reserve(std::int64_t count, cuda::stream_ref stream) {
    const detail::device_scope scope(core().device_);
    return detail::reserve_slots(core(), count, stream);
  }
  [[nodiscard]] reservation reserve(std::int64_t count) requires(!on_device) {
    return reserve(count, detail::no_stream());
  }

  /// Makes reserved slots visible to sampling with the given lengths, in stream order; writes
  /// their keys. Does not synchronise (commit does). Throws (leaving the buffer unchanged):
  /// errc::invalid_reservation (another buffer's, a slot taken over, abandoned or already
  /// committed), errc::invalid_argument (sizes differ from the reservation),
  /// errc::empty_trajectory, errc::trajectory_too_long, errc::out_of_memory, errc::cuda_error.
  void commit_async(const reservation& r, std::span<const std::int64_t> lengths,
                    std::span<key> keys_out, cuda::stream_ref stream) {
    const detail::device_scope scope(core().device_);
    detail::commit_slots(core(), r, lengths, keys_out, stream);
  }
  void commit(const reservation& r, std::span<const std::int64_t> lengths, std::span<key> keys_out,
              cuda::stream_ref stream) {
    commit_async(r, lengths, keys_out, stream);
    synchronize(stream);
  }
  void commit(const reservation& r, std::span<const std::int64_t> lengths,
              std::span<key> keys_out) requires(!on_device) {
    commit_async(r, lengths, keys_out, detail::no_stream());
  }

  /// A step-wise writer holding one reserved slot (see gear::writer). Does not synchronise.
  [[nodiscard]] writer_type make_writer(cuda::stream_ref stream) {
    const detail::device_scope scope(core().device_);
    return writer_type(core(), stream);
  }
  [[nodiscard]] writer_type make_writer() requires(!on_device) {
    return writer_type(core(), detail::no_stream());
  }

  // ---- sample --------------------------------------------------------------------------------

  /// A batch of `rows` rows of `length` steps in this buffer's batch memory, to pass to sample().
  [[nodiscard]] batch_type make_batch(gear::batch_size rows, gear::window_length length) const {
    return batch_type(batch_memory, rows, length);
  }

  /// Selects out.batch_size() trajectories and gathers window w of each into `out` with one
  /// fused launch for all columns, plus the policy's selection launches (none where it draws each
  /// row inside a small gather). Consumes one draw of g. Stream-ordered; does not synchronise
  /// (sample does) unless trajectories are removed after k returns (set_max_times_sampled) and
  /// the policy is prioritized: then it reads back the rows it drew and applies their removal
  /// after the gather (the others know their rows on the host and remove in the gather's launch).
  /// `g` is a gear::rng, or a gear::device_rng for CUDA graphs (see "CUDA graphs" above).
  /// Throws (leaving the buffer and g unchanged): errc::empty_buffer, errc::empty_window,
  /// errc::window_out_of_range, errc::batch_mismatch, errc::not_enough_items (policy-specific),
  /// errc::out_of_memory, errc::cuda_error, errc::invalid_argument (2^31 copy blocks or more; with
  /// a device_rng: g on another GPU or stream, the buffer used from another stream, a limit set);
  /// std::bad_alloc where host memory for the buffer's own tables runs out (gear/error.hpp).
  template <class Out, class Draws>  // Out: batch_type; or rows of one (sharded_buffer)
  requires(std::same_as<Out, batch_type> || std::same_as<Out, detail::batch_slice<Spec>>) &&
      (std::same_as<Draws, rng> || (on_device && std::same_as<Draws, device_rng>))
  void sample_async(Out& out, const window& w, Draws& g, cuda::stream_ref stream) {
    const detail::device_scope scope(core().device_);
    detail::sample_into(core(), out, w, g, stream);
  }
  /// sample_async, then synchronises the stream.
  template <class Draws>
  requires std::same_as<Draws, rng> || (on_device && std::same_as<Draws, device_rng>)
  void sample(batch_type& out, const window& w, Draws& g, cuda::stream_ref stream) {
    // A device_rng sample may be captured: not to synchronise inside a capture, refuse it here.
    if constexpr (std::same_as<Draws, device_rng>) detail::refuse_capture(stream);
    sample_async(out, w, g, stream);
    synchronize(stream);
  }
  void sample(batch_type& out, const window& w, rng& g) requires(!on_device) {
    sample_async(out, w, g, detail::no_stream());
  }

  // ---- removal -------------------------------------------------------------------------------

  /// Removes the trajectories `keys` (host memory): their keys become stale and their slots stay
  /// empty until the ring reaches them again. Stream-ordered: work enqueued earlier may still
  /// return them. Does not synchronise. Throws (removing nothing): errc::key_out_of_range,
  /// errc::stale_key (which includes a key named twice), errc::out_of_memory, errc::cuda_error.
  void erase_async(std::span<const key> keys, cuda::stream_ref stream) {
    const detail::device_scope scope(core().device_);
    detail::erase_keys(core(), keys, stream);
  }
  void erase(std::span<const key> keys, cuda::stream_ref stream) {
    erase_async(keys, stream);
    synchronize(stream);
  }
  void erase(std::span<const key> keys) requires(!on_device) {
    erase_async(keys, detail::no_stream());
  }

  /// Removes every trajectory once it has been returned by `k` samples (0: never, the default),
  /// with any selection policy. A row is one return: a batch drawn with replacement may exceed a
  /// trajectory's returns left; it is removed after that batch. Returns are counted while a limit
  /// is set, and counts are kept when k changes (one at or past a new k goes at its next return).
  /// With a limit, a prioritized sample_async synchronises (it reads back the rows it drew).
  /// Throws errc::invalid_argument for k < 0, or k > 0 on a buffer bound to one stream (sampled
  /// with a device_rng, whose replays remove nothing, or updated from device memory in a graph).
  void set_max_times_sampled(std::int64_t k) { detail::set_return_limit(core(), k); }
  [[nodiscard]] std::int64_t max_times_sampled() const {
    const auto held = core().lock();
    return core().max_times_sampled_;
  }
  /// How often the trajectory in `slot` has been returned since it was committed, counted under
  /// a limit above 1 (one removed at its limit keeps its count). Throws errc::key_out_of_range.
  [[nodiscard]] std::int64_t times_sampled(std::int64_t slot) const {
    core().check_slot(slot);
    const auto held = core().lock();
    return core().times_sampled_.empty() ? 0
                                         : core().times_sampled_[static_cast<std::size_t>(slot)];
  }

  // ---- priorities ----------------------------------------------------------------------------
  // For policies that keep priorities (select::prioritized), from host spans (checked by the CPU
  // during the call) or from device memory (a batch's keys and the TD errors a kernel wrote,
  // checked by the update's kernels in stream order: no copy, no synchronisation).

  /// Sets the priorities of the trajectories `keys` (both spans in host memory). A key named
  /// twice takes its last priority. Stale keys are skipped. Stream-ordered; does not synchronise
  /// (update_priorities does). Returns how many pairs were applied and skipped.
  /// Throws (leaving the buffer unchanged): errc::key_out_of_range (a key of another shard),
  /// errc::invalid_argument (sizes differ), errc::invalid_priority (NaN, negative, infinite),
  /// errc::out_of_memory, errc::cuda_error; first, the failure of an earlier update from device
  /// memory, if one has arrived (see below).
  priority_update_result update_priorities_async(
      std::span<const key> keys, std::span<const float> priorities,
      cuda::stream_ref stream) requires host_priority_update<state_type> {
    const detail::device_scope scope(core().device_);
    return detail::update_from_host(core(), keys, priorities, stream);
  }
  /// Sets priorities from `source` memory. memory_kind::host is the call above (its counts are
  /// dropped). memory_kind::device (GPU buffers whose policy supports it, as select::prioritized
  /// does): `keys` and `priorities` in GPU-readable memory (device, managed or pinned), read by
  /// the update's kernels in stream order; keep them valid and unchanged until the update has
  /// run. No copy; does not synchronise. A key named twice takes its last priority.
  /// Throws at once (changing nothing): errc::invalid_argument (sizes differ), errc::null_pointer,
  /// errc::misaligned_pointer, errc::wrong_memory (memory the GPU cannot read, a source other than
  /// host or device, a host-memory-only buffer or policy), errc::out_of_memory, errc::cuda_error.
  /// Checked on the GPU, against the slots as the stream's earlier work left them: a stale key is
  /// skipped and counted; a key of another shard (errc::key_out_of_range) or a bad priority
  /// (errc::invalid_priority) fails the update, which then changes nothing. Its error names the
  /// call and its first bad pair and is raised once, never lost, by the first of these to see it:
  ///   - update_priorities_async (either memory), at its start, if the failed update has finished
  ///     on the GPU by then (it does not wait); that call then does nothing;
  ///   - check_priority_updates(stream) and update_priorities (device memory), which synchronise
  ///     first, so they always see it.
  void update_priorities_async(std::span<const key> keys, std::span<const float> priorities,
                               memory_kind source,
                               cuda::stream_ref stream) requires host_priority_update<state_type> {
    if (source == memory_kind::host) {
      (void)update_priorities_async(keys, priorities, stream);
      return;
    }
    GEAR_REQUIRE(source == memory_kind::device, errc::wrong_memory,
                 "update_priorities source must be memory_kind::host or ::device");
    const detail::device_scope scope(core().device_);
    detail::update_from_device(core(), keys, priorities, stream);
  }
  /// update_priorities_async, then synchronises the stream.
  priority_update_result update_priorities(
      std::span<const key> keys, std::span<const float> priorities,
      cuda::stream_ref stream) requires host_priority_update<state_type> {
    const priority_update_result r = update_priorities_async(keys, priorities, stream);
    synchronize(stream);
    return r;
  }
  priority_update_result update_priorities(
      std::span<const key> keys, std::span<const float> priorities) requires(!on_device) &&
      host_priority_update<state_type> {
    return update_priorities_async(keys, priorities, detail::no_stream());
  }
  /// update_priorities_async from `source`, synchronous. From device memory it runs
  /// check_priority_updates before (an earlier failure is thrown and this update is not made) and
  /// after (its own failure): it throws deterministically, only with the priorities unchanged.
  void update_priorities(std::span<const key> keys, std::span<const float> priorities,
                         memory_kind source,
                         cuda::stream_ref stream) requires host_priority_update<state_type> {
    detail::update_synchronously(*this, keys, priorities, source, stream);
  }
  /// Synchronises the stream, then throws the earliest failed update from device memory not yet
  /// raised (see update_priorities_async), counting any later ones in its message.
  void check_priority_updates(cuda::stream_ref stream) requires host_priority_update<state_type> {
    synchronize(stream);
    if constexpr (device_priority_update<state_type>) {
      const auto held = core().lock();
      core().selection_->raise_update_failures();
    }
  }

  /// The selection policy's state, for its run-time settings and inspection, e.g.
  /// buf.selection_state().set_exponents(alpha, beta, stream) for select::prioritized.
  [[nodiscard]] state_type& selection_state() { return *core().selection_; }
  [[nodiscard]] const state_type& selection_state() const { return *core().selection_; }

  // ---- views ---------------------------------------------------------------------------------

  /// A trivially copyable view carrying the operations Ops (gear::op::write_steps,
  /// gear::op::read_metadata), for kernels (or host code, for storage::host). Its metadata is the
  /// device mirror: what the stream's earlier work left. The buffer does not order a kernel of
  /// yours that reads it against other streams' work (a host insert that lands, say, reaches the
  /// mirror at the next call of the buffer's that settles): use it on the stream that writes or
  /// samples, or after synchronising the buffer's streams.
  template <class... Ops>
  [[nodiscard]] buffer_ref<typename Spec::element_list, Ops...> ref(Ops...) const {
    const slot_table t = selection_table();
    return buffer_ref<typename Spec::element_list, Ops...>(core().regions_.kernel, t.lengths,
                                                           t.tickets, capacity(), max_length());
  }

  /// Metadata in the memory where selection runs, as selection policies see it.
  [[nodiscard]] slot_table selection_table() const {
    const auto held = core().lock();
    return core().table();
  }

 private:
  template <trajectory_spec, class, class>
  friend class sharded_buffer;  // a sharded update from device memory: every shard, or none
  core_type& core() { return detail::moved_from_check(core_.get(), "this buffer"); }
  const core_type& core() const { return detail::moved_from_check(core_.get(), "this buffer"); }
  void synchronize(cuda::stream_ref stream) const { detail::synchronize_call(core(), stream); }

  std::unique_ptr<core_type> core_;
};

}  // namespace gear
