#pragma once
// Device side of gear::select::prioritized: the sum tree in device memory.
//
// Selection: one thread per row descends the tree (D - 1 line reads, D = levels), writes its slot
// and probability and folds its leaf into the batch minimum (an atomicMax on the complemented
// bits of a positive double, in the zeroed scratch word 0); a second launch turns the minimum
// into the weights. Two launches, O(B log N), stream-ordered, no synchronisation.
//
// Update of B (slot, priority) pairs, O(B log N), two launches:
//   mark:  every pair bids atomicMax(winner[slot], epoch << 32 | index), so the last occurrence
//          of a slot in the batch wins; and sets, for each tree edge on its leaf's path, the
//          child's bit in the low 16 bits of flags[parent]. The first thread to set an edge's bit
//          continues upward, the others stop there.
//   apply: the winner of each slot writes its raw priority and leaf, then walks up: at each parent
//          it sets its bit in the high 16 bits (arrivals); the thread whose arrival completes the
//          parent's mark set (the last of the touched children to finish) recomputes the parent
//          as the sum of its 16 children, clears the parent's flags for the next call, and
//          continues; the others stop. So each touched node is recomputed exactly once, after all
//          its touched children, with the same fp64 additions as the host tree.
// Commit and eviction use the same two launches over a range of ring slots with one priority.

#include <bit>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>
#include <gear/detail/sum_tree.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/select/prioritized.hpp>
#include <span>
#include <vector>

namespace gear::detail {

static_assert(sum_tree_fanout <= 16, "update flags pack 16 child bits and 16 arrival bits");

/// The pairs of one update: explicit device arrays, or `count` ring slots from first_ticket all
/// taking priority `fill`.
struct priority_source {
  const std::int64_t* slots = nullptr;
  const float* priorities = nullptr;
  std::uint64_t first_ticket = 0;
  std::int64_t capacity = 1;
  float fill = 0;
  std::int64_t count = 0;

  GEAR_HD std::int64_t slot(std::int64_t i) const noexcept {
    return slots != nullptr
               ? slots[i]
               : static_cast<std::int64_t>((first_ticket + static_cast<std::uint64_t>(i)) %
                                           static_cast<std::uint64_t>(capacity));
  }
  GEAR_HD float priority(std::int64_t i) const noexcept {
    return priorities != nullptr ? priorities[i] : fill;
  }
};

/// The device arrays of a prioritized state.
struct priority_tree {
  double* nodes = nullptr;               ///< [shape.total] the sum tree
  float* raw = nullptr;                  ///< [capacity] raw priorities (negative/NaN: none)
  unsigned long long* winner = nullptr;  ///< [capacity] last-write-wins bids
  unsigned int* flags = nullptr;         ///< [shape.internal()] touched children | arrivals
  sum_tree_shape shape{};
};

template <class Tree>  // always priority_tree; a template so that headers define it once per use
__global__ void priority_mark_kernel(priority_source src, Tree t, unsigned long long epoch) {
  const std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (i >= src.count) return;
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

template <class Tree>  // always priority_tree; a template so that headers define it once per use
__global__ void priority_apply_kernel(priority_source src, Tree t, unsigned long long epoch,
                                      double alpha) {
  const std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (i >= src.count) return;
  const std::int64_t slot = src.slot(i);
  if (t.winner[slot] != ((epoch << 32) | static_cast<unsigned long long>(i))) return;
  const float p = src.priority(i);
  t.raw[slot] = p;
  t.nodes[t.shape.leaf(slot)] = priority_leaf(p, alpha);
  std::int64_t j = slot;
  for (int d = t.shape.levels - 1; d > 0; --d) {
    const unsigned bit = 1u << (j % sum_tree_fanout);
    j /= sum_tree_fanout;
    const std::int64_t node = t.shape.offset[d - 1] + j;
    __threadfence();  // this child's value before its arrival
    const unsigned now = atomicOr(t.flags + node, bit << 16) | (bit << 16);
    if ((now >> 16) != (now & 0xFFFFu)) return;  // a touched sibling is still on its way
    __threadfence();                             // every touched sibling's value after its arrival
    const double* child = t.nodes + t.shape.offset[d] + j * sum_tree_fanout;
    double v[sum_tree_fanout];
    for (int c = 0; c < sum_tree_fanout; ++c) v[c] = __ldcg(child + c);
    double sum = 0;
    for (int c = 0; c < sum_tree_fanout; ++c) sum += v[c];
    t.nodes[node] = sum;
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
/// synchronising, except the inspection calls (nodes, total), which synchronise.
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
    cudaStream_t init{};
    GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&init, cudaStreamNonBlocking));
    cudaError_t status = cudaMemsetAsync(nodes_.data(), 0, nodes_.size(), init);
    if (status == cudaSuccess) status = cudaMemsetAsync(raw_.data(), 0xFF, raw_.size(), init);
    if (status == cudaSuccess) status = cudaMemsetAsync(winner_.data(), 0, winner_.size(), init);
    if (status == cudaSuccess) status = cudaMemsetAsync(flags_.data(), 0, flags_.size(), init);
    if (status == cudaSuccess) status = cudaStreamSynchronize(init);
    GEAR_CUDA_TRY(cudaStreamDestroy(init));
    GEAR_CUDA_TRY(status);
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
  /// The priority new trajectories enter with: the largest given so far, 1 before any.
  [[nodiscard]] float max_priority() const noexcept { return max_priority_; }

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
    const float largest = detail::validate_priorities(keys, priorities);
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
    src.count = n;
    apply(src, stream);
    max_priority_ = std::max(max_priority_, largest);
  }

  void on_commit(const slot_table& t, std::uint64_t first_ticket, std::int64_t count,
                 cuda::stream_ref stream) {
    apply(ring(t, first_ticket, count, max_priority_), stream);
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
    return {nodes_.as<double>(), raw_.as<float>(), winner_.as<unsigned long long>(),
            flags_.as<unsigned>(), shape_};
  }

  /// The two update launches (see the top of this file).
  void apply(const detail::priority_source& src, cuda::stream_ref stream) {
    if (src.count <= 0) return;
    if (++epoch_ == (1ull << 32)) {  // 2^32 updates: old bids could tie with new ones; clear them
      GEAR_CUDA_TRY(cudaMemsetAsync(winner_.data(), 0, winner_.size(), stream.get()));
      epoch_ = 1;
    }
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
  detail::allocation staging_, staged_;
  detail::event staging_ready_;
  float max_priority_ = 1.0f;
  unsigned long long epoch_ = 0;
};

}  // namespace gear::select
