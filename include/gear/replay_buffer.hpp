#pragma once
// gear::replay_buffer: the owning container of trajectories.
//
//   gear::replay_buffer<Spec, Storage, Selection, Transport>
//
// Spec says what a trajectory holds (gear::spec<gear::column<...>...>), Storage where its bytes
// live, Selection which trajectories a batch takes, Transport where the shards are. All four are
// chosen at compile time; nothing in the hot paths branches on them at run time.
//
// Slots form a ring: the n-th reservation ever made (its ticket) takes slot n % capacity, so when
// the buffer is full the oldest trajectory is evicted first (FIFO). A slot is empty, pending
// (reserved, being written) or committed (visible to sampling). Its generation is bumped whenever
// it is reused, which makes every key to its previous occupant stale.
//
// Where selection and gathering run follows from Storage: on the CPU for storage::host, on the GPU
// otherwise. GPU buffers need <gear/gear.cuh> (compiled by nvcc); storage::host needs only
// <gear/gear.hpp> and runs on machines without a GPU.
//
// Streams: every call that touches GPU memory takes a cuda::stream_ref last. Plain names (insert,
// sample, commit) synchronise that stream before returning; _async names do not. Operations on
// one buffer must be ordered by the caller (one stream, or events between streams). Buffers with
// storage::host also offer every call without a stream.
//
// Errors: every call checks its input first and throws gear::error without changing anything.
//
// Threads: a buffer is not thread-safe; calls on one buffer must not overlap. Writers and
// refs point into their buffer: keep the buffer alive (and in place: moving it invalidates open
// writers) while they are used, and synchronise its streams before destroying it.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cuda/stream_ref>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define GEAR_REPLAY_BUFFER_INCLUDED 1

#include <gear/batch.hpp>
#include <gear/detail/cuda.hpp>
#include <gear/detail/gather.hpp>
#include <gear/detail/host_copy.hpp>
#include <gear/detail/memory.hpp>
#include <gear/detail/scatter.hpp>
#include <gear/error.hpp>
#include <gear/insert.hpp>
#include <gear/key.hpp>
#include <gear/layout.hpp>
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

namespace gear {

template <class Buffer>
class writer;

namespace detail {
template <class T>
inline constexpr bool dependent_false = false;

enum class slot_state : std::uint8_t { empty = 0, pending = 1, committed = 2 };

/// A stream that is never used for a CUDA call: host-storage buffers take it where the shared
/// code path expects a stream.
inline cuda::stream_ref no_stream() noexcept { return cuda::stream_ref{cudaStream_t{}}; }
}  // namespace detail

template <trajectory_spec Spec, class Storage = storage::host, class Selection = select::uniform,
          transport_policy Transport = transport::local>
class replay_buffer {
  static constexpr std::size_t num_columns = Spec::num_columns;
  static_assert(storage_policy_for<Storage, num_columns>,
                "gear::replay_buffer: Storage must be gear::storage::host, pinned_host, device or "
                "mixed<one per column>");
  static constexpr std::array<memory_kind, num_columns> placement =
      Storage::template placement<num_columns>();
  static_assert(detail::placement_consistent(placement),
                "gear::replay_buffer: storage::host columns cannot be mixed with GPU-read columns; "
                "use storage::pinned_host for host-resident columns");

 public:
  using spec_type = Spec;
  using storage_type = Storage;
  using selection_type = Selection;
  using transport_type = Transport;
  using batch_type = batch<Spec>;

  /// True when selection and gathering run on the GPU (every storage but storage::host).
  static constexpr bool on_device = detail::executes_on_device(placement);
  using space = std::conditional_t<on_device, exec::device, exec::host>;
  /// Memory that batches, metadata views and refs of this buffer live in.
  static constexpr memory_kind batch_memory = on_device ? memory_kind::device : memory_kind::host;

  static_assert(selection_policy_for<Selection, space>,
                "gear::replay_buffer: Selection does not provide state<exec::host> / "
                "state<exec::device> with validate() and select() (see gear/select/concept.hpp); "
                "for GPU storage include <gear/gear.cuh> and compile with nvcc");

  /// Allocates `slots` empty slots of `length` steps each (see layout.hpp for the layout).
  /// Throws errc::invalid_argument (capacity or max_length below 1, more than 2^40 slots),
  /// errc::no_device (GPU storage without a GPU), errc::out_of_memory, errc::cuda_error.
  replay_buffer(gear::capacity slots, gear::max_length length, Selection selection = {},
                Transport transport = {})
      : capacity_(slots.value),
        max_length_(length.value),
        selection_(std::move(selection)),
        transport_(std::move(transport)) {
    GEAR_REQUIRE(capacity_ >= 1 && capacity_ <= (std::int64_t{1} << 40), errc::invalid_argument,
                 "capacity must be in [1, 2^40], got " + std::to_string(capacity_));
    GEAR_REQUIRE(max_length_ >= 1, errc::invalid_argument,
                 "max_length must be at least 1, got " + std::to_string(max_length_));
    if constexpr (on_device)
      GEAR_REQUIRE(detail::gpu_available(), errc::no_device,
                   "this storage policy needs a CUDA GPU and none is usable; use "
                   "gear::storage::host on machines without one");
    allocate_regions();
    allocate_metadata();
    selection_state_.emplace(selection_, capacity_);
  }

  replay_buffer(replay_buffer&&) noexcept = default;
  replay_buffer& operator=(replay_buffer&&) noexcept = default;
  replay_buffer(const replay_buffer&) = delete;
  replay_buffer& operator=(const replay_buffer&) = delete;
  ~replay_buffer() = default;

  // ---- queries (host, never synchronise) ---------------------------------------------------

  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int64_t max_length() const noexcept { return max_length_; }
  /// Committed trajectories, the ones sampling can return.
  [[nodiscard]] std::int64_t size() const noexcept { return live_; }
  [[nodiscard]] bool empty() const noexcept { return live_ == 0; }
  /// Reservations made so far (inserted trajectories plus pending ones): the next ticket.
  [[nodiscard]] std::uint64_t tickets_issued() const noexcept { return next_ticket_; }
  /// The selection policy's settings.
  [[nodiscard]] const Selection& selection() const noexcept { return selection_; }
  [[nodiscard]] const Transport& transport() const noexcept { return transport_; }

  /// Committed length of `slot` (0 if empty or pending). Throws errc::key_out_of_range.
  [[nodiscard]] std::int64_t length(std::int64_t slot) const {
    check_slot(slot);
    return lengths_host()[slot];
  }
  /// Generation of `slot`. Throws errc::key_out_of_range.
  [[nodiscard]] std::uint32_t generation(std::int64_t slot) const {
    check_slot(slot);
    return generations_host()[slot];
  }
  /// True when k names a committed trajectory that is still stored.
  [[nodiscard]] bool contains(const key& k) const noexcept {
    return k.shard == transport_.shard_id() && k.slot < static_cast<std::uint64_t>(capacity_) &&
           generations_host()[k.slot] == k.generation &&
           states_host()[k.slot] == detail::slot_state::committed;
  }
  /// Throws errc::key_out_of_range or errc::stale_key unless contains(k).
  void check_key(const key& k) const {
    GEAR_REQUIRE(k.shard == transport_.shard_id() && k.slot < static_cast<std::uint64_t>(capacity_),
                 errc::key_out_of_range,
                 "key (shard " + std::to_string(k.shard) + ", slot " + std::to_string(k.slot) +
                     ") is not in this shard of " + std::to_string(capacity_) + " slots");
    GEAR_REQUIRE(contains(k), errc::stale_key,
                 "key (slot " + std::to_string(k.slot) + ", generation " +
                     std::to_string(k.generation) + ") names a trajectory no longer stored");
  }

  // ---- insert ------------------------------------------------------------------------------

  /// Inserts whole trajectories, evicting the oldest when full, and writes one key per trajectory
  /// to keys_out. Stream-ordered; host-accessible slots are written by the CPU after the stream's
  /// earlier work has finished. Does not synchronise after its own copies (insert does).
  /// Throws (leaving the buffer unchanged): errc::invalid_argument (no trajectories, more than
  /// capacity, keys_out too small), errc::empty_trajectory, errc::trajectory_too_long,
  /// errc::null_pointer, errc::wrong_type, errc::wrong_shape, errc::misaligned_pointer,
  /// errc::wrong_memory; errc::cuda_error if a copy fails.
  void insert_async(const trajectories<Spec>& in, std::span<key> keys_out,
                    cuda::stream_ref stream) {
    validate_insert(in, keys_out);
    const auto count = static_cast<std::int64_t>(in.lengths.size());
    const reservation r = reserve_slots(count, stream);
    const bool committed_by_scatter = write_trajectories(in, r, stream);
    commit_slots(r, in.lengths, keys_out, stream, /*publish=*/!committed_by_scatter);
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
  /// committed. Reserved slots are not sampled. Synchronises the stream when GPU-resident
  /// metadata must be published, so that the caller may write the slots at once.
  /// Throws errc::invalid_argument (count outside [1, capacity]), errc::cuda_error.
  [[nodiscard]] reservation reserve(std::int64_t count, cuda::stream_ref stream) {
    GEAR_REQUIRE(count >= 1 && count <= capacity_, errc::invalid_argument,
                 "reserve count must be in [1, " + std::to_string(capacity_) + "], got " +
                     std::to_string(count));
    const reservation r = reserve_slots(count, stream);
    publish_metadata(r.first_ticket, count, stream);
    synchronize(stream);
    return r;
  }
  [[nodiscard]] reservation reserve(std::int64_t count) requires(!on_device) {
    return reserve(count, detail::no_stream());
  }

  /// Makes reserved slots visible to sampling with the given lengths; writes their keys.
  /// Does not synchronise (commit does). Throws (leaving the buffer unchanged):
  /// errc::invalid_reservation (a slot was overwritten or already committed),
  /// errc::invalid_argument (sizes differ from the reservation), errc::empty_trajectory,
  /// errc::trajectory_too_long, errc::cuda_error.
  void commit_async(const reservation& r, std::span<const std::int64_t> lengths,
                    std::span<key> keys_out, cuda::stream_ref stream) {
    GEAR_REQUIRE(r.capacity == capacity_ && r.count >= 1 &&
                     static_cast<std::int64_t>(lengths.size()) == r.count &&
                     static_cast<std::int64_t>(keys_out.size()) >= r.count,
                 errc::invalid_argument, "commit needs one length and one key per reserved slot");
    for (std::int64_t i = 0; i < r.count; ++i) {
      const std::int64_t slot = r.slot(i);
      GEAR_REQUIRE(
          tickets_host()[slot] == r.first_ticket + static_cast<std::uint64_t>(i) &&
              states_host()[slot] == detail::slot_state::pending,
          errc::invalid_reservation,
          "slot " + std::to_string(slot) + " was overwritten, abandoned or already committed");
    }
    check_lengths(lengths);
    commit_slots(r, lengths, keys_out, stream);
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

  /// A step-wise writer holding one reserved slot (see gear::writer).
  [[nodiscard]] writer<replay_buffer> make_writer(cuda::stream_ref stream) {
    return writer<replay_buffer>(*this, stream);
  }
  [[nodiscard]] writer<replay_buffer> make_writer() requires(!on_device) {
    return writer<replay_buffer>(*this, detail::no_stream());
  }

  // ---- sample ------------------------------------------------------------------------------

  /// A batch of `rows` rows of `length` steps in this buffer's batch memory, to pass to sample().
  [[nodiscard]] batch_type make_batch(gear::batch_size rows, gear::window_length length) const {
    return batch_type(batch_memory, rows, length);
  }

  /// Selects out.batch_size() trajectories and gathers window w of each into `out` with one
  /// fused launch for all columns, plus one for selection unless the policy draws each row on
  /// its own and the batch is small (uniform with replacement and recency then draw inside the
  /// gather launch). Consumes one draw of g. Stream-ordered, does not synchronise (sample does)
  /// unless trajectories are removed after k returns (set_max_times_sampled, or a consuming
  /// policy such as select::fifo): then it reads back the rows it drew. Allocates nothing in the
  /// steady state.
  /// Throws (leaving the buffer, out and g unchanged): errc::empty_buffer, errc::empty_window,
  /// errc::window_out_of_range, errc::batch_mismatch, errc::not_enough_items (policy-specific),
  /// errc::cuda_error.
  void sample_async(batch_type& out, const window& w, rng& g, cuda::stream_ref stream) {
    GEAR_REQUIRE(live_ > 0, errc::empty_buffer, "no committed trajectory to sample from");
    GEAR_REQUIRE(w.length >= 1, errc::empty_window,
                 "window length must be at least 1, got " + std::to_string(w.length));
    GEAR_REQUIRE(w.offset >= 0 && w.offset < max_length_, errc::window_out_of_range,
                 "window offset must be in [0, max_length = " + std::to_string(max_length_) +
                     "), got " + std::to_string(w.offset));
    GEAR_REQUIRE(w.from == anchor::start || w.from == anchor::end || w.from == anchor::random,
                 errc::window_out_of_range, "window anchor is not start, end or random");
    GEAR_REQUIRE(w.padding == pad::head || w.padding == pad::tail, errc::window_out_of_range,
                 "window padding is not head or tail");
    GEAR_REQUIRE(out.window_length() == w.length, errc::batch_mismatch,
                 "batch was made for windows of " + std::to_string(out.window_length()) +
                     " steps, the window has " + std::to_string(w.length));
    GEAR_REQUIRE(out.where() == batch_memory, errc::batch_mismatch,
                 "batch lives in the wrong memory for this buffer; make it with make_batch()");
    const slot_table table = selection_table();
    selection_state_->validate(table, out.batch_size());

    selection_request request;
    request.batch = out.batch_size();
    request.draw = g.next();
    request.slots = out.slots_data();
    request.probabilities = out.probabilities_data();
    request.weights = out.weights_data();
    request.scratch = out.scratch_data();
    request.scratch_size = out.scratch_size();
    detail::gather_args args;
    args.num_columns = static_cast<int>(num_columns);
    for (std::size_t c = 0; c < num_columns; ++c)
      args.columns[c] = {kernel_columns_[c].base, kernel_columns_[c].slot_stride,
                         kernel_columns_[c].step_bytes, out.column_data(c)};
    args.batch = out.batch_size();
    args.win = w;
    args.draw = request.draw;
    args.slots = out.slots_data();
    args.lengths = table.lengths;
    args.generations = table.generations;
    args.shard = transport_.shard_id();
    args.mask = out.mask_data();
    args.keys = out.keys_data();
    if constexpr (on_device) {
#if defined(GEAR_DEVICE_BACKEND)
      detail::select_and_gather_on_device(*selection_state_, table, request, args, stream);
#else
      static_assert(detail::dependent_false<Storage>,
                    "gear: GPU storage needs <gear/gear.cuh>, compiled by nvcc");
#endif
    } else {
      selection_state_->select(table, request, stream);
      detail::gather_on_host(args);
    }
    if (consume_limit() > 0) count_samples(out, stream);
  }
  /// sample_async, then synchronises the stream.
  void sample(batch_type& out, const window& w, rng& g, cuda::stream_ref stream) {
    sample_async(out, w, g, stream);
    synchronize(stream);
  }
  void sample(batch_type& out, const window& w, rng& g) requires(!on_device) {
    sample_async(out, w, g, detail::no_stream());
  }

  // ---- removal ----------------------------------------------------------------------------------

  /// Removes the trajectories `keys` (host memory): their keys become stale, sampling no longer
  /// returns them, and their slots stay empty until the ring reaches them again. Stream-ordered;
  /// does not synchronise. Throws (removing nothing): errc::key_out_of_range, errc::stale_key
  /// (which includes a key named twice).
  void erase_async(std::span<const key> keys, cuda::stream_ref stream) {
    removal_tickets_.clear();
    for (const key& k : keys) {
      check_key(k);
      removal_tickets_.push_back(tickets_host()[k.slot]);
    }
    std::sort(removal_tickets_.begin(), removal_tickets_.end());
    const auto twice = std::adjacent_find(removal_tickets_.begin(), removal_tickets_.end());
    GEAR_REQUIRE(twice == removal_tickets_.end(), errc::stale_key,
                 "key (slot " + std::to_string(*twice % static_cast<std::uint64_t>(capacity_)) +
                     ") is named twice");
    remove_tickets(removal_tickets_, stream);
  }
  void erase(std::span<const key> keys, cuda::stream_ref stream) {
    erase_async(keys, stream);
    synchronize(stream);
  }
  void erase(std::span<const key> keys) requires(!on_device) {
    erase_async(keys, detail::no_stream());
  }

  /// Removes every trajectory once it has been returned by `k` samples (0: never, the default).
  /// Works with every selection policy. A row counts as one return, so with replacement one batch
  /// may return a trajectory more often than it had returns left; it is removed after that batch.
  /// With a limit set, sample_async synchronises the stream (it reads back the rows it drew).
  /// Counts start with the next sample. Throws errc::invalid_argument for k < 0.
  void set_max_times_sampled(std::int64_t k) {
    GEAR_REQUIRE(k >= 0, errc::invalid_argument,
                 "max_times_sampled must be >= 0, got " + std::to_string(k));
    if (k > 0) start_counting();
    max_times_sampled_ = k;
  }
  [[nodiscard]] std::int64_t max_times_sampled() const noexcept { return max_times_sampled_; }
  /// How often the trajectory in `slot` has been returned since it was committed (counted while
  /// a limit is set, or for a consuming policy). Throws errc::key_out_of_range.
  [[nodiscard]] std::int64_t times_sampled(std::int64_t slot) const {
    check_slot(slot);
    return times_sampled_.size() == 0 ? 0 : times_sampled_.template as<std::int64_t>()[slot];
  }

  // ---- priorities ----------------------------------------------------------------------------
  //
  // For selection policies that keep priorities (gear::select::prioritized), from either memory:
  //   host   (update_priorities(keys, priorities, stream)): the CPU reads and checks both spans
  //          during the call and throws at once;
  //   device (the same with gear::memory_kind::device): kernels read and check both arrays in
  //          stream order, so a learner passes a batch's keys and the TD errors it computed on the
  //          GPU with no copy and no synchronisation; an update with a bad pair changes nothing
  //          and its error is raised later, by the rule at update_priorities_async below.
  // The caller says which, as with insert's source: the two differ in when the memory is read and
  // when errors are thrown, and pinned memory could be either.

  /// Sets the priorities of the trajectories `keys` (both spans in host memory) for selection
  /// policies that keep priorities (gear::select::prioritized). A key named twice takes its last
  /// priority. Stream-ordered; does not synchronise (update_priorities does).
  /// Throws (leaving the buffer unchanged): errc::key_out_of_range, errc::stale_key,
  /// errc::invalid_argument (sizes differ), errc::invalid_priority (NaN, negative, infinite),
  /// errc::cuda_error; first, the failure of an earlier update from device memory, if one has
  /// arrived (see below).
  void update_priorities_async(std::span<const key> keys, std::span<const float> priorities,
                               cuda::stream_ref stream) requires
      requires(typename Selection::template state<space>& s) {
    s.update(slot_table{}, keys, priorities, stream);
  }
  {
    if constexpr (requires { selection_state_->raise_update_failures(); })
      selection_state_->raise_update_failures();
    for (const key& k : keys) check_key(k);
    selection_state_->update(selection_table(), keys, priorities, stream);
  }
  /// Sets priorities from `source` memory. memory_kind::host is the call above. memory_kind::device
  /// (GPU buffers whose policy supports it, as select::prioritized does): `keys` and `priorities`
  /// in GPU-readable memory (device, managed or pinned), e.g. a batch's keys and TD errors a kernel
  /// wrote, read by the update's two kernels in stream order; keep them valid and unchanged until
  /// the update has run. No copy; does not synchronise. A key named twice takes its last priority.
  /// Throws at once (changing nothing): errc::invalid_argument (sizes differ), errc::null_pointer,
  /// errc::misaligned_pointer, errc::wrong_memory (memory the GPU cannot read, a source other than
  /// host or device, a buffer or policy that takes host memory only), errc::cuda_error.
  /// Checked on the GPU, against the slots as the stream's earlier work left them:
  /// errc::key_out_of_range, errc::stale_key, errc::invalid_priority. An update with a bad pair
  /// changes nothing (tree, raw priorities, largest priority); later updates are not affected.
  /// Its error names the call and its first bad key (or, every key being good, its first bad
  /// priority) and is raised once, never lost, by the first of these to see it:
  ///   - update_priorities_async (either memory), at its start, if the failed update has finished
  ///     on the GPU by then (it does not wait); that call then does nothing;
  ///   - check_priority_updates(stream) and update_priorities (device memory), which synchronise
  ///     first, so they always see it.
  void update_priorities_async(std::span<const key> keys, std::span<const float> priorities,
                               memory_kind source, cuda::stream_ref stream) requires
      requires(typename Selection::template state<space>& s) {
    s.update(slot_table{}, keys, priorities, stream);
  }
  {
    if (source == memory_kind::host) return update_priorities_async(keys, priorities, stream);
    GEAR_REQUIRE(source == memory_kind::device, errc::wrong_memory,
                 "update_priorities source must be memory_kind::host or ::device");
    if constexpr (requires(typename Selection::template state<space>& s) {
                    s.update_from_device(slot_table{}, std::uint32_t{}, keys, priorities, stream);
                    s.raise_update_failures();
                  }) {
      selection_state_->raise_update_failures();
      GEAR_REQUIRE(keys.size() == priorities.size(), errc::invalid_argument,
                   "update_priorities needs one priority per key: " + std::to_string(keys.size()) +
                       " keys, " + std::to_string(priorities.size()) + " priorities");
      if (keys.empty()) return;
      check_gpu_readable(keys.data(), alignof(key), "keys");
      check_gpu_readable(priorities.data(), alignof(float), "priorities");
      selection_state_->update_from_device(selection_table(), transport_.shard_id(), keys,
                                           priorities, stream);
    } else {
      throw error(errc::wrong_memory,
                  "this buffer takes priorities from host memory only (storage::host selects on "
                  "the CPU; other policies may lack update_from_device): use memory_kind::host");
    }
  }
  /// update_priorities_async, then synchronises the stream.
  void update_priorities(std::span<const key> keys, std::span<const float> priorities,
                         cuda::stream_ref stream) requires requires(replay_buffer& b) {
    b.update_priorities_async(keys, priorities, stream);
  }
  {
    update_priorities_async(keys, priorities, stream);
    synchronize(stream);
  }
  void update_priorities(std::span<const key> keys,
                         std::span<const float> priorities) requires(!on_device) &&
      requires(replay_buffer& b) {
    b.update_priorities_async(keys, priorities, detail::no_stream());
  }
  { update_priorities_async(keys, priorities, detail::no_stream()); }
  /// update_priorities_async from `source`, synchronous. From device memory it runs
  /// check_priority_updates before (an earlier failure is thrown and this update is not made) and
  /// after (its own failure is thrown), so it throws deterministically and only when the buffer's
  /// priorities were left unchanged by this call.
  void update_priorities(std::span<const key> keys, std::span<const float> priorities,
                         memory_kind source, cuda::stream_ref stream) requires
      requires(replay_buffer& b) {
    b.update_priorities_async(keys, priorities, source, stream);
  }
  {
    if (source == memory_kind::host) return update_priorities(keys, priorities, stream);
    check_priority_updates(stream);
    update_priorities_async(keys, priorities, source, stream);
    check_priority_updates(stream);
  }
  /// Synchronises the stream, then throws the earliest failed update from device memory not yet
  /// raised (see update_priorities_async), counting any later ones in its message.
  void check_priority_updates(cuda::stream_ref stream) requires
      requires(typename Selection::template state<space>& s) {
    s.update(slot_table{}, std::span<const key>{}, std::span<const float>{}, stream);
  }
  {
    synchronize(stream);
    if constexpr (requires { selection_state_->raise_update_failures(); })
      selection_state_->raise_update_failures();
  }

 private:
  /// Throws unless p, an array of `align`-byte elements, is set, aligned and readable by kernels.
  static void check_gpu_readable(const void* p, std::size_t align, const char* what) {
    GEAR_REQUIRE(p != nullptr, errc::null_pointer, std::string(what) + " is null");
    GEAR_REQUIRE(reinterpret_cast<std::uintptr_t>(p) % align == 0, errc::misaligned_pointer,
                 std::string(what) + " is not aligned to its element size");
    GEAR_REQUIRE(detail::memory_of(p).gpu_readable, errc::wrong_memory,
                 std::string(what) +
                     " is not in memory kernels can read at this address (device, managed or "
                     "pinned) as memory_kind::device says");
  }

 public:
  /// The selection policy's state, for its run-time settings and inspection, e.g.
  /// buf.selection_state().set_exponents(alpha, beta, stream) for select::prioritized.
  [[nodiscard]] typename Selection::template state<space>& selection_state() noexcept {
    return *selection_state_;
  }
  [[nodiscard]] const typename Selection::template state<space>& selection_state() const noexcept {
    return *selection_state_;
  }

  // ---- views -------------------------------------------------------------------------------

  /// A trivially copyable view carrying the operations Ops (gear::op::write_steps,
  /// gear::op::read_metadata), for kernels (or host code, for storage::host).
  template <class... Ops>
  [[nodiscard]] buffer_ref<typename Spec::element_list, Ops...> ref(Ops...) const noexcept {
    const slot_table t = selection_table();
    return buffer_ref<typename Spec::element_list, Ops...>(
        kernel_columns_, t.lengths, t.generations, t.tickets, capacity_, max_length_);
  }

  /// Metadata in the memory where selection runs, as selection policies see it.
  [[nodiscard]] slot_table selection_table() const noexcept {
    slot_table t;
    if constexpr (on_device) {
      const detail::slot_metadata m = device_metadata();
      t.lengths = m.lengths;
      t.generations = m.generations;
      t.tickets = m.tickets;
    } else {
      t.lengths = lengths_host();
      t.generations = generations_host();
      t.tickets = tickets_host();
    }
    t.capacity = capacity_;
    t.occupied = static_cast<std::int64_t>(
        std::min<std::uint64_t>(next_ticket_, static_cast<std::uint64_t>(capacity_)));
    t.live = live_;
    t.next_ticket = next_ticket_;
    t.host_lengths = lengths_host();
    return t;
  }

 private:
  template <class Buffer>
  friend class writer;

  // ---- allocation --------------------------------------------------------------------------

  void allocate_regions() {
    constexpr memory_kind kinds[] = {memory_kind::host, memory_kind::pinned_host,
                                     memory_kind::device};
    for (std::size_t k = 0; k < 3; ++k) {
      std::int64_t slot_bytes = 0;
      std::array<std::int64_t, num_columns> offset{};
      for (std::size_t c = 0; c < num_columns; ++c) {
        if (placement[c] != kinds[k]) continue;
        offset[c] = slot_bytes;
        slot_bytes += detail::segment_bytes(Spec::step_bytes[c], max_length_);
      }
      if (slot_bytes == 0) continue;
      GEAR_REQUIRE(slot_bytes <= (std::int64_t{1} << 62) / capacity_, errc::out_of_memory,
                   "slot storage size overflows");
      regions_[k] = detail::allocation(kinds[k], static_cast<std::size_t>(slot_bytes * capacity_));
      for (std::size_t c = 0; c < num_columns; ++c) {
        if (placement[c] != kinds[k]) continue;
        host_columns_[c] = {regions_[k].data() + offset[c], slot_bytes, Spec::step_bytes[c]};
        kernel_columns_[c] = {regions_[k].device_data() + offset[c], slot_bytes,
                              Spec::step_bytes[c]};
      }
    }
  }

  // Metadata: lengths (int64), generations (uint32, padded to 8 bytes), tickets (uint64) and
  // states (uint8), each [capacity]. The host copy is authoritative; GPU buffers mirror the first
  // three in device memory, published after every change.
  [[nodiscard]] std::size_t device_meta_bytes() const noexcept {
    return detail::slot_metadata::bytes(capacity_);
  }
  /// The device mirror (GPU buffers), as kernels address it.
  [[nodiscard]] detail::slot_metadata device_metadata() const noexcept {
    return detail::slot_metadata::at(device_meta_.device_data(), capacity_);
  }
  [[nodiscard]] detail::slot_metadata host_metadata() const noexcept {
    return detail::slot_metadata::at(host_meta_.data(), capacity_);
  }
  void allocate_metadata() {
    const std::size_t bytes = device_meta_bytes() + static_cast<std::size_t>(capacity_);
    host_meta_ =
        detail::allocation(on_device ? memory_kind::pinned_host : memory_kind::host, bytes);
    std::memset(host_meta_.data(), 0, bytes);
    if constexpr (on_device) {
      device_meta_ = detail::allocation(memory_kind::device, device_meta_bytes());
      cudaStream_t init{};
      GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&init, cudaStreamNonBlocking));
      const cudaError_t copied = cudaMemcpyAsync(device_meta_.data(), host_meta_.data(),
                                                 device_meta_bytes(), cudaMemcpyHostToDevice, init);
      const cudaError_t synced = cudaStreamSynchronize(init);
      GEAR_CUDA_TRY(cudaStreamDestroy(init));
      GEAR_CUDA_TRY(copied);
      GEAR_CUDA_TRY(synced);
    }
  }

  [[nodiscard]] std::int64_t* lengths_host() const noexcept { return host_metadata().lengths; }
  [[nodiscard]] std::uint32_t* generations_host() const noexcept {
    return host_metadata().generations;
  }
  [[nodiscard]] std::uint64_t* tickets_host() const noexcept { return host_metadata().tickets; }
  [[nodiscard]] detail::slot_state* states_host() const noexcept {
    return reinterpret_cast<detail::slot_state*>(tickets_host() + capacity_);
  }

  /// Copies the device mirror of the slots of tickets [first, first + count) (at most two
  /// contiguous ranges per array). Stream-ordered; nothing for host storage.
  void publish_metadata(std::uint64_t first, std::int64_t count, cuda::stream_ref stream) {
    if constexpr (on_device) {
      const auto cap = static_cast<std::uint64_t>(capacity_);
      const auto begin = static_cast<std::int64_t>(first % cap);
      const std::int64_t n1 = std::min(count, capacity_ - begin);
      const detail::slot_metadata dev = device_metadata(), host = host_metadata();
      auto copy = [&](auto* dst, const auto* src, std::int64_t at, std::int64_t n) {
        GEAR_CUDA_TRY(cudaMemcpyAsync(dst + at, src + at,
                                      static_cast<std::size_t>(n) * sizeof(*src),
                                      cudaMemcpyHostToDevice, stream.get()));
      };
      for (auto [at, n] : {std::pair{begin, n1}, std::pair{std::int64_t{0}, count - n1}}) {
        if (n <= 0) continue;
        copy(dev.lengths, host.lengths, at, n);
        copy(dev.generations, host.generations, at, n);
        copy(dev.tickets, host.tickets, at, n);
      }
    } else {
      (void)first, (void)count, (void)stream;
    }
  }

  void synchronize(cuda::stream_ref stream) const {
    if constexpr (on_device)
      GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    else
      (void)stream;
  }

  // ---- validation --------------------------------------------------------------------------

  void check_slot(std::int64_t slot) const {
    GEAR_REQUIRE(
        slot >= 0 && slot < capacity_, errc::key_out_of_range,
        "slot " + std::to_string(slot) + " is outside [0, " + std::to_string(capacity_) + ")");
  }

  void check_lengths(std::span<const std::int64_t> lengths) const {
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      GEAR_REQUIRE(lengths[i] >= 1, errc::empty_trajectory,
                   "trajectory " + std::to_string(i) + " has length " + std::to_string(lengths[i]));
      GEAR_REQUIRE(lengths[i] <= max_length_, errc::trajectory_too_long,
                   "trajectory " + std::to_string(i) + " has " + std::to_string(lengths[i]) +
                       " steps, max_length is " + std::to_string(max_length_));
    }
  }

  void validate_insert(const trajectories<Spec>& in, std::span<key> keys_out) const {
    const auto count = static_cast<std::int64_t>(in.lengths.size());
    GEAR_REQUIRE(count >= 1 && count <= capacity_, errc::invalid_argument,
                 "an insert takes 1 to capacity = " + std::to_string(capacity_) +
                     " trajectories, got " + std::to_string(count));
    GEAR_REQUIRE(in.lengths.data() != nullptr, errc::null_pointer, "lengths is null");
    GEAR_REQUIRE(static_cast<std::int64_t>(keys_out.size()) >= count, errc::invalid_argument,
                 "keys_out holds " + std::to_string(keys_out.size()) + " keys, need " +
                     std::to_string(count));
    check_lengths(in.lengths);
    [&]<std::size_t... C>(std::index_sequence<C...>) {
      (detail::check_column_input<Spec, C>(in.columns[C]), ...);
    }
    (std::make_index_sequence<num_columns>{});
    GEAR_REQUIRE(in.source == memory_kind::host || in.source == memory_kind::device,
                 errc::wrong_memory, "insert source must be memory_kind::host or ::device");
    if constexpr (!on_device) {
      GEAR_REQUIRE(in.source == memory_kind::host, errc::wrong_memory,
                   "storage::host takes trajectories from host memory only");
    } else {
      for (std::size_t c = 0; c < num_columns; ++c) {
        const detail::pointer_memory m = detail::memory_of(in.columns[c].data);
        const bool ok = in.source == memory_kind::device ? m.gpu_readable : !m.device;
        GEAR_REQUIRE(ok, errc::wrong_memory,
                     "column '" + std::string(Spec::names[c]) + "' is not in " +
                         (in.source == memory_kind::device ? "GPU-readable" : "host") +
                         " memory as the insert says");
      }
    }
  }

  // ---- mutation (inputs already validated) -------------------------------------------------

  /// Allocates the per-slot return counts, zeroed, the first time they are needed.
  void start_counting() {
    if (times_sampled_.size() != 0) return;
    times_sampled_ = detail::allocation(memory_kind::host,
                                        static_cast<std::size_t>(capacity_) * sizeof(std::int64_t));
    std::memset(times_sampled_.data(), 0, times_sampled_.size());
  }

  /// Removes the committed trajectories of `tickets` (sorted, distinct, already validated): one
  /// on_evict call and one metadata publish per run of consecutive tickets, not per trajectory.
  void remove_tickets(std::span<const std::uint64_t> tickets, cuda::stream_ref stream) {
    const auto cap = static_cast<std::uint64_t>(capacity_);
    for (std::size_t i = 0; i < tickets.size();) {
      std::size_t end = i + 1;
      while (end < tickets.size() && tickets[end] == tickets[end - 1] + 1) ++end;
      const std::uint64_t first = tickets[i];
      const auto count = static_cast<std::int64_t>(end - i);
      if constexpr (requires { selection_state_->on_evict(slot_table{}, first, count, stream); })
        selection_state_->on_evict(selection_table(), first, count, stream);
      for (std::size_t k = i; k < end; ++k) {
        const auto slot = static_cast<std::int64_t>(tickets[k] % cap);
        states_host()[slot] = detail::slot_state::empty;
        lengths_host()[slot] = 0;
        ++generations_host()[slot];
      }
      live_ -= count;
      publish_metadata(first, count, stream);
      i = end;
    }
  }

  /// Returns before removal: the policy's own (a consuming policy such as fifo returns each item
  /// once) or the user's max_times_sampled; 0 for no limit.
  [[nodiscard]] std::int64_t consume_limit() const noexcept {
    if constexpr (requires { Selection::consumes; })
      if (Selection::consumes) return 1;
    return max_times_sampled_;
  }

  /// Counts the rows of a finished sample and removes trajectories that reached the limit.
  void count_samples(const batch_type& out, cuda::stream_ref stream) {
    start_counting();
    const std::int64_t* slots = out.slots_data();
    if constexpr (on_device) {
      const auto bytes = static_cast<std::size_t>(out.batch_size()) * sizeof(std::int64_t);
      if (sampled_slots_.size() < bytes)
        sampled_slots_ = detail::allocation(memory_kind::pinned_host, bytes);
      GEAR_CUDA_TRY(cudaMemcpyAsync(sampled_slots_.data(), slots, bytes, cudaMemcpyDeviceToHost,
                                    stream.get()));
      synchronize(stream);
      slots = sampled_slots_.template as<std::int64_t>();
    }
    auto* counts = times_sampled_.template as<std::int64_t>();
    const std::int64_t limit = consume_limit();
    removal_tickets_.clear();
    for (std::int64_t row = 0; row < out.batch_size(); ++row) {
      const std::int64_t slot = slots[row];
      if (slot < 0 || states_host()[slot] != detail::slot_state::committed) continue;
      if (++counts[slot] >= limit) removal_tickets_.push_back(tickets_host()[slot]);
    }
    // A slot drawn again after reaching its limit appears more than once.
    std::sort(removal_tickets_.begin(), removal_tickets_.end());
    removal_tickets_.erase(std::unique(removal_tickets_.begin(), removal_tickets_.end()),
                           removal_tickets_.end());
    remove_tickets(removal_tickets_, stream);
  }

  /// Takes the next `count` tickets' slots: evicts their committed occupants, bumps reused slots'
  /// generations, marks them pending. Host metadata, and the selection policy's on_evict hook.
  reservation reserve_slots(std::int64_t count, cuda::stream_ref stream) {
    const reservation r{next_ticket_, count, capacity_};
    if constexpr (requires {
                    selection_state_->on_evict(slot_table{}, r.first_ticket, r.count, stream);
                  })
      selection_state_->on_evict(selection_table(), r.first_ticket, r.count, stream);
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t slot = r.slot(i);
      if (states_host()[slot] == detail::slot_state::committed) --live_;
      if (r.first_ticket + static_cast<std::uint64_t>(i) >= static_cast<std::uint64_t>(capacity_))
        ++generations_host()[slot];
      lengths_host()[slot] = 0;
      if (times_sampled_.size() != 0) times_sampled_.template as<std::int64_t>()[slot] = 0;
      tickets_host()[slot] = r.first_ticket + static_cast<std::uint64_t>(i);
      states_host()[slot] = detail::slot_state::pending;
    }
    next_ticket_ += static_cast<std::uint64_t>(count);
    return r;
  }

  /// Commits reserved slots in the host metadata, and in the device mirror with `publish` (an
  /// insert whose scatter kernel committed them there already passes false).
  void commit_slots(const reservation& r, std::span<const std::int64_t> lengths,
                    std::span<key> keys_out, cuda::stream_ref stream, bool publish = true) {
    for (std::int64_t i = 0; i < r.count; ++i) {
      const std::int64_t slot = r.slot(i);
      lengths_host()[slot] = lengths[static_cast<std::size_t>(i)];
      states_host()[slot] = detail::slot_state::committed;
      keys_out[static_cast<std::size_t>(i)] =
          key{static_cast<std::uint64_t>(slot), generations_host()[slot], transport_.shard_id()};
    }
    live_ += r.count;
    if (publish) publish_metadata(r.first_ticket, r.count, stream);
    if constexpr (requires {
                    selection_state_->on_commit(slot_table{}, r.first_ticket, r.count, stream);
                  })
      selection_state_->on_commit(selection_table(), r.first_ticket, r.count, stream);
  }

  /// Marks the pending slot of `ticket` empty again (an abandoned writer).
  void abandon(std::uint64_t ticket, cuda::stream_ref stream) noexcept {
    const auto slot = static_cast<std::int64_t>(ticket % static_cast<std::uint64_t>(capacity_));
    if (tickets_host()[slot] != ticket || states_host()[slot] != detail::slot_state::pending)
      return;
    states_host()[slot] = detail::slot_state::empty;
    try {
      publish_metadata(ticket, 1, stream);
    } catch (const error&) {
      // The device mirror already says length 0 for a pending slot; nothing to undo.
    }
  }

  /// Copies validated trajectories into the reserved slots.
  ///   host source:   host-resident columns by the CPU (several threads when large); GPU-resident
  ///                  columns staged into mapped pinned memory by the CPU, then one scatter launch
  ///   device source: one scatter launch for all columns
  /// Returns true when a scatter launch also committed the trajectories' metadata to the device
  /// mirror (then commit_slots need not publish it).
  bool write_trajectories(const trajectories<Spec>& in, const reservation& r,
                          cuda::stream_ref stream) {
    if (in.source == memory_kind::device) {
      std::array<const std::byte*, num_columns> sources{};
      for (std::size_t c = 0; c < num_columns; ++c)
        sources[c] = static_cast<const std::byte*>(in.columns[c].data);
      scatter(sources, in.lengths, r, stream, /*sources_in_staging=*/false);
      return on_device;
    }
    std::int64_t steps = 0, cpu_bytes = 0, gpu_bytes = 0;
    for (std::int64_t len : in.lengths) steps += len;
    for (std::size_t c = 0; c < num_columns; ++c)
      (host_accessible(placement[c]) ? cpu_bytes : gpu_bytes) +=
          align_up(steps * Spec::step_bytes[c], segment_alignment);
    // Earlier stream work may still read the evicted occupants of these slots.
    if (on_device && cpu_bytes > 0) synchronize(stream);
    if (gpu_bytes > 0) {
      // Stage GPU-resident columns, packed as given, in mapped pinned memory.
      std::byte* staged = reserve_staging(r.count, gpu_bytes);
      std::array<const std::byte*, num_columns> sources{};
      std::array<std::byte*, num_columns> targets{};
      for (std::size_t c = 0; c < num_columns; ++c) {
        if (host_accessible(placement[c])) continue;
        targets[c] = staged;
        sources[c] = staged;
        staged += align_up(steps * Spec::step_bytes[c], segment_alignment);
      }
      const std::int64_t total[] = {steps};
      const unsigned parts = detail::copy_threads_for(gpu_bytes);
      detail::parallel_for(parts, [&](unsigned part) {
        for (std::size_t c = 0; c < num_columns; ++c)
          if (targets[c] != nullptr)
            detail::copy_packed_share(
                static_cast<const std::byte*>(in.columns[c].data), total, Spec::step_bytes[c],
                [&](std::size_t) { return targets[c]; }, part, parts);
      });
      for (auto& source : sources)
        if (source != nullptr) source = device_view_of_staging(source);
      scatter(sources, in.lengths, r, stream, /*sources_in_staging=*/true);
    }
    if (cpu_bytes > 0) {
      const unsigned parts = detail::copy_threads_for(cpu_bytes);
      detail::parallel_for(parts, [&](unsigned part) {
        for (std::size_t c = 0; c < num_columns; ++c) {
          if (!host_accessible(placement[c])) continue;
          detail::copy_packed_share(
              static_cast<const std::byte*>(in.columns[c].data), in.lengths, Spec::step_bytes[c],
              [&](std::size_t i) {
                return host_columns_[c].at(r.slot(static_cast<std::int64_t>(i)), 0);
              },
              part, parts);
        }
      });
    }
    return on_device && gpu_bytes > 0;
  }

  /// Waits until the previous scatter has read the staging memory, grows it to hold the rows table
  /// of `count` trajectories plus `data_bytes`, and returns where the data part starts (CPU
  /// address). Grows only when an insert is larger than any before.
  std::byte* reserve_staging(std::int64_t count, std::int64_t data_bytes) {
    if (staging_ready_.get() != nullptr)
      GEAR_CUDA_TRY(cudaEventSynchronize(staging_ready_.get()));
    else
      staging_ready_ = detail::event::make();
    const auto rows_bytes = static_cast<std::size_t>(
        align_up(count * std::int64_t{sizeof(detail::scatter_row)}, segment_alignment));
    const std::size_t bytes = rows_bytes + static_cast<std::size_t>(data_bytes);
    if (staging_.size() < bytes)
      staging_ = detail::allocation(memory_kind::pinned_host, std::max(bytes, staging_.size() * 2));
    return staging_.data() + rows_bytes;
  }
  [[nodiscard]] const std::byte* device_view_of_staging(const std::byte* p) const noexcept {
    return staging_.device_data() + (p - staging_.data());
  }

  /// One scatter launch writing, for every column with a source, trajectory i (packed, lengths[i]
  /// steps) into slot r.slot(i), and committing its length, generation and ticket to the device
  /// mirror. The rows table is written at the head of the pinned staging and
  /// copied to device memory; an event keeps the next insert from overwriting staging too early:
  /// recorded after the scatter where it reads its sources from the staging, else right after
  /// the rows table's copy, so that the host prepares the next insert while this one runs.
  void scatter(const std::array<const std::byte*, num_columns>& sources,
               std::span<const std::int64_t> lengths, const reservation& r,
               cuda::stream_ref stream, bool sources_in_staging) {
    if constexpr (on_device) {
#if defined(GEAR_DEVICE_BACKEND)
      // Waits for the last scatter; never reallocates memory just staged for this one.
      (void)reserve_staging(r.count, 0);
      auto* rows = staging_.template as<detail::scatter_row>();
      detail::scatter_args args;
      args.count = r.count;
      std::int64_t at = 0;
      for (std::int64_t i = 0; i < r.count; ++i) {
        const std::int64_t len = lengths[static_cast<std::size_t>(i)];
        const std::int64_t slot = r.slot(i);
        rows[i] = {slot, at, len, tickets_host()[slot], generations_host()[slot]};
        at += len;
        args.max_count_length = std::max(args.max_count_length, len);
      }
      // Every block reads its row: from device memory, not over PCIe.
      const std::size_t rows_bytes =
          static_cast<std::size_t>(r.count) * sizeof(detail::scatter_row);
      if (device_rows_.size() < rows_bytes) {
        synchronize(stream);  // the last scatter may still read the table being replaced
        device_rows_ =
            detail::allocation(memory_kind::device, std::max(rows_bytes, 2 * device_rows_.size()));
      }
      GEAR_CUDA_TRY(cudaMemcpyAsync(device_rows_.data(), rows, rows_bytes, cudaMemcpyHostToDevice,
                                    stream.get()));
      if (!sources_in_staging) GEAR_CUDA_TRY(cudaEventRecord(staging_ready_.get(), stream.get()));
      args.rows = device_rows_.template as<detail::scatter_row>();
      args.commit = device_metadata();
      for (std::size_t c = 0; c < num_columns; ++c)
        if (sources[c] != nullptr)
          args.columns[args.num_columns++] = {sources[c], kernel_columns_[c].base,
                                              kernel_columns_[c].slot_stride,
                                              kernel_columns_[c].step_bytes};
      detail::scatter_on_device(args, stream);
      if (sources_in_staging) GEAR_CUDA_TRY(cudaEventRecord(staging_ready_.get(), stream.get()));
#else
      static_assert(detail::dependent_false<Storage>,
                    "gear: GPU storage needs <gear/gear.cuh>, compiled by nvcc");
#endif
    } else {
      (void)sources, (void)lengths, (void)r, (void)stream, (void)sources_in_staging;
    }
  }

  // Mapped pinned staging for scatters (rows table, then staged column data) and the event that
  // says when the last scatter has read it. Declared in every translation unit, GPU backend or not,
  // so that the class has one layout.
  detail::allocation staging_;
  detail::allocation device_rows_;
  detail::event staging_ready_;

  std::int64_t capacity_;
  std::int64_t max_length_;
  Selection selection_;
  Transport transport_;
  std::array<detail::allocation, 3> regions_{};
  std::array<detail::column_geometry, num_columns> host_columns_{};    // CPU addresses
  std::array<detail::column_geometry, num_columns> kernel_columns_{};  // addresses selection uses
  detail::allocation host_meta_;
  detail::allocation device_meta_;
  std::uint64_t next_ticket_ = 0;
  std::int64_t live_ = 0;
  std::int64_t max_times_sampled_ = 0;
  detail::allocation times_sampled_;  // [capacity] returns per slot, once counting is on
  detail::allocation sampled_slots_;  // pinned: a GPU batch's rows, read back for counting
  std::vector<std::uint64_t> removal_tickets_;  // scratch of erase and counting, reused
  std::optional<typename Selection::template state<space>> selection_state_;
};

/// Writes one trajectory step by step into a reserved slot, then commits it.
///
///   auto w = buf.make_writer(stream);
///   for (...) w.append(obs_ptr, &action, &reward, &done);   // one pointer per column
///   gear::key k = w.commit();
///
/// Steps are copied at once: host-resident columns by the CPU, GPU columns with stream-ordered
/// copies from the caller's (pageable or pinned) host memory. A writer that is destroyed without
/// commit gives its slot up. If more than capacity other reservations are made before commit, the
/// slot is taken over and commit throws errc::invalid_reservation.
template <class Buffer>
class writer {
  using spec = typename Buffer::spec_type;

 public:
  writer(Buffer& buffer, cuda::stream_ref stream)
      : buffer_(&buffer), stream_(stream), reservation_(buffer.reserve(1, stream)) {}
  writer(writer&& o) noexcept
      : buffer_(std::exchange(o.buffer_, nullptr)),
        stream_(o.stream_),
        reservation_(o.reservation_),
        steps_(o.steps_) {}
  writer& operator=(writer&&) = delete;
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;
  ~writer() {
    if (buffer_ != nullptr) buffer_->abandon(reservation_.first_ticket, stream_);
  }

  /// Steps written so far.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  /// The slot being written.
  [[nodiscard]] std::int64_t slot() const noexcept { return reservation_.slot(0); }

  /// Appends one step: one pointer per column, in spec order, each to one step's elements.
  /// Throws errc::writer_full past max_length, errc::null_pointer, errc::invalid_reservation
  /// after commit or takeover, errc::cuda_error.
  template <class... T>
  void append(const T*... step) {
    static_assert(sizeof...(T) == spec::num_columns, "writer::append: one pointer per column");
    check_open();
    GEAR_REQUIRE(
        steps_ < buffer_->max_length(), errc::writer_full,
        "trajectory already has max_length = " + std::to_string(buffer_->max_length()) + " steps");
    const void* ptrs[] = {static_cast<const void*>(step)...};
    [&]<std::size_t... C>(std::index_sequence<C...>) {
      static_assert(
          (std::is_same_v<std::remove_cv_t<T>, typename spec::template column_t<C>::element_type> &&
           ...),
          "writer::append: pointer types must match the spec's column types");
    }
    (std::make_index_sequence<spec::num_columns>{});
    for (std::size_t c = 0; c < spec::num_columns; ++c)
      GEAR_REQUIRE(ptrs[c] != nullptr, errc::null_pointer,
                   "column '" + std::string(spec::names[c]) + "': step pointer is null");
    for (std::size_t c = 0; c < spec::num_columns; ++c) {
      std::byte* dst = buffer_->host_columns_[c].at(slot(), steps_);
      const auto bytes = static_cast<std::size_t>(spec::step_bytes[c]);
      if (host_accessible(Buffer::placement[c]))
        std::memcpy(dst, ptrs[c], bytes);
      else
        GEAR_CUDA_TRY(cudaMemcpyAsync(dst, ptrs[c], bytes, cudaMemcpyHostToDevice, stream_.get()));
    }
    ++steps_;
  }

  /// Commits the steps written so far as one trajectory and returns its key; synchronises the
  /// stream. Throws errc::empty_trajectory with no steps, errc::invalid_reservation.
  key commit() {
    check_open();
    key k{};
    const std::int64_t length = steps_;
    buffer_->commit(reservation_, std::span<const std::int64_t>(&length, 1), std::span<key>(&k, 1),
                    stream_);
    buffer_ = nullptr;
    return k;
  }

 private:
  void check_open() const {
    GEAR_REQUIRE(buffer_ != nullptr, errc::invalid_reservation, "writer already committed");
    GEAR_REQUIRE(buffer_->tickets_host()[slot()] == reservation_.first_ticket &&
                     buffer_->states_host()[slot()] == detail::slot_state::pending,
                 errc::invalid_reservation,
                 "the writer's slot was taken over by newer reservations");
  }

  Buffer* buffer_;
  cuda::stream_ref stream_;
  reservation reservation_;
  std::int64_t steps_ = 0;
};

}  // namespace gear
