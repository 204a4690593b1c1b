#pragma once
// buffer_core: the state of one replay buffer and the steps every operation shares. The owner
// (replay_buffer.hpp) keeps it behind a pointer, so moving the owner keeps writers valid; the
// operations (insert_pipeline.hpp, slots.hpp, sample.hpp, priorities.hpp) act on it.
//
//   regions   slot bytes (regions.hpp)
//   ring      which ticket each slot holds, host side (slot_ring.hpp): the state host queries read
//   mirror    GPU buffers: the same per-slot metadata in device memory, changed only by slot
//             records applied in stream order (mirror.hpp: the journal kernel, a gather's end)
//   staging   pinned memory leased to one call and recycled by events (staging.hpp)
//   order     the events that order the buffer's work across streams (stream_order.hpp)
//   landing   host inserts whose bytes are on their way to device memory, published later by
//             the next call that needs them, on its stream (landing.hpp)
//   selection the selection policy's state
//
// Threads: every operation holds the buffer's mutex while it reads or changes this state and
// enqueues its work (an insert lets go of it while the CPU copies host data into its staging).
// Operations take it through lock(); the helpers they call expect it held.
//
// Every mutating operation runs in three phases: check (throws, changes nothing), acquire (leases,
// allocations; throws, changes nothing), then change the ring and enqueue. An enqueue that fails
// after the ring changed leaves host and device views apart: the buffer records the failure and
// every later operation throws it (errc::cuda_error), rather than return wrong rows.

#include <array>
#include <atomic>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/buffer_stats.hpp>
#include <gear/detail/buffer/calls.hpp>
#include <gear/detail/buffer/landing_state.hpp>
#include <gear/detail/buffer/mirror.hpp>
#include <gear/detail/buffer/regions.hpp>
#include <gear/detail/buffer/slot_ring.hpp>
#include <gear/detail/buffer/staging.hpp>
#include <gear/detail/buffer/stream_order.hpp>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <gear/select/concept.hpp>
#include <gear/storage/concept.hpp>
#include <gear/transport/concept.hpp>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gear::detail {

template <class Spec, class Storage, class Selection, class Transport>
class buffer_core {
  static_assert(
      !requires { Transport::remote; },
      "gear::replay_buffer with a remote transport (transport::libfabric) is declared "
      "in <gear/distributed.hpp>: include it");

 public:
  static constexpr std::size_t num_columns = Spec::num_columns;
  static constexpr std::array<memory_kind, num_columns> placement =
      Storage::template placement<num_columns>();
  static constexpr bool on_device = executes_on_device(placement);
  /// Every column in device memory: host inserts may land (landing.hpp).
  static constexpr bool all_in_device_memory = [] {
    for (const memory_kind m : placement)
      if (host_accessible(m)) return false;
    return true;
  }();
  using space = std::conditional_t<on_device, exec::device, exec::host>;
  using state_type = typename Selection::template state<space>;
  using selection_type = Selection;
  using spec_type = Spec;

  buffer_core(std::int64_t capacity, std::int64_t max_length, const Selection& selection,
              Transport transport, const memory_resources& memory = {})
      : capacity_(capacity),
        max_length_(max_length),
        selection_settings_(selection),
        transport_(std::move(transport)),
        device_(current_device()),
        regions_(placement, capacity, max_length, memory),
        ring_(capacity, next_buffer_id(), /*indexed=*/dense_reading<Selection>) {
    if constexpr (on_device) {
      // The mirror, then the publish launch's arrivals word (landing.hpp), cleared together.
      mirror_ = allocation(memory_kind::device, slot_mirror::bytes(capacity) + sizeof(unsigned));
      if (!all_in_device_memory) order_.track_for_host();  // the CPU writes host-resident slots
      zero_now(mirror_.data(), mirror_.size(), memory_kind::device);
      if constexpr (all_in_device_memory) load_publish_kernel();
    }
    selection_.emplace(selection, capacity);
  }

  // ---- parts ---------------------------------------------------------------------------------

  std::int64_t capacity_;
  std::int64_t max_length_;
  Selection selection_settings_;  // as constructed; states with setters report their own
  Transport transport_;
  key_owner owner_ = detail::owner_of(transport_);  ///< the keys this shard issues and accepts
  int device_;                                      // the GPU the buffer lives on (-1: none)
  slot_regions<Spec> regions_;
  slot_ring ring_;
  allocation mirror_;  // GPU buffers: slot_mirror in device memory
  staging_pool staging_;
  std::optional<state_type> selection_;
  std::string failure_;  // an enqueue that failed after state changed; empty if none
  buffer_stats calls_;   // the counts of calls (samples, priority updates) that stats() reports
  std::int64_t max_times_sampled_ = 0;
  std::vector<std::int64_t> times_sampled_;     // [capacity] once counting is on
  std::vector<ticket_run> removal_runs_;        // scratch of counting returns, reused
  std::vector<std::int64_t> drawn_slots_;       // scratch of counting, reused
  stream_order order_;
  mutable std::mutex mutex_;

  using landing_insert = detail::landing_insert;
  std::vector<landing_insert> landing_;
  std::vector<slot_record> landing_records_;  // the reservations' pending records, not yet applied
  std::vector<std::pair<std::uint64_t, std::int64_t>> landing_evictions_;  // (first, count) for
                                                                           // the evict hook
  std::vector<std::int64_t> scratch_rows_;  // of publishing, reused
  std::vector<std::pair<const staging_pool::lease*, bool>> scratch_leases_;  // of publishing:
                                                                             // (lease, signalled)
  std::size_t landed_since_settle_ = 0;     // landing inserts since the last settle
  cudaStream_t publisher_{};                // publishes landing inserts while no sample is in flight

  ~buffer_core() {
    // Uploads still running on callers' streams write staging freed with the buffer.
    for (const auto& l : landing_) (void)cudaEventSynchronize(staging_.marked(l.lease));
    if (publisher_ == nullptr) return;
    (void)cudaStreamSynchronize(publisher_);  // its publishes read staging freed with the buffer
    (void)cudaStreamDestroy(publisher_);
  }
  buffer_core(const buffer_core&) = delete;
  buffer_core& operator=(const buffer_core&) = delete;

  /// The publish launch's arrivals word (landing_publish.cuh): 0 between launches.
  [[nodiscard]] unsigned* publish_arrivals() const noexcept {
    return reinterpret_cast<unsigned*>(mirror_.data() + slot_mirror::bytes(capacity_));
  }

  /// The buffer's own stream (made on first use). Throws errc::cuda_error.
  [[nodiscard]] cuda::stream_ref publisher() {
    if (publisher_ == nullptr)
      GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&publisher_, cudaStreamNonBlocking));
    return cuda::stream_ref{publisher_};
  }

  /// Trajectories of landing inserts not taken over by newer reservations.
  [[nodiscard]] std::int64_t landing_count() const noexcept {
    std::int64_t n = 0;
    for (const auto& l : landing_)
      for (std::size_t i = 0; i < l.lengths.size(); ++i) n += ring_.is_pending(l.first_ticket + i);
    return n;
  }
  /// replay_buffer::stats(): the ring's counts and the calls' (the mutex held).
  [[nodiscard]] buffer_stats stats() const {
    buffer_stats s = calls_;
    const std::int64_t landing = landing_count();
    s.capacity = capacity_;
    s.size = ring_.live() + landing;
    s.pending = ring_.pending() - landing;  // a landing insert's slots count in size
    s.tickets_issued = ring_.next_ticket();
    for (std::size_t k = 0; k < s.slot_bytes.size(); ++k)
      s.slot_bytes[k] = regions_.memory[k].size();
    s.committed = ring_.committed_total();
    s.evicted = ring_.evicted_total();
    s.removed = ring_.removed_total();
    return s;
  }
  /// True when `ticket` belongs to a landing insert and is still its slot's reservation.
  [[nodiscard]] bool is_landing(std::uint64_t ticket) const noexcept {
    if (!ring_.is_pending(ticket)) return false;
    for (const auto& l : landing_)
      if (l.names(ticket)) return true;
    return false;
  }

  [[nodiscard]] std::unique_lock<std::mutex> lock() const { return std::unique_lock(mutex_); }

  /// Orders an access of this call's stream after other streams' (stream_order.hpp). Refuses,
  /// first, a stream capturing a CUDA graph unless the call may be captured (`capturable`). A call
  /// that binds the buffer once enqueued says so (`binding`): it makes and records no event.
  void order_before(cuda::stream_ref stream, stream_order::access a, bool capturable = false,
                    bool binding = false) {
    if constexpr (on_device) {
      if (!capturable) detail::refuse_capture(stream);
      order_.before(stream.get(), a, binding);
    }
  }
  void order_after(cuda::stream_ref stream, stream_order::access a, bool bytes = true,
                   bool binding = false) {
    if constexpr (on_device) order_.after(stream.get(), a, bytes, binding);
  }

  /// Waits, on the host, until the CPU may overwrite the host-resident bytes of the slots the
  /// next reservation takes: for every gather that may read them and every write of slot bytes
  /// in flight (stream_order::wait_on_host), not for the rest of the caller's stream. A bound
  /// buffer records no event: it waits for its stream. Call wait_for_takeovers (landing.hpp)
  /// first.
  void wait_before_cpu_write(cuda::stream_ref stream) {
    if constexpr (on_device) order_.bound() ? synchronize(stream) : order_.wait_on_host();
    (void)stream;
  }
  static constexpr auto read = stream_order::access::read;
  static constexpr auto write = stream_order::access::write;

  // ---- views ---------------------------------------------------------------------------------

  /// The metadata selection reads: the device mirror for GPU buffers, the ring's arrays on the
  /// host (host_table). Counts are the ring's, as of this call.
  [[nodiscard]] slot_table table() const noexcept {
    slot_table t = host_table();
    if constexpr (on_device) {
      const slot_mirror m = mirror();
      t.lengths = m.lengths;
      t.tickets = m.tickets;
      t.dense = dense_reading<Selection> ? m.dense : nullptr;
    }
    return t;
  }
  /// The same metadata as the host holds it: the ring's arrays (mirror_rows draws from it).
  [[nodiscard]] slot_table host_table() const noexcept {
    slot_table t;
    t.lengths = t.host_lengths = ring_.lengths();
    t.tickets = t.host_tickets = ring_.tickets();
    t.dense = ring_.dense();
    t.capacity = capacity_;
    t.occupied = ring_.occupied();
    t.live = ring_.live();
    t.next_ticket = ring_.next_ticket();
    t.host_states = reinterpret_cast<const std::uint8_t*>(ring_.states());
    return t;
  }
  [[nodiscard]] slot_mirror mirror() const noexcept {
    return slot_mirror::at(mirror_.data(), capacity_);
  }

  // ---- keys ----------------------------------------------------------------------------------

  [[nodiscard]] key key_of(std::uint64_t ticket) const noexcept {
    return key{ticket, owner_.shard, owner_.incarnation};
  }
  /// A landing insert's keys count as stored: every call that uses them publishes it first.
  [[nodiscard]] bool contains(const key& k) const noexcept {
    return owner_.owns(k) && (ring_.holds(k.ticket) || is_landing(k.ticket));
  }
  /// Throws errc::key_out_of_range (another shard) or errc::stale_key unless contains(k).
  void check_key(const key& k) const {
    GEAR_REQUIRE(owner_.owns(k), errc::key_out_of_range,
                 "key (shard " + std::to_string(k.shard) + ", incarnation " +
                     std::to_string(k.incarnation) + ") is not of this shard (shard " +
                     std::to_string(owner_.shard) + ", incarnation " +
                     std::to_string(owner_.incarnation) + ")");
    GEAR_REQUIRE(ring_.holds(k.ticket) || is_landing(k.ticket), errc::stale_key,
                 "key (ticket " + std::to_string(k.ticket) + ", slot " +
                     std::to_string(k.slot(capacity_)) + ") names a trajectory no longer stored");
  }

  // ---- the phases every operation shares -----------------------------------------------------

  /// Throws the failure that left this buffer unusable, if any. GPU buffers also refuse to start
  /// while the calling thread has a CUDA error pending that nobody checked (a failed launch of the
  /// caller's): the launch checks of this call would report it as theirs after the buffer had
  /// changed. The error is reported, and cleared, before anything changes.
  void check_usable() const {
    GEAR_REQUIRE(
        failure_.empty(), errc::cuda_error,
        "the buffer is unusable: an earlier operation failed after changing it (" + failure_ + ")");
    if constexpr (on_device) {
      const cudaError_t pending = cudaPeekAtLastError();
      if (pending != cudaSuccess) {
        (void)cudaGetLastError();
        throw error(
            errc::cuda_error,
            std::string("an earlier CUDA call of this thread failed and was not checked (") +
                cudaGetErrorName(pending) + ": " + cudaGetErrorString(pending) +
                "); the buffer changed nothing");
      }
    }
  }

  /// check_usable(), and, for a call that cannot be captured into a CUDA graph (all but samples
  /// with a gear::device_rng and updates from device memory), refuse_capture(stream): checked
  /// first, before the call acquires anything (an allocation or event query during a capture
  /// would break it).
  void check_usable(cuda::stream_ref stream) const {
    check_usable();
    if constexpr (on_device) detail::refuse_capture(stream);
  }

  /// Runs f, which enqueues work after the ring changed; a failure makes the buffer unusable.
  template <class F>
  void enqueue(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      failure_ = e.what();
      throw;
    }
  }

  /// Reserves `count` slots in the ring (writing pending records to `records`, if any) and
  /// restarts their return counts. Never throws.
  reservation reserve_in_ring(std::int64_t count, slot_record* records) noexcept {
    const reservation r = ring_.reserve(count, records);
    if (!times_sampled_.empty())
      for (std::int64_t i = 0; i < count; ++i)
        times_sampled_[static_cast<std::size_t>(r.slot(i))] = 0;
    return r;
  }

  /// Pinned memory for `count` slot records and `extra_bytes` after them, leased before the ring
  /// changes (null for host storage, whose ring is its own mirror).
  [[nodiscard]] std::optional<staging_pool::lease> lease_records(std::int64_t count,
                                                                 std::size_t extra_bytes = 0) {
    if constexpr (!on_device) {
      (void)count, (void)extra_bytes;
      return std::nullopt;
    } else {
      return staging_.acquire(journal_bytes(count) + extra_bytes, 0);
    }
  }
  /// Bytes one apply of `count` slot records needs: the records, then, with a dense index, its
  /// changes: those pending and two per record (an insert into a full ring evicts and commits).
  [[nodiscard]] std::size_t journal_bytes(std::int64_t count) const noexcept {
    return journal_bytes(count, ring_.pending_index_changes());
  }
  /// The same with `pending` changes of the dense index waiting (reserve_staging's allowance).
  [[nodiscard]] static std::size_t journal_bytes(std::int64_t count,
                                                 std::int64_t pending) noexcept {
    const std::int64_t n = dense_reading<Selection> ? 3 * count + pending : count;
    return static_cast<std::size_t>(n) * sizeof(slot_record);
  }
  /// One apply of the `count` slot records at l.host + offset, with the dense index's pending
  /// changes, written after them now (room: journal_bytes(count) at lease time); applied by
  /// apply_journal_on_device, an insert's scatter (journal_beside) or a gather's last block.
  journal_args journal_of(const staging_pool::lease& l, std::size_t offset, std::int64_t count) {
    const std::size_t index_at = offset + static_cast<std::size_t>(count) * sizeof(slot_record);
    journal_args a;
    a.records = reinterpret_cast<const slot_record*>(l.mapped + offset);
    a.count = count;
    a.index = reinterpret_cast<const index_record*>(l.mapped + index_at);
    a.index_count = ring_.take_index_changes(reinterpret_cast<index_record*>(l.host + index_at));
    a.mirror = mirror();
    a.capacity = capacity_;
    a.live = ring_.live();
    return a;
  }
  [[nodiscard]] static slot_record* records_of(const std::optional<staging_pool::lease>& l) {
    return l ? reinterpret_cast<slot_record*>(l->host) : nullptr;
  }
  /// Gives back a lease the operation did not use (it failed before enqueueing).
  void give_back(const std::optional<staging_pool::lease>& l) noexcept {
    if (l) staging_.give_back(*l);
  }

  /// Orders a write on `stream` after other streams' work; on failure gives lease `l` back, so
  /// the call leaves nothing behind.
  void order_write(const std::optional<staging_pool::lease>& l, cuda::stream_ref stream) {
    try {
      order_before(stream, write);
    } catch (...) {
      give_back(l);
      throw;
    }
  }

  /// Enqueues the apply of `count` records written into lease `l` (GPU buffers), then ends the
  /// lease once the apply has read them.
  void publish(const std::optional<staging_pool::lease>& l, std::int64_t count,
               cuda::stream_ref stream);
  /// Loads the kernel that publishes landing inserts now, while the buffer is made: loaded
  /// lazily at its first launch, it would wait for every kernel running then (a training step).
  void load_publish_kernel();

  void synchronize(cuda::stream_ref stream) const {
    if constexpr (on_device)
      GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    else
      (void)stream;
  }

  /// Throws errc::key_out_of_range unless `slot` is in [0, capacity).
  void check_slot(std::int64_t slot) const {
    GEAR_REQUIRE(
        slot >= 0 && slot < capacity_, errc::key_out_of_range,
        "slot " + std::to_string(slot) + " is outside [0, " + std::to_string(capacity_) + ")");
  }

 private:
  static int current_device() {
    if constexpr (!on_device) {
      return -1;
    } else {
      GEAR_REQUIRE(gpu_available(), errc::no_device,
                   "this storage policy needs a CUDA GPU and none is usable; use "
                   "gear::storage::host on machines without one");
      int d = 0;
      GEAR_CUDA_TRY(cudaGetDevice(&d));
      return d;
    }
  }
};

/// Makes the buffer's device current for a call and restores the caller's afterwards. While it
/// lives, scoped_device (cuda.hpp) names that device, so the call's launches do not ask the
/// runtime for it again (nor does a scope nested in it: a sharded_buffer's shard).
class device_scope {
 public:
  explicit device_scope(int device) {
    if (device < 0) return;
    const int current = current_device();
    if (current != device) {
      GEAR_CUDA_TRY(cudaSetDevice(device));
      previous_ = current;
    }
    outer_ = scoped_device;
    scoped_device = device;
    active_ = true;
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() {
    if (!active_) return;
    scoped_device = outer_;
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      scoped_device = -1;  // the caller's device did not come back: later calls ask the runtime
    }
  }

 private:
  int previous_ = -1, outer_ = -1;  // the device to make current again; scoped_device before
  bool active_ = false;
};

/// The plain (synchronous) calls' wait for their stream, on the buffer's device; refused on a
/// capturing stream.
template <class Core>
void synchronize_call(const Core& b, cuda::stream_ref stream) {
  const device_scope scope(b.device_);
  if constexpr (Core::on_device) refuse_capture(stream);
  b.synchronize(stream);
}

}  // namespace gear::detail

#if defined(GEAR_DEVICE_BACKEND)
#include <gear/detail/buffer/journal.cuh>
#include <gear/detail/buffer/landing_publish.cuh>
#endif

template <class Spec, class Storage, class Selection, class Transport>
void gear::detail::buffer_core<Spec, Storage, Selection, Transport>::load_publish_kernel() {
#if defined(GEAR_DEVICE_BACKEND)
  cudaFuncAttributes attributes{};
  GEAR_CUDA_TRY(cudaFuncGetAttributes(&attributes, landing_publish_kernel<landing_publish_args>));
  GEAR_CUDA_TRY(
      cudaFuncGetAttributes(&attributes, landing_publish_kernel<landing_publish_inline>));
#endif
}

template <class Spec, class Storage, class Selection, class Transport>
void gear::detail::buffer_core<Spec, Storage, Selection, Transport>::publish(
    const std::optional<staging_pool::lease>& l, std::int64_t count, cuda::stream_ref stream) {
  if constexpr (on_device) {
#if defined(GEAR_DEVICE_BACKEND)
    apply_journal_on_device(journal_of(*l, 0, count), stream);
    staging_.release_after(*l, stream.get());
#else
    static_assert(dependent_false<Storage>,
                  "gear: GPU storage needs <gear/gear.cuh>, compiled by nvcc");
#endif
  } else {
    (void)l, (void)count, (void)stream;
  }
}
