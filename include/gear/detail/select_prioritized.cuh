#pragma once
// Device side of gear::select::prioritized: the sum tree in device memory.
//
// Selection: a group of 16 lanes per row descends the tree (D - 1 coalesced line reads, D =
// levels), and the last block to finish writes the weights (for batches over 2048 rows, every
// block after a grid-wide barrier where the grid fits on the GPU, else a second launch):
// O(B log N), stream-ordered, no synchronisation (sum_tree_select.cuh). Batches the gather draws
// itself (prioritized_gather.cuh) descend the same way inside the gather, whose last block
// writes the weights.
//
// Update of B (slot, priority) pairs, O(B log N), two launches:
//   mark:  (pairs from device memory only) checks its key against the slot metadata and its
//          priority; a bad pair folds (class, index, errc) into this update's verdict word with
//          atomicMin, so the verdict names the first bad key, or else the first bad priority (the
//          host check's order), and the pair stops. Every good pair bids
//          atomicMax(winner[slot], index + 1), so the last occurrence of a slot in the batch wins;
//          and sets, for each tree edge on its leaf's path, the child's bit in the low 16 bits of
//          flags[parent], with reductions nobody waits for (the levels near the root, which every
//          path shares, pooled per block in shared memory first).
//   apply: a group of 16 lanes per pair. Reads the verdict (final: mark has finished). The winner
//          of each slot clears its winner word (for the next update, even a failed one's), writes
//          its raw priority and leaf, then walks up: at each parent it sets
//          its bit in the high 16 bits (arrivals); the group whose arrival completes the parent's
//          mark set (the last of the touched children to finish) loads the 16 children in one
//          line and recomputes the parent as their sum in index order,
//          clears the parent's flags for the next call, and continues; the others stop. So each
//          touched node is recomputed exactly once, after all its touched children, with the same
//          fp64 additions as the host tree. Every pair folds its priority into the device-side
//          largest priority (a warp maximum, then one atomicMax per warp on the float's bits).
//          With a failed verdict nothing is written: the winners still walk up, but only to clear
//          the flags; the bad pair's thread writes a failure record to mapped pinned memory
//          (priority_report), which the host reads without synchronising.
// Commit and eviction use the same two launches over a range of ring slots with one priority; a
// commit reads its priority (the largest so far) from device memory when it runs, so it sees
// every update ordered before it on the stream.
//
// The epoch (updates so far) lives on the device: each mark reads it and its last block to finish
// advances it, so replays of a captured update (CUDA graphs) count as eager calls do, and the
// host keeps no copy. The verdict words alternate by epoch parity: the apply of update e clears
// the word of update e + 1, which no kernel reads until update e + 1's mark, so no launch and no
// memset is spent on resetting them. This holds while every mark is followed by its apply: a
// launch that fails between them leaves flags set, and the buffer that enqueued it marks itself
// unusable.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>
#include <gear/detail/prioritized_gather.cuh>
#include <gear/detail/priority_kernels.cuh>
#include <gear/detail/staging_ring.hpp>
#include <gear/detail/sum_tree.hpp>
#include <gear/detail/sum_tree_select.cuh>
#include <gear/detail/tuning.hpp>
#include <gear/select/prioritized.hpp>
#include <new>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace gear::select {

/// Device side: the sum tree and its bookkeeping in device memory (about 8 + 4 + 8 bytes per slot
/// plus 8.6 bytes of internal nodes and flags). Every call is stream-ordered and returns without
/// synchronising, except the inspection calls (nodes, priorities, total, max_priority,
/// stale_pairs, priority_range) and set_exponents with a new alpha, which synchronise; update()
/// waits for the device when it outgrows its device copy of the pairs.
///
/// Updates come two ways. update() takes host spans, checked on the host before anything is
/// enqueued (it throws at once). update_from_device() takes keys and priorities in GPU-readable
/// memory and checks them on the GPU, in the same launches: an update with a bad pair changes
/// nothing (tree, raw priorities, largest priority) and is recorded as a failure, which
/// raise_update_failures() throws later on the host without synchronising.
template <>
class prioritized::state<exec::device> {
 public:
  /// Its kernels take the draw (and, for an all-zero tree, the live count) from device memory
  /// (gear::device_rng); the tree is device state already.
  static constexpr bool reads_device_counts = true;

  /// Allocates and clears the tree (synchronously, on a private stream). Throws
  /// errc::invalid_argument for bad exponents, errc::out_of_memory, errc::cuda_error.
  state(const prioritized& policy, std::int64_t capacity)
      : policy_(policy), capacity_(capacity), shape_(detail::make_sum_tree_shape(capacity)) {
    detail::validate_exponents(policy.alpha, policy.beta);
    const auto cap = static_cast<std::size_t>(capacity);
    nodes_ = detail::allocation(memory_kind::device,
                                static_cast<std::size_t>(shape_.total) * sizeof(double));
    raw_ = detail::allocation(memory_kind::device, cap * sizeof(float));
    winner_ = detail::allocation(memory_kind::device, cap * sizeof(unsigned long long));
    flags_ = detail::allocation(
        memory_kind::device,
        static_cast<std::size_t>(std::max<std::int64_t>(shape_.internal(), 1)) * sizeof(unsigned));
    status_ = detail::allocation(memory_kind::device, sizeof(detail::priority_status));
    report_ = detail::allocation(memory_kind::pinned_host, sizeof(detail::priority_report));
    new (report_.data()) detail::priority_report{};
    detail::priority_status status{};
    status.verdict[0] = status.verdict[1] = detail::priority_ok;
    status.failures = 0;
    status.stale = 0;
    status.max_priority = 1.0f;
    status.marked = 0;
    status.epoch = 0;
    cudaStream_t init{};
    GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&init, cudaStreamNonBlocking));
    cudaError_t result = cudaMemsetAsync(nodes_.data(), 0, nodes_.size(), init);
    if (result == cudaSuccess) result = cudaMemsetAsync(raw_.data(), 0xFF, raw_.size(), init);
    if (result == cudaSuccess) result = cudaMemsetAsync(winner_.data(), 0, winner_.size(), init);
    if (result == cudaSuccess) result = cudaMemsetAsync(flags_.data(), 0, flags_.size(), init);
    if (result == cudaSuccess)
      result =
          cudaMemcpyAsync(status_.data(), &status, sizeof status, cudaMemcpyHostToDevice, init);
    if (result == cudaSuccess) result = cudaStreamSynchronize(init);
    GEAR_CUDA_TRY(cudaStreamDestroy(init));
    GEAR_CUDA_TRY(result);
  }

  // ---- settings ----------------------------------------------------------------------------

  /// Sets the exponents. A changed alpha recomputes every leaf and internal node on the device
  /// (levels launches, O(capacity)). Throws errc::invalid_argument, errc::cuda_error.
  void set_exponents(double alpha, double beta, cuda::stream_ref stream) {
    detail::validate_exponents(alpha, beta);
    const bool rebuild = alpha != policy_.alpha;
    if (rebuild) {  // the stored priorities' range, reduced on the GPU (this synchronises)
      const auto [smallest, largest] = priority_range(stream);
      detail::validate_alpha_change(alpha, smallest, std::max(largest, max_priority(stream)),
                                    capacity_);
    }
    policy_.alpha = alpha;
    policy_.beta = beta;
    if (!rebuild) return;
    constexpr int threads = detail::tuning::priority_update_threads;
    detail::priority_leaves_kernel<<<detail::blocks_for(capacity_, threads), threads, 0,
                                     stream.get()>>>(tree(), alpha, capacity_);
    GEAR_CHECK_LAUNCH("priority_leaves_kernel");
    for (int d = shape_.levels - 2; d >= 0; --d) {
      detail::sum_tree_level_kernel<<<detail::blocks_for(shape_.count[d], threads), threads, 0,
                                      stream.get()>>>(tree(), d);
      GEAR_CHECK_LAUNCH("sum_tree_level_kernel");
    }
  }
  [[nodiscard]] double alpha() const noexcept { return policy_.alpha; }
  [[nodiscard]] double beta() const noexcept { return policy_.beta; }
  /// The settings as they are now.
  [[nodiscard]] const prioritized& policy() const noexcept { return policy_; }

  // ---- inspection (tests, diagnostics; synchronise the stream) -----------------------------

  [[nodiscard]] const detail::sum_tree_shape& shape() const noexcept { return shape_; }
  /// A host copy of the whole node array.
  [[nodiscard]] std::vector<double> nodes(cuda::stream_ref stream) const {
    std::vector<double> out(static_cast<std::size_t>(shape_.total));
    GEAR_CUDA_TRY(cudaMemcpyAsync(out.data(), nodes_.data(), nodes_.size(), cudaMemcpyDeviceToHost,
                                  stream.get()));
    GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    return out;
  }
  /// A host copy of the raw priorities (negative or NaN: no committed trajectory).
  [[nodiscard]] std::vector<float> priorities(cuda::stream_ref stream) const {
    std::vector<float> out(static_cast<std::size_t>(capacity_));
    GEAR_CUDA_TRY(cudaMemcpyAsync(out.data(), raw_.data(), raw_.size(), cudaMemcpyDeviceToHost,
                                  stream.get()));
    GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    return out;
  }
  /// Where the root lives in device memory (sum of p^alpha; read it in stream order).
  [[nodiscard]] const double* root_data() const noexcept { return nodes_.as<const double>(); }
  /// The root: sum of p^alpha over committed trajectories.
  [[nodiscard]] double total(cuda::stream_ref stream) const {
    double root = 0;
    GEAR_CUDA_TRY(
        cudaMemcpyAsync(&root, nodes_.data(), sizeof root, cudaMemcpyDeviceToHost, stream.get()));
    GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    return root;
  }
  /// The smallest positive and the largest raw priority stored (infinity and 0 with none), reduced
  /// on the GPU; synchronises the stream.
  [[nodiscard]] std::pair<float, float> priority_range(cuda::stream_ref stream) const {
    constexpr int threads = detail::tuning::priority_update_threads;
    detail::allocation out(memory_kind::device, 2 * sizeof(unsigned));
    const unsigned start[2] = {0x7F800000u, 0u};  // +infinity, +0 as bits
    GEAR_CUDA_TRY(
        cudaMemcpyAsync(out.data(), start, sizeof start, cudaMemcpyHostToDevice, stream.get()));
    const auto blocks =
        static_cast<unsigned>(std::min<std::int64_t>(detail::blocks_for(capacity_, threads), 1024));
    detail::priority_range_kernel<threads><<<blocks, threads, 0, stream.get()>>>(
        raw_.as<const float>(), capacity_, out.as<unsigned>());
    GEAR_CHECK_LAUNCH("priority_range_kernel");
    unsigned bits[2] = {};
    GEAR_CUDA_TRY(
        cudaMemcpyAsync(bits, out.data(), sizeof bits, cudaMemcpyDeviceToHost, stream.get()));
    GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    float range[2];
    std::memcpy(range, bits, sizeof range);
    return {range[0], range[1]};
  }

  /// The priority new trajectories enter with: max(1, the largest given so far by updates that
  /// succeeded). Kept in device memory, folded by the update kernels; this reads it
  /// after the stream's earlier work (synchronises).
  [[nodiscard]] float max_priority(cuda::stream_ref stream) const {
    float largest = 0;
    GEAR_CUDA_TRY(cudaMemcpyAsync(&largest,
                                  status_.data() + offsetof(detail::priority_status, max_priority),
                                  sizeof largest, cudaMemcpyDeviceToHost, stream.get()));
    GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    return largest;
  }

  // ---- the selection concept ---------------------------------------------------------------

  void validate(const slot_table&, std::int64_t) const {}

  void select(const slot_table& t, const selection_request& r, cuda::stream_ref stream) {
    using w = detail::select_weights;
    (void)select(t, r, stream,
                 r.arrivals != nullptr && r.batch <= detail::tuning::select_fused_weights_max_rows
                     ? w::last_block
                 : detail::tuning::select_weights_grid_sync ? w::grid_sync
                                                            : w::second_launch);
  }
  /// The gather kernel draws the rows itself (detail/prioritized_gather.cuh) where its last block
  /// can write the weights: an arrivals word and at most select_fused_weights_max_rows rows.
  [[nodiscard]] std::optional<detail::prioritized_gather_rows> row_selector(
      const slot_table& t, const selection_request& r) const {
    if (r.arrivals == nullptr || r.scratch_size < 2 * r.batch ||
        r.batch > detail::tuning::select_fused_weights_max_rows)
      return std::nullopt;
    return detail::prioritized_gather_rows{t, r, nodes_.as<const double>(), shape_,
                                           policy_.stratified, policy_.beta};
  }
  /// select(), with the weights written as `how` asks where it can be: last_block needs an
  /// arrivals word, grid_sync a grid resident on the GPU at once and a stream not capturing (a
  /// cooperative launch); otherwise second_launch. Returns the way taken (for tests and the bench).
  detail::select_weights select(const slot_table& t, const selection_request& r,
                                cuda::stream_ref stream, detail::select_weights how) {
    constexpr int threads = detail::tuning::select_threads;
    GEAR_REQUIRE(r.scratch_size >= 2 * r.batch, errc::invalid_argument,
                 "prioritized selection needs 2 scratch words per row: " +
                     std::to_string(r.scratch_size) + " for " + std::to_string(r.batch) + " rows");
    // Each block leaves its smallest leaf in a scratch word: at most batch / 16 blocks.
    const auto blocks = static_cast<unsigned>(
        std::min<std::int64_t>({detail::blocks_for(r.batch * detail::sum_tree_group, threads),
                                detail::tuning::select_max_blocks}));
    const auto* nodes = nodes_.as<const double>();
    if (how == detail::select_weights::last_block && r.arrivals == nullptr)
      how = detail::select_weights::second_launch;
    if (how == detail::select_weights::grid_sync) {
      if (select_with_grid_barrier(t, r, blocks, stream)) return how;
      how = detail::select_weights::second_launch;
    }
    detail::prioritized_select_kernel<threads><<<blocks, threads, 0, stream.get()>>>(
        t, r, nodes, shape_, policy_.stratified, policy_.beta, how);
    GEAR_CHECK_LAUNCH("prioritized_select_kernel");
    if (how == detail::select_weights::last_block) return how;
    detail::prioritized_weights_kernel<threads>
        <<<detail::blocks_for(r.batch, threads), threads, 0, stream.get()>>>(r, nodes, policy_.beta,
                                                                             blocks);
    GEAR_CHECK_LAUNCH("prioritized_weights_kernel");
    return how;
  }

  // ---- hooks the buffer calls --------------------------------------------------------------

  /// Sets the priorities of live keys (checked by the buffer; both spans in host memory). Last
  /// write wins for a slot named twice. The pairs travel through pinned staging with one copy;
  /// the staging is a ring of 4 areas (detail::staging_ring): the call waits on the host only when
  /// the stream is 4 host updates behind, or when the device twin grows (freeing the old one waits
  /// for the device). Each key is
  /// checked again when the update runs: one whose slot was reserved again since is skipped and
  /// counted (stale_pairs).
  /// Throws errc::invalid_priority / errc::invalid_argument before changing anything.
  void update(const slot_table& table, std::span<const key> keys, std::span<const float> priorities,
              cuda::stream_ref stream) {
    detail::validate_priorities(keys, priorities, policy_.alpha, capacity_);
    const auto n = static_cast<std::int64_t>(keys.size());
    if (n == 0) return;
    std::byte* const host = prepare_update(keys.size());
    const std::size_t slot_bytes = staged_offset(keys.size());
    const std::size_t bytes = slot_bytes + static_cast<std::size_t>(n) * sizeof(float);
    std::copy(keys.begin(), keys.end(), reinterpret_cast<key*>(host));
    std::copy(priorities.begin(), priorities.end(), reinterpret_cast<float*>(host + slot_bytes));
    // The device twin is one: updates are stream-ordered, so a copy never overtakes the kernels
    // of the update before it.
    GEAR_CUDA_TRY(
        cudaMemcpyAsync(staged_.data(), host, bytes, cudaMemcpyHostToDevice, stream.get()));
    staging_.copied(stream);
    detail::priority_source src;
    src.keys = staged_.as<const key>();
    src.priorities = reinterpret_cast<const float*>(staged_.data() + slot_bytes);
    src.capacity = capacity_;
    src.count = n;
    src.lengths = table.lengths;
    src.tickets = table.tickets;
    src.owner = {keys.front().shard, keys.front().incarnation};  // the buffer checked every key
    apply(src, stream);
  }

  /// Acquires what update() of `n` pairs needs (the next staging area, once its last copy has
  /// run; the device twin, grown if too small), so that a caller can do it before it changes
  /// anything. update() calls it too; calling it again changes nothing. Returns the area.
  /// Throws errc::out_of_memory, errc::cuda_error.
  std::byte* prepare_update(std::size_t n) {
    const std::size_t bytes = staged_offset(n) + n * sizeof(float);
    // Freeing the old twin (cudaFree) waits for the kernels that may still read it.
    if (staged_.size() < bytes)
      staged_ = detail::allocation(memory_kind::device, std::max(bytes, 2 * staged_.size()));
    return staging_.acquire(bytes);
  }

  /// What host-span updates of up to `batch` pairs need (every staging area, the device twin),
  /// allocated now (replay_buffer::reserve_staging); replacing either waits for the work that
  /// reads it. Throws errc::out_of_memory or errc::cuda_error with the state as it was.
  void reserve_staging(std::int64_t batch) {
    const auto n = static_cast<std::size_t>(batch);
    const std::size_t bytes = staged_offset(n) + n * sizeof(float);
    detail::allocation twin;
    if (staged_.size() < bytes) twin = detail::allocation(memory_kind::device, bytes);
    staging_.reserve(bytes);
    if (twin.size() != 0) staged_ = std::move(twin);
  }

  /// Pairs skipped so far because their key was stale when the update ran (synchronises).
  [[nodiscard]] std::uint64_t stale_pairs(cuda::stream_ref stream) const {
    unsigned long long stale = 0;
    GEAR_CUDA_TRY(cudaMemcpyAsync(&stale, status_.data() + offsetof(detail::priority_status, stale),
                                  sizeof stale, cudaMemcpyDeviceToHost, stream.get()));
    GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    return stale;
  }

  /// Sets priorities from GPU-readable memory (device, managed or mapped pinned; the buffer has
  /// checked the pointers): keys[i] takes priorities[i], last write wins for a slot named twice.
  /// Both arrays are read by the kernels, in stream order (earlier work on the stream may write
  /// them), and must stay valid until then. Two launches, no copy, no synchronisation.
  /// On the GPU, every key is checked against `table` (its device lengths and tickets, as of
  /// stream order) and `owner` (a good pair of a key of shard [0, siblings) other than the
  /// owner's is that sibling shard's: skipped, not counted as stale), every priority for NaN,
  /// negative or infinite: an update with a bad pair changes nothing and is recorded, with its
  /// first bad key (or, if every key is good, its first bad priority), for
  /// raise_update_failures().
  /// Throws at once (changing nothing) errc::invalid_argument (sizes differ, 2^32 pairs or more),
  /// errc::cuda_error.
  void update_from_device(const slot_table& table, key_owner owner, std::span<const key> keys,
                          std::span<const float> priorities, cuda::stream_ref stream,
                          std::uint32_t siblings = 0) {
    GEAR_REQUIRE(keys.size() == priorities.size(), errc::invalid_argument,
                 "update_priorities needs one priority per key: " + std::to_string(keys.size()) +
                     " keys, " + std::to_string(priorities.size()) + " priorities");
    GEAR_REQUIRE(keys.size() < (std::size_t{1} << 32), errc::invalid_argument,
                 "update_priorities takes fewer than 2^32 keys at once");
    if (keys.empty()) return;
    detail::priority_source src;
    src.keys = keys.data();
    src.priorities = priorities.data();
    src.capacity = capacity_;
    src.count = static_cast<std::int64_t>(keys.size());
    src.lengths = table.lengths;
    src.tickets = table.tickets;
    src.owner = owner;
    src.siblings = siblings;
    src.call = device_calls_ + 1;
    apply(src, stream);
    ++device_calls_;
  }

  /// Throws the earliest failed update_from_device whose kernels have finished and that has not
  /// been raised yet, as gear::error with its code (errc::key_out_of_range, errc::stale_key,
  /// errc::invalid_priority) and a message naming the call and the bad pair's index; later
  /// failures seen at the same time are counted in that message and raised with it. Never
  /// synchronises: synchronise the stream first to see every failure enqueued before.
  void raise_update_failures() {
    detail::raise_priority_failures(*report_.as<detail::priority_report>(), failures_raised_,
                                    capacity_);
  }

  void on_commit(const slot_table& t, std::uint64_t first_ticket, std::int64_t count,
                 cuda::stream_ref stream) {
    detail::priority_source src = ring(t, first_ticket, count, 0);
    src.fill_from = &status_.as<detail::priority_status>()->max_priority;
    apply(src, stream);
  }

  void on_evict(const slot_table& t, std::uint64_t first_ticket, std::int64_t count,
                cuda::stream_ref stream) {
    apply(ring(t, first_ticket, count, detail::no_priority), stream);
  }

 private:
  /// The selection as one cooperative launch whose blocks write their own rows' weights after a
  /// grid-wide barrier. Returns false, launching nothing, where that cannot run: a GPU without
  /// cooperative launches, a grid larger than the GPU holds at once, a capturing stream.
  bool select_with_grid_barrier(const slot_table& t, const selection_request& r, unsigned blocks,
                                cuda::stream_ref stream) {
    constexpr int threads = detail::tuning::select_threads;
    const auto kernel = detail::prioritized_select_kernel<threads, selection_request, true>;
    if (resident_blocks_ < 0) {  // asked once: how many of its blocks the GPU holds at once
      int device = 0, cooperative = 0, per_sm = 0;
      GEAR_CUDA_TRY(cudaGetDevice(&device));
      GEAR_CUDA_TRY(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device));
      GEAR_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
      resident_blocks_ = cooperative != 0 ? std::int64_t{per_sm} * detail::multiprocessors() : 0;
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    GEAR_CUDA_TRY(cudaStreamIsCapturing(stream.get(), &capture));
    if (blocks > resident_blocks_ || capture != cudaStreamCaptureStatusNone) return false;
    slot_table table = t;
    selection_request request = r;
    const double* nodes = nodes_.as<const double>();
    detail::sum_tree_shape shape = shape_;
    bool stratified = policy_.stratified;
    double beta = policy_.beta;
    auto how = detail::select_weights::grid_sync;
    void* args[] = {&table, &request, &nodes, &shape, &stratified, &beta, &how};
    const cudaError_t launched = cudaLaunchCooperativeKernel(
        reinterpret_cast<const void*>(kernel), dim3(blocks), dim3(threads), args, 0, stream.get());
    if (launched != cudaErrorCooperativeLaunchTooLarge) {
      GEAR_CUDA_TRY(launched);
      return true;
    }
    (void)cudaGetLastError();  // the GPU is shared (MPS, green contexts): never again
    resident_blocks_ = 0;
    return false;
  }

  static detail::priority_source ring(const slot_table& t, std::uint64_t first, std::int64_t count,
                                      float fill) noexcept {
    detail::priority_source src;
    src.first_ticket = first;
    src.capacity = t.capacity;
    src.fill = fill;
    src.count = count;
    return src;
  }

  /// Where the priorities start in the staging of n pairs (after the keys, 256-byte aligned).
  static std::size_t staged_offset(std::size_t n) noexcept {
    return (n * sizeof(key) + 255) / 256 * 256;
  }

  [[nodiscard]] detail::priority_tree tree() const noexcept {
    return {nodes_.as<double>(),
            raw_.as<float>(),
            winner_.as<unsigned long long>(),
            flags_.as<unsigned>(),
            status_.as<detail::priority_status>(),
            reinterpret_cast<detail::priority_report*>(report_.device_data()),
            shape_};
  }

  /// The two update launches (see the top of this file).
  void apply(const detail::priority_source& src, cuda::stream_ref stream) {
    if (src.count <= 0) return;
    constexpr int threads = detail::tuning::priority_update_threads;
    // Both as programmatic dependents: the apply is placed while the mark finishes.
    detail::launch_dependent<detail::priority_mark_kernel<detail::priority_tree>>(
        dim3(detail::blocks_for(src.count, threads)), dim3(threads), stream.get(), src, tree(),
        policy_.alpha);
    detail::launch_dependent<detail::priority_apply_kernel<detail::priority_tree>>(
        dim3(detail::blocks_for(src.count * detail::sum_tree_group, threads)), dim3(threads),
        stream.get(), src, tree(), policy_.alpha);
  }

  prioritized policy_;
  std::int64_t capacity_;
  detail::sum_tree_shape shape_;
  std::int64_t resident_blocks_ = -1;  // blocks a cooperative selection may have (-1: not asked
                                       // yet; 0: none)
  detail::allocation nodes_, raw_, winner_, flags_;
  detail::allocation status_;  // device: detail::priority_status
  detail::allocation report_;  // mapped pinned: detail::priority_report, written by the GPU
  // Host updates' pinned staging (update() fills the next area) and its device twin.
  detail::staging_ring<4> staging_;
  detail::allocation staged_;
  std::uint64_t device_calls_ = 0;     // update_from_device calls enqueued
  std::uint64_t failures_raised_ = 0;  // failures raise_update_failures has thrown
};

}  // namespace gear::select
