#pragma once
// The selection policy concept.
//
// A selection policy decides which stored trajectories a sampled batch takes. It is a small value
// type (its run-time settings, e.g. uniform{.replacement = false}) with a nested class template
//
//   template <class Space> class state;      // Space is gear::exec::host or gear::exec::device
//
// The buffer owns one state<Space> for the side where it selects (host for all-pageable storage,
// device otherwise), built as state(policy, capacity). A state provides
//
//   void validate(const slot_table& table, std::int64_t batch) const;
//       throw gear::error (and change nothing) if `batch` rows cannot be selected from `table`,
//       e.g. errc::not_enough_items without replacement;
//   void select(const slot_table& table, const selection_request& request, cuda::stream_ref s);
//       write request.batch slot indices, each of a committed slot (length > 0), to request.slots,
//       with their selection probabilities and importance weights, in the memory of Space; on the
//       device this is stream-ordered on s and must not synchronise. Every loop must be bounded
//       with a correct fallback; -1 (a row with no trajectory: mask 0, ticket no_ticket) only when
//       no committed slot is left to take. gear's own policies never return it while one exists.
//
// and may provide hooks the buffer calls when slots change, detected with `requires`:
//
//   void on_commit(const slot_table& table, std::uint64_t first_ticket, std::int64_t count,
//                  cuda::stream_ref s);   // slots of tickets [first_ticket, +count) went live
//   void on_evict(const slot_table& table, std::uint64_t first_ticket, std::int64_t count,
//                 cuda::stream_ref s);    // those slots are about to be overwritten or
//                                         // removed (erase, max_times_sampled)
//
//   void update(const slot_table& table, std::span<const key> keys,
//               std::span<const float> priorities, cuda::stream_ref s);
//       priorities for live keys (already checked by the buffer); replay_buffer::update_priorities
//       exists only for policies that provide it;
//   void update_from_device(const slot_table& table, key_owner owner,
//                           std::span<const key> keys, std::span<const float> priorities,
//                           cuda::stream_ref s[, std::uint32_t siblings]);
//   void raise_update_failures();
//       (device states; both or neither) the same from GPU-readable memory, not checked by the
//       buffer: the state checks each key against table (device lengths, tickets) and owner (shard
//       and incarnation), and each priority, on the GPU in stream order without synchronising; an
//       update with a bad pair changes nothing, and raise_update_failures() throws the earliest
//       failure not yet thrown whose kernels have finished, without waiting. update_priorities with
//       memory_kind::device exists for such policies (others: errc::wrong_memory). A state
//       with the last parameter serves sharded_buffer's shards: a good pair whose key names
//       shard [0, siblings) other than owner's, same incarnation, is skipped, not counted;
//
// A device state may also provide, for a policy whose draw of each row is a pure function of the
// row, request.draw and the state at the call (it reads metadata and the policy's own arrays and
// writes nothing):
//
//   std::optional<F> row_selector(const slot_table& table, const selection_request& request) const;
//       F is trivially copyable (or a std::variant of such types) and gives the same row,
//       probability and weight as select() would. sample() then draws inside the gather kernel
//       when the gather fits tuning::fused_gather_max_waves waves of blocks, one launch instead of
//       two: every block that copies part of a row draws that row itself, and one of them writes
//       it to the request's outputs. F says how it is called by the operator it has:
//         `__device__ gear::selected_row operator()(std::int64_t row) const` alone: every thread
//           of the block calls it once, with the block's one row (so F may work as a block), and
//           a block copies one row;
//         the same with `static constexpr bool per_thread = true;`: F is a pure function of the
//           row that a thread may call on its own; rows of at most 8 KiB then share a block
//           (gear::row_group), each thread calling F for its group's row, rows of the batch only;
//         `__device__ gear::selected_row operator()(std::int64_t row, const gear::row_group& g)
//           const`: rows share blocks too, and every thread of the block calls F once with its
//           group's row and g, groups past the batch's last row as well (g.active false, their
//           results unused), so F may use block barriers and shared arrays of
//           row_group::max_groups entries, one per group.
//       F may have `E epilogue() const`, work that the gather's last block runs once every block
//       has drawn its row (uniform without replacement clears its claims there; E as the
//       epilogues of gather.cuh: `static constexpr bool present = true`, the batch's `arrivals`
//       word, and a `__device__ void operator()() const`). std::nullopt makes the buffer call
//       select().
//
// A device state whose rows are chosen on the host (fifo, lifo) may provide
//
//   std::span<const std::int64_t> host_rows() const;
//       the slots the last selection wrote to request.slots, in host memory, valid until the
//       next one. A sample that removes what it returns counts them from here, without reading
//       the slots back from the GPU (which synchronises the stream).
//   template <class Launch>
//   void with_chosen_rows(const slot_table& table, const selection_request& request,
//                         cuda::stream_ref stream, Launch&& launch);
//       chooses the rows as select() would, into memory the GPU reads, and calls launch(F) with
//       them as a row function (as row_selector's F) to enqueue the kernels that read them (the
//       gather reads them itself); that memory is reused only after those kernels. Where the
//       request has chosen_rows_host (a sample that removes what it returns), the rows go there
//       instead, and the buffer keeps that memory until the gather has read them: kernels that
//       select() enqueues ahead of the gather may read them too, none enqueued after it.
//
// A device state may let the host know a sample's rows before it is enqueued:
//
//   bool mirrors() const;
//   bool stages_mirror() const;
//   std::span<const std::int64_t> mirror_rows(const slot_table& host_view,
//                                             const selection_request& request);
//       mirrors() says whether it does; mirror_rows() then draws the rows on the host, from
//       host_view (the table as of the call, whose dense, lengths and tickets are the host's
//       copies), into host memory valid until its next call. A sample under
//       set_max_times_sampled counts its rows from there, where it would read them back from
//       the GPU (which synchronises the stream). Without stages_mirror() the GPU draws the same
//       rows itself (uniform with replacement: each row a pure function of the draw and the
//       dense index); with it, the buffer copies them to request.chosen_rows_host before the
//       launch, and the state's kernels (select() and row_selector's F) take the rows from
//       request.chosen_rows_device where it is set (uniform without replacement, whose claims
//       the GPU orders by timing; recency, whose age draws use exp and log functions that may
//       round differently there: detail::staged_rows). Either way the rows counted must be
//       exactly those the GPU returns: a row counted that the GPU did not return removes the
//       wrong trajectory. A derived state whose select() or row_selector draws rows of its own
//       (of uniform or recency, which mirror) must say mirrors() false: its rows are then read
//       back.
//
// A device state that stages host data of its own may provide
//
//   void reserve_staging(std::int64_t batch);
//       allocates now what calls of up to `batch` rows or pairs will lease (see gear::call_limits);
//       throws with the state as it was.
//
// A device state may declare `static constexpr bool reads_device_counts = true;`: its kernels (and
// its row_selector's F, through a member `void read_device_counts()` called in the kernel) call
// detail::read_device_counts on their copies of the table and request before using table.live or
// request.draw, and read nothing else the host computed from the buffer's contents at the call.
// Only such policies sample with a gear::device_rng (CUDA graphs): a replay must draw anew, from
// what the buffer holds when it runs.
//
// A policy may also declare `static constexpr bool consumes = true;`: the buffer then removes every
// trajectory a sample returns (each is returned once), as a queue or stack does. Its state may
// provide
//
//   void on_consumed() noexcept;
//       the rows the last selection returned have all been removed (called once the removal has
//       changed the ring, never after a call that failed before it; it must not throw, which a
//       static_assert checks): a queue moves its cursor past them, a stack links over them, where
//       the next selection would find them one by one.
//   std::span<const gear::ticket_run> chosen_runs() const;
//       the tickets of the last selection's rows as runs of consecutive tickets, in any order:
//       exactly the rows' tickets (each committed, none twice), written by every selection,
//       unchanged by on_evict, and empty where the last selection did not make them (a derived
//       state whose select chooses its own rows must clear them). The buffer plans the removal
//       run by run from them, where it would look up and sort each row's ticket; it takes them
//       only if they hold as many tickets as there are rows and the first row's ticket ends the
//       first run, else it plans from the rows.
//
// A policy that never reads slot_table::dense may declare `static constexpr bool reads_dense =
// false;`: the buffer then keeps no dense index of committed slots (it saves the index's upkeep,
// a few scattered host writes per insert and removal and their copies to the device; the device
// array is still allocated), and the table's `dense` is null. A policy derived from one that
// declares it (fifo, lifo, recency) inherits the declaration: one that reads the index, e.g. in a
// uniform fallback, declares `reads_dense = true` again.
//
// Each optional part has a concept of its own at the bottom of this file (commit_hook,
// evict_hook, consumed_hook, host_priority_update, device_priority_update, row_selecting,
// host_chosen_rows, host_chosen_runs, host_row_choosing, host_row_mirroring, staging_reserving,
// consuming_policy, device_counted, dense_reading); the buffer asks for them by name.
//
// Every part runs inside a buffer call, with the buffer's device current: it must leave the current
// device as it found it (the call's launches go to the device the call made current).
//
// slot_table points at metadata in the memory of Space (and at the host's copy of the lengths).
// Ticket t (an insertion sequence number) lives in slot t % capacity. A user-written policy follows
// the same contract and plugs in as the third template argument of replay_buffer, with no change to
// gear.

#include <concepts>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/key.hpp>
#include <gear/rng.hpp>
#include <span>

namespace gear {

/// Where a policy's state runs.
namespace exec {
struct host {};
struct device {};
}  // namespace exec

/// Per-slot metadata as selection sees it (in the memory of the selecting side).
struct slot_table {
  const std::int64_t* lengths = nullptr;   ///< committed length; 0 if empty, pending or removed
  const std::uint64_t* tickets = nullptr;  ///< ticket of each slot's latest reservation
  /// [live]: every committed slot once, any order; null for a policy that declares
  /// `reads_dense = false`
  const std::int64_t* dense = nullptr;
  std::int64_t capacity = 0;      ///< number of slots
  std::int64_t occupied = 0;      ///< slots [0, occupied) have ever been reserved
  std::int64_t live = 0;          ///< committed slots (length > 0)
  std::uint64_t next_ticket = 0;  ///< ticket the next reservation gets
  /// Device memory, or null: the live count as of stream order (the device mirror's). Set for
  /// samples drawn with a gear::device_rng, which CUDA graphs replay: their kernels take `live`
  /// from here (detail::read_device_counts), not from the host's count at the call.
  const std::int64_t* live_at = nullptr;
  const std::int64_t* host_lengths = nullptr;   ///< the host's copy of lengths (host memory always)
  const std::uint64_t* host_tickets = nullptr;  ///< the host's copy of tickets (host memory)
  /// The host's slot states (host memory): 0 empty (never used, abandoned or removed), 1 pending,
  /// 2 committed.
  const std::uint8_t* host_states = nullptr;
};

/// What select() must produce.
struct selection_request {
  std::int64_t batch = 0;            ///< rows to select
  rng_draw draw{};                   ///< this call's random numbers
  std::int64_t* slots = nullptr;     ///< out: [batch] selected slots
  float* probabilities = nullptr;    ///< out: [batch] probability each row had of being drawn
  float* weights = nullptr;          ///< out: [batch] importance weights (1 where not applicable)
  std::uint64_t* scratch = nullptr;  ///< workspace of scratch_size words, contents unspecified:
                                     ///< a policy that needs zeros clears what it uses
  std::int64_t scratch_size = 0;     ///< a power of two >= 2 * batch
  /// In the memory of Space (device memory for GPU buffers), or null: scratch_size words that are
  /// all 0 when the selection starts; a selection that uses them (uniform's claim table without
  /// replacement) leaves them all 0.
  std::uint64_t* claims = nullptr;
  /// In the memory of Space, or null: a word that is 0 when the selection starts. A kernel may
  /// count its blocks' arrivals in it (detail::last_block_to_arrive), so that its last block
  /// finishes the batch in the same launch; the word must be 0 again when it ends. gear's
  /// batches keep claims and arrivals (detail::selection_workspace); one batch is filled by one
  /// sample at a time.
  unsigned* arrivals = nullptr;
  /// Device memory, or null: this call's draw number (a gear::device_rng's). Kernels take
  /// draw.call from here (detail::read_device_counts).
  const std::uint64_t* call_at = nullptr;
  /// Mapped pinned memory with room for `batch` rows, or null: where a state that chooses rows on
  /// the host (with_chosen_rows) may put them for the launch instead of its own staging, or where
  /// the buffer staged the rows of a state's mirror_rows (stages_mirror): the CPU's address and
  /// the GPU's. The caller keeps it until the gather has read them (so only kernels enqueued
  /// before the gather's may read them).
  std::int64_t* chosen_rows_host = nullptr;
  const std::int64_t* chosen_rows_device = nullptr;
};

namespace detail {

/// In a kernel of a sample drawn with a gear::device_rng: takes the live count and the draw's
/// call number from device memory, as they are when the kernel runs. Kernels of such samples
/// call it on their own copies of `t` and `r` before they use them; elsewhere it does nothing.
GEAR_HD inline void read_device_counts(slot_table& t, selection_request& r) noexcept {
#if defined(__CUDA_ARCH__)
  if (t.live_at != nullptr) t.live = *t.live_at;
  if (r.call_at != nullptr) r.draw.call = *r.call_at;
#else
  (void)t, (void)r;
#endif
}

}  // namespace detail

/// The threads of a gather block that copy one sampled row: rows of at most 8 KiB share a block,
/// a group of whole warps each. A row_selector's F with operator()(row, const row_group&) gets the
/// calling thread's group (see the top of this file).
struct row_group {
  static constexpr int max_groups = 8;  ///< most rows (groups) in one block
  int group = 0;                        ///< the row's index among the block's rows, < max_groups
  int lane = 0;                         ///< the calling thread's index in the group
  int threads = 0;                      ///< threads in the group (a multiple of 32)
  bool active = true;  ///< false past the batch's last row: F is called, its result unused
};

/// One row of a selection, as a row_selector gives it.
struct selected_row {
  std::int64_t slot = -1;    ///< the selected slot; -1 if none could be drawn
  float probability = 0.0f;  ///< probability the row had of being drawn
  float weight = 1.0f;       ///< importance weight
};

template <class P, class Space>
concept selection_policy_for = std::copy_constructible<P> &&
    requires(typename P::template state<Space>& s, const slot_table& t, const selection_request& r,
             cuda::stream_ref stream) {
  typename P::template state<Space>;
  {s.validate(t, std::int64_t{})};
  {s.select(t, r, stream)};
};

// ---- the optional parts of a state, by name (see the top of this file) ------------------------

/// on_commit: told when slots go live.
template <class State>
concept commit_hook = requires(State& s, const slot_table& t, std::uint64_t first,
                               std::int64_t count, cuda::stream_ref stream) {
  s.on_commit(t, first, count, stream);
};
/// on_evict: told before slots are overwritten or removed.
template <class State>
concept evict_hook = requires(State& s, const slot_table& t, std::uint64_t first,
                              std::int64_t count, cuda::stream_ref stream) {
  s.on_evict(t, first, count, stream);
};
/// update: priorities from host spans (replay_buffer::update_priorities exists).
template <class State>
concept host_priority_update = requires(State& s, const slot_table& t, std::span<const key> k,
                                        std::span<const float> p, cuda::stream_ref stream) {
  s.update(t, k, p, stream);
};
/// update_from_device and raise_update_failures: priorities from GPU-readable memory.
template <class State>
concept device_priority_update = requires(State& s, const slot_table& t, std::span<const key> k,
                                          std::span<const float> p, cuda::stream_ref stream) {
  s.update_from_device(t, key_owner{}, k, p, stream);
  s.raise_update_failures();
};
/// row_selector: rows drawn inside the gather kernel.
template <class State>
concept row_selecting = requires(const State& s, const slot_table& t, const selection_request& r) {
  s.row_selector(t, r);
};
/// on_consumed: told that the rows the last selection returned were all removed.
template <class State>
concept consumed_hook = requires(State& s) {
  s.on_consumed();
};
/// host_rows: the last selection's slots, chosen on the host, kept there.
template <class State>
concept host_chosen_rows = requires(const State& s) {
  { s.host_rows() } -> std::convertible_to<std::span<const std::int64_t>>;
};
/// chosen_runs: the last selection's rows as runs of consecutive tickets (consuming policies).
template <class State>
concept host_chosen_runs = requires(const State& s) {
  { s.chosen_runs() } -> std::convertible_to<std::span<const ticket_run>>;
};
namespace detail {
/// A launch that takes any row function and enqueues nothing (host_row_choosing's probe).
struct no_launch {
  template <class F>
  void operator()(const F&) const noexcept {}
};
}  // namespace detail
/// with_chosen_rows: rows chosen on the host, read by the gather kernel itself.
template <class State>
concept host_row_choosing = requires(State& s, const slot_table& t, const selection_request& r,
                                     cuda::stream_ref stream) {
  s.with_chosen_rows(t, r, stream, detail::no_launch{});
};
/// mirrors, stages_mirror and mirror_rows: a sample's rows known on the host before the launch.
template <class State>
concept host_row_mirroring = requires(State& s, const State& cs, const slot_table& t,
                                      const selection_request& r) {
  { cs.mirrors() } -> std::convertible_to<bool>;
  { cs.stages_mirror() } -> std::convertible_to<bool>;
  { s.mirror_rows(t, r) } -> std::convertible_to<std::span<const std::int64_t>>;
};
/// reserve_staging: the state's own staging, allocated ahead of the calls.
template <class State>
concept staging_reserving = requires(State& s, std::int64_t batch) {
  s.reserve_staging(batch);
};
/// `static constexpr bool reads_device_counts = true`: samples with a gear::device_rng.
template <class State>
concept device_counted = requires {
  { State::reads_device_counts } -> std::convertible_to<bool>;
}
&&State::reads_device_counts;
/// `static constexpr bool consumes = true`: every trajectory a sample returns is removed.
template <class Policy>
concept consuming_policy = requires {
  { Policy::consumes } -> std::convertible_to<bool>;
}
&&Policy::consumes;
/// Reads slot_table::dense: every policy but one that declares `reads_dense = false`.
template <class Policy>
concept dense_reading = !requires {
  { Policy::reads_dense } -> std::convertible_to<bool>;
}
|| Policy::reads_dense;

}  // namespace gear
