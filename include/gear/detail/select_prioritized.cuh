#pragma once
// Device side of gear::select::prioritized: the sum tree in device memory.
//
// Selection: one thread per row descends the tree (D - 1 line reads, D = levels), writes its slot
// and probability and folds its leaf into the batch minimum (an atomicMax on the complemented
// bits of a positive double, in the zeroed scratch word 0); a second launch turns the minimum
// into the weights. Two launches, O(B log N), stream-ordered, no synchronisation.
//
// Update of B (slot, priority) pairs, O(B log N), two launches:
//   mark:  (pairs from device memory only) checks its key against the slot metadata and its
//          priority; a bad pair folds (class, index, errc) into this update's verdict word with
//          atomicMin, so the verdict names the first bad key, or else the first bad priority (the
//          host check's order), and the pair stops. Every good pair bids
//          atomicMax(winner[slot], epoch << 32 | index), so the last occurrence of a slot in the
//          batch wins; and sets, for each tree edge on its leaf's path, the child's bit in the low
//          16 bits of flags[parent]. The first thread to set an edge's bit continues upward, the
//          others stop there.
//   apply: reads the verdict (final: mark has finished). The winner of each slot writes its raw
//          priority and leaf, then walks up: at each parent it sets its bit in the high 16 bits
//          (arrivals); the thread whose arrival completes the parent's mark set (the last of the
//          touched children to finish) recomputes the parent as the sum of its 16 children,
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
// The verdict words alternate by epoch parity: the apply of update e clears the word of update
// e + 1, which no kernel reads until update e + 1's mark, so no launch and no memset is spent on
// resetting them.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cuda/atomic>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>
#include <gear/detail/sum_tree.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/select/prioritized.hpp>
#include <new>
#include <span>
#include <vector>

namespace gear::detail {

static_assert(sum_tree_fanout <= 16, "update flags pack 16 child bits and 16 arrival bits");

/// The pairs of one update: staged host pairs (slots, priorities); pairs from device memory (keys,
/// priorities), checked on the GPU against the slot metadata; or `count` ring slots from
/// first_ticket all taking priority `fill` (read from `fill_from` when the kernel runs, if set).
struct priority_source {
  const std::int64_t* slots = nullptr;
  const key* keys = nullptr;
  const float* priorities = nullptr;
  const float* fill_from = nullptr;
  std::uint64_t first_ticket = 0;
  std::int64_t capacity = 1;
  float fill = 0;
  std::int64_t count = 0;
  // Checks of pairs from device memory (keys != nullptr).
  const std::int64_t* lengths = nullptr;
  const std::uint32_t* generations = nullptr;
  std::uint32_t shard = 0;
  std::uint64_t call = 0;  ///< which update from device memory, for the failure record

  /// The slot of pair i; out of range only for a bad key of an update from device memory.
  GEAR_HD std::int64_t slot(std::int64_t i) const noexcept {
    if (keys != nullptr) return static_cast<std::int64_t>(keys[i].slot);
    return slots != nullptr
               ? slots[i]
               : static_cast<std::int64_t>((first_ticket + static_cast<std::uint64_t>(i)) %
                                           static_cast<std::uint64_t>(capacity));
  }
  GEAR_HD float priority(std::int64_t i) const noexcept {
    return priorities != nullptr ? priorities[i] : fill_from != nullptr ? *fill_from : fill;
  }
};

/// Device-side bookkeeping of the updates (device memory).
struct priority_status {
  unsigned long long verdict[2];  ///< by epoch parity: an update's first bad pair, or priority_ok
  unsigned long long failures;    ///< failed updates from device memory so far
  float max_priority;             ///< the largest priority given so far (1 before any)
};

/// The device arrays of a prioritized state.
struct priority_tree {
  double* nodes = nullptr;               ///< [shape.total] the sum tree
  float* raw = nullptr;                  ///< [capacity] raw priorities (negative/NaN: none)
  unsigned long long* winner = nullptr;  ///< [capacity] last-write-wins bids
  unsigned int* flags = nullptr;         ///< [shape.internal()] touched children | arrivals
  priority_status* status = nullptr;     ///< verdicts, failure count, largest priority
  priority_report* report = nullptr;     ///< device view of the host's failure report (mapped)
  sum_tree_shape shape{};
};

template <class Tree>  // always priority_tree; a template so that headers define it once per use
__global__ void priority_mark_kernel(priority_source src, Tree t, unsigned long long epoch) {
  const std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (i >= src.count) return;
  if (src.keys != nullptr) {
    const unsigned long long verdict =
        check_priority_pair(src.keys[i], src.priorities[i], static_cast<std::uint64_t>(i),
                            src.lengths, src.generations, src.capacity, src.shard);
    if (verdict != priority_ok) {
      atomicMin(t.status->verdict + (epoch & 1), verdict);
      return;  // a bad pair neither bids nor marks
    }
  }
  const std::int64_t slot = src.slot(i);
  atomicMax(t.winner + slot, (epoch << 32) | static_cast<unsigned long long>(i));
  std::int64_t j = slot;
  for (int d = t.shape.levels - 1; d > 0; --d) {
    const unsigned bit = 1u << (j % sum_tree_fanout);
    j /= sum_tree_fanout;
    unsigned* flag = t.flags + t.shape.offset[d - 1] + j;
    if (__ldcg(flag) & bit) break;  // someone else carries this edge upward
    if (atomicOr(flag, bit) & bit) break;
  }
}

/// Records the failed update's first bad pair i for the host: the entry, then (after a system
/// fence) the failure count it polls. One thread of one update: no race.
template <class Tree>
__device__ void priority_record_failure(const priority_source& src, const Tree& t,
                                        unsigned long long verdict, std::int64_t i) {
  const unsigned long long n = t.status->failures;
  priority_failure* f = t.report->log + n % priority_failure_log;
  f->call = src.call;
  f->index = static_cast<std::uint64_t>(i);
  f->bad_key = src.keys[i];
  f->priority = src.priorities[i];
  f->code = static_cast<std::int32_t>(priority_verdict_code(verdict));
  __threadfence_system();
  *static_cast<volatile std::uint64_t*>(&t.report->failures) = n + 1;
  t.status->failures = n + 1;
}

/// Folds the pair priorities of the calling (active) threads into status->max_priority.
template <class Tree>
__device__ void priority_fold_max(const Tree& t, float p) {
  const unsigned bits = p > 0 ? __float_as_uint(p) : 0u;  // -0 counts as 0
  auto* max_bits = reinterpret_cast<unsigned*>(&t.status->max_priority);
#if __CUDA_ARCH__ >= 800
  const unsigned active = __activemask();
  const unsigned top = __reduce_max_sync(active, bits);
  if (static_cast<int>(threadIdx.x % 32) == __ffs(static_cast<int>(active)) - 1)
    atomicMax(max_bits, top);
#else
  atomicMax(max_bits, bits);
#endif
}

template <class Tree>  // always priority_tree; a template so that headers define it once per use
__global__ void priority_apply_kernel(priority_source src, Tree t, unsigned long long epoch,
                                      double alpha) {
  const std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (i >= src.count) return;
  const unsigned long long verdict = t.status->verdict[epoch & 1];
  if (i == 0) t.status->verdict[(epoch & 1) ^ 1] = priority_ok;  // the next update's, unread now
  const bool failed = verdict != priority_ok;
  if (failed && static_cast<std::uint64_t>(i) == priority_verdict_index(verdict))
    priority_record_failure(src, t, verdict, i);
  if (!failed && src.priorities != nullptr) priority_fold_max(t, src.priorities[i]);
  const std::int64_t slot = src.slot(i);
  if (static_cast<std::uint64_t>(slot) >= static_cast<std::uint64_t>(src.capacity)) return;
  if (t.winner[slot] != ((epoch << 32) | static_cast<unsigned long long>(i))) return;
  if (!failed) {
    const float p = src.priority(i);
    t.raw[slot] = p;
    t.nodes[t.shape.leaf(slot)] = priority_leaf(p, alpha);
  }
  std::int64_t j = slot;
  for (int d = t.shape.levels - 1; d > 0; --d) {
    const unsigned bit = 1u << (j % sum_tree_fanout);
    j /= sum_tree_fanout;
    const std::int64_t node = t.shape.offset[d - 1] + j;
    // The arrival releases this child's value; the last arrival acquires every sibling's.
    const unsigned now = cuda::atomic_ref<unsigned, cuda::thread_scope_device>(t.flags[node])
                             .fetch_or(bit << 16, cuda::memory_order_acq_rel) |
                         (bit << 16);
    if ((now >> 16) != (now & 0xFFFFu)) return;  // a touched sibling is still on its way
    if (!failed) {
      const double* child = t.nodes + t.shape.offset[d] + j * sum_tree_fanout;
      double v[sum_tree_fanout];
      for (int c = 0; c < sum_tree_fanout; ++c) v[c] = __ldcg(child + c);
      double sum = 0;
      for (int c = 0; c < sum_tree_fanout; ++c) sum += v[c];
      t.nodes[node] = sum;
    }
    t.flags[node] = 0;
  }
}

template <class Tree>  // always priority_tree; a template so that headers define it once per use
__global__ void priority_leaves_kernel(Tree t, double alpha, std::int64_t capacity) {
  const std::int64_t slot = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (slot >= capacity) return;
  t.nodes[t.shape.leaf(slot)] = priority_leaf(t.raw[slot], alpha);
}

template <class Tree>  // always priority_tree; a template so that headers define it once per use
__global__ void sum_tree_level_kernel(Tree t, int d) {
  const std::int64_t j = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (j >= t.shape.count[d]) return;
  t.nodes[t.shape.offset[d] + j] = sum_tree_children(t.nodes, t.shape, d, j);
}

template <
    class Request>  // always selection_request; a template so that headers define it once per use
__global__ void prioritized_select_kernel(slot_table table, Request r, const double* nodes,
                                          sum_tree_shape shape, bool stratified) {
  const std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (row >= r.batch) return;
  const double root = nodes[0];
  if (!(root > 0)) {  // every committed priority is 0: uniform
    r.slots[row] = uniform_row(table, r, true, row);
    r.probabilities[row] = 1.0f / static_cast<float>(table.live);
    r.weights[row] = 1.0f;
    return;
  }
  const double u = priority_target(r.draw, row, r.batch, stratified, root);
  const std::int64_t slot = sum_tree_find(nodes, shape, u);
  const double leaf = nodes[shape.leaf(slot)];
  r.slots[row] = slot;
  r.probabilities[row] = static_cast<float>(leaf / root);
  atomicMax(reinterpret_cast<unsigned long long*>(r.scratch),
            ~static_cast<unsigned long long>(__double_as_longlong(leaf)));
}

// A template (Request is always selection_request) so that headers define it once per use.
template <class Request>
__global__ void prioritized_weights_kernel(Request r, const double* nodes, sum_tree_shape shape,
                                           double beta) {
  const std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (row >= r.batch) return;
  if (!(nodes[0] > 0)) return;
  const double leaf_min = __longlong_as_double(static_cast<long long>(~r.scratch[0]));
  r.weights[row] = importance_weight(nodes[shape.leaf(r.slots[row])], leaf_min, beta);
}

inline unsigned blocks_for(std::int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace gear::detail

namespace gear::select {

/// Device side: the sum tree and its bookkeeping in device memory (about 8 + 4 + 8 bytes per slot
/// plus 8.6 bytes of internal nodes and flags). Every call is stream-ordered and returns without
/// synchronising, except the inspection calls (nodes, priorities, total, max_priority), which
/// synchronise.
///
/// Updates come two ways. update() takes host spans, checked on the host before anything is
/// enqueued (it throws at once). update_from_device() takes keys and priorities in GPU-readable
/// memory and checks them on the GPU, in the same launches: an update with a bad pair changes
/// nothing (tree, raw priorities, largest priority) and is recorded as a failure, which
/// raise_update_failures() throws later on the host without synchronising.
template <>
class prioritized::state<exec::device> {
 public:
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
    status.max_priority = 1.0f;
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
  /// The root: sum of p^alpha over committed trajectories.
  [[nodiscard]] double total(cuda::stream_ref stream) const {
    double root = 0;
    GEAR_CUDA_TRY(
        cudaMemcpyAsync(&root, nodes_.data(), sizeof root, cudaMemcpyDeviceToHost, stream.get()));
    GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    return root;
  }
  /// The priority new trajectories enter with: the largest given so far (by updates that
  /// succeeded), 1 before any. Kept in device memory, folded by the update kernels; this reads it
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
    constexpr int threads = detail::tuning::select_threads;
    const unsigned blocks = detail::blocks_for(r.batch, threads);
    const auto* nodes = nodes_.as<const double>();
    // Scratch word 0 collects the batch's smallest probability; it starts at 0 (no minimum yet).
    GEAR_CUDA_TRY(cudaMemsetAsync(r.scratch, 0, sizeof(std::uint64_t), stream.get()));
    detail::prioritized_select_kernel<<<blocks, threads, 0, stream.get()>>>(t, r, nodes, shape_,
                                                                            policy_.stratified);
    GEAR_CHECK_LAUNCH("prioritized_select_kernel");
    detail::prioritized_weights_kernel<<<blocks, threads, 0, stream.get()>>>(r, nodes, shape_,
                                                                             policy_.beta);
    GEAR_CHECK_LAUNCH("prioritized_weights_kernel");
  }

  // ---- hooks the buffer calls --------------------------------------------------------------

  /// Sets the priorities of live keys (checked by the buffer; both spans in host memory). Last
  /// write wins for a slot named twice. The pairs travel through pinned staging with one copy;
  /// the staging is reused once the previous update's copy has finished (an event).
  /// Throws errc::invalid_priority / errc::invalid_argument before changing anything.
  void update(const slot_table&, std::span<const key> keys, std::span<const float> priorities,
              cuda::stream_ref stream) {
    detail::validate_priorities(keys, priorities);
    const auto n = static_cast<std::int64_t>(keys.size());
    if (n == 0) return;
    const std::size_t slot_bytes =
        (static_cast<std::size_t>(n) * sizeof(std::int64_t) + 255) / 256 * 256;
    const std::size_t bytes = slot_bytes + static_cast<std::size_t>(n) * sizeof(float);
    if (staging_ready_.get() != nullptr) GEAR_CUDA_TRY(cudaEventSynchronize(staging_ready_.get()));
    if (staging_.size() < bytes) {
      const std::size_t grown = std::max(bytes, staging_.size() * 2);
      staging_ = detail::allocation(memory_kind::pinned_host, grown);
      staged_ = detail::allocation(memory_kind::device, grown);
    }
    if (staging_ready_.get() == nullptr) staging_ready_ = detail::event::make();
    auto* slots = staging_.as<std::int64_t>();
    auto* values = reinterpret_cast<float*>(staging_.data() + slot_bytes);
    for (std::int64_t i = 0; i < n; ++i) {
      slots[i] = static_cast<std::int64_t>(keys[static_cast<std::size_t>(i)].slot);
      values[i] = priorities[static_cast<std::size_t>(i)];
    }
    GEAR_CUDA_TRY(cudaMemcpyAsync(staged_.data(), staging_.data(), bytes, cudaMemcpyHostToDevice,
                                  stream.get()));
    GEAR_CUDA_TRY(cudaEventRecord(staging_ready_.get(), stream.get()));
    detail::priority_source src;
    src.slots = staged_.as<const std::int64_t>();
    src.priorities = reinterpret_cast<const float*>(staged_.data() + slot_bytes);
    src.capacity = capacity_;
    src.count = n;
    apply(src, stream);
  }

  /// Sets priorities from GPU-readable memory (device, managed or mapped pinned; the buffer has
  /// checked the pointers): keys[i] takes priorities[i], last write wins for a slot named twice.
  /// Both arrays are read by the kernels, in stream order (earlier work on the stream may write
  /// them), and must stay valid until then. Two launches, no copy, no synchronisation.
  /// On the GPU, every key is checked against `table` (its device lengths and generations, as of
  /// stream order) and `shard`, every priority for NaN, negative or infinite: an update with a bad
  /// pair changes nothing and is recorded, with its first bad key (or, if every key is good, its
  /// first bad priority), for raise_update_failures().
  /// Throws at once (changing nothing) errc::invalid_argument (sizes differ, 2^32 pairs or more),
  /// errc::cuda_error.
  void update_from_device(const slot_table& table, std::uint32_t shard, std::span<const key> keys,
                          std::span<const float> priorities, cuda::stream_ref stream) {
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
    src.generations = table.generations;
    src.shard = shard;
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
  static detail::priority_source ring(const slot_table& t, std::uint64_t first, std::int64_t count,
                                      float fill) noexcept {
    detail::priority_source src;
    src.first_ticket = first;
    src.capacity = t.capacity;
    src.fill = fill;
    src.count = count;
    return src;
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
    if (epoch_ + 1 >= (1ull << 32)) {  // 2^32 updates: old bids could tie with new ones
      // A failure leaves epoch_ as it is, so the next update clears them again.
      GEAR_CUDA_TRY(cudaMemsetAsync(winner_.data(), 0, winner_.size(), stream.get()));
      epoch_ = 1;  // then 2 (even): verdict word 0, which the last apply (odd epoch) cleared
    }
    ++epoch_;
    constexpr int threads = detail::tuning::priority_update_threads;
    const unsigned blocks = detail::blocks_for(src.count, threads);
    detail::priority_mark_kernel<<<blocks, threads, 0, stream.get()>>>(src, tree(), epoch_);
    GEAR_CHECK_LAUNCH("priority_mark_kernel");
    detail::priority_apply_kernel<<<blocks, threads, 0, stream.get()>>>(src, tree(), epoch_,
                                                                        policy_.alpha);
    GEAR_CHECK_LAUNCH("priority_apply_kernel");
  }

  prioritized policy_;
  std::int64_t capacity_;
  detail::sum_tree_shape shape_;
  detail::allocation nodes_, raw_, winner_, flags_;
  detail::allocation status_;  // device: detail::priority_status
  detail::allocation report_;  // mapped pinned: detail::priority_report, written by the GPU
  detail::allocation staging_, staged_;
  detail::event staging_ready_;
  unsigned long long epoch_ = 0;
  std::uint64_t device_calls_ = 0;     // update_from_device calls enqueued
  std::uint64_t failures_raised_ = 0;  // failures raise_update_failures has thrown
};

}  // namespace gear::select
