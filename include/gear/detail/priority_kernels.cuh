#pragma once
// The kernels of select::prioritized's device state (select_prioritized.cuh, whose top comment
// describes the update protocol): priority sources, the mark and apply passes of an update, the
// leaf and level rebuilds (selection is in sum_tree_select.cuh).

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cuda/atomic>
#include <gear/detail/cuda.hpp>
#include <gear/detail/dependent_launch.cuh>
#include <gear/detail/sum_tree.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/select/prioritized.hpp>
#include <gear/select/uniform.hpp>

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
  const std::uint64_t* tickets = nullptr;
  key_owner owner{};
  std::uint32_t siblings = 0;  ///< a sharded_buffer's shards: their keys are skipped, not bad
  std::uint64_t call = 0;      ///< which update from device memory, for the failure record

  /// The slot of pair i; out of range only for a bad key of an update from device memory.
  GEAR_HD std::int64_t slot(std::int64_t i) const noexcept {
    if (keys != nullptr) return keys[i].slot(capacity);
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
  unsigned long long stale;       ///< pairs skipped because their key was stale when applied
  float max_priority;             ///< max(1, the largest priority given so far)
  unsigned marked;                ///< blocks of the running mark launch that have finished
  unsigned long long epoch;       ///< updates marked so far (the last mark's block advances it)
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

/// Entries of the internal node array a block pools its marks of in shared memory: the levels
/// near the root (at most 16 + 16 + 256 entries), where every pair's path meets the others'.
inline constexpr int priority_mark_pooled = 512;

/// Duplicate slots in an update are resolved by these bids (last write wins) rather than by
/// cub::DeviceRadixSort::SortPairs on the slot: 12.0 us against 18.1 us for 4096 pairs, same
/// winners (gear_cub_variants, H100, 2026-12-05).
///
/// Pair i: its key and priority checked (pairs from device memory), its bid i + 1 for its slot,
/// and the edges of its leaf's path marked in flags (low 16 bits: the touched children). The marks
/// are reductions nobody waits for (atomicOr whose result is unused); marks of the levels near the
/// root are pooled per block in shared memory first and set once per block. The update's epoch is
/// status->epoch + 1, read by every block when it starts; the last block to finish stores it, for
/// the apply and the next update (so the count lives on the device, and replays of a captured
/// update advance it as eager calls do).
template <class Tree>  // always priority_tree; a template so that headers define it once per use
__global__ void priority_mark_kernel(priority_source src, Tree t, double alpha) {
  // Launched as a programmatic dependent (dependent_launch.cuh): nothing is touched before the
  // kernel before it has finished; the apply may be placed at once.
  allow_dependents();
  wait_for_prerequisites();
  const unsigned long long epoch = t.status->epoch + 1;
  __shared__ unsigned pooled[priority_mark_pooled];
  std::int64_t top = t.shape.internal();  // nodes below `top` are pooled
  for (int d = 0; d + 1 < t.shape.levels; ++d)
    if (t.shape.count[d] > 256) {
      top = t.shape.offset[d];
      break;
    }
  top = top < priority_mark_pooled ? top : priority_mark_pooled;
  for (std::int64_t n = threadIdx.x; n < top; n += blockDim.x) pooled[n] = 0;
  __syncthreads();
  const std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  bool marks = i < src.count;  // lanes past the pairs stay for the barriers
  if (marks && src.keys != nullptr) {
    const unsigned long long verdict =
        check_priority_pair(src.keys[i], src.priorities[i], alpha, static_cast<std::uint64_t>(i),
                            src.lengths, src.tickets, src.capacity, src.owner, src.siblings);
    if (verdict != priority_ok) {
      // A stale pair is skipped (counted by the apply, if the update stands), a sibling shard's
      // too (not counted); a bad one fails it.
      if (verdict != priority_sibling && priority_verdict_code(verdict) != errc::stale_key)
        atomicMin(t.status->verdict + (epoch & 1), verdict);
      marks = false;  // a bad or stale pair neither bids nor marks
    }
  }
  if (marks) {
    std::int64_t j = src.slot(i);
    atomicMax(t.winner + j, static_cast<unsigned long long>(i) + 1);
    for (int d = t.shape.levels - 1; d > 0; --d) {
      const unsigned bit = 1u << (j % sum_tree_fanout);
      j /= sum_tree_fanout;
      const std::int64_t node = t.shape.offset[d - 1] + j;
      if (node < top)
        atomicOr(pooled + node, bit);
      else
        atomicOr(t.flags + node, bit);
    }
  }
  __syncthreads();
  for (std::int64_t n = threadIdx.x; n < top; n += blockDim.x)
    if (pooled[n] != 0) atomicOr(t.flags + n, pooled[n]);
  __syncthreads();  // every thread of the block read the epoch long ago; now the block is done
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&t.status->marked, 1u) + 1 == gridDim.x) {
      __threadfence();
      t.status->marked = 0;
      t.status->epoch = epoch;
    }
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

/// A group of sum_tree_group lanes per pair (see select_prioritized.cuh for the protocol): lane 0
/// checks, bids and counts arrivals; the group's lanes load a node's 16 children at once (one
/// coalesced line) and every lane folds them in index order (shuffles), as the host does.
template <class Tree>  // always priority_tree; a template so that headers define it once per use
__global__ void priority_apply_kernel(priority_source src, Tree t, double alpha) {
  allow_dependents();  // as the mark: a dependent launch (dependent_launch.cuh)
  wait_for_prerequisites();
  const unsigned long long epoch = t.status->epoch;  // this update's: its mark stored it
  const int lane = static_cast<int>(threadIdx.x % sum_tree_group);
  const std::int64_t i = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / sum_tree_group;
  if (i >= src.count) return;  // every exit is taken by the whole group
  const unsigned group = (0xFFFFFFFFu >> (32 - sum_tree_group))
                         << (threadIdx.x % 32 / sum_tree_group * sum_tree_group);
  const unsigned long long verdict = t.status->verdict[epoch & 1];
  const bool leader = lane == 0;
  if (i == 0 && leader) t.status->verdict[(epoch & 1) ^ 1] = priority_ok;  // the next update's
  const bool failed = verdict != priority_ok;
  if (failed && leader && static_cast<std::uint64_t>(i) == priority_verdict_index(verdict))
    priority_record_failure(src, t, verdict, i);
  // A stale pair (the mark kernel skipped it; the mirror is as it was then) is not folded, nor
  // is a sibling shard's.
  const unsigned long long own =
      src.keys == nullptr ? priority_ok
                          : check_priority_pair(src.keys[i], 0.0f, alpha, 0, src.lengths,
                                                src.tickets, src.capacity, src.owner, src.siblings);
  if (leader && !failed && own == priority_ok && src.priorities != nullptr)
    priority_fold_max(t, src.priorities[i]);
  if (own != priority_ok) {
    if (leader && !failed && own != priority_sibling) atomicAdd(&t.status->stale, 1ull);
    return;
  }
  const std::int64_t slot = src.slot(i);
  if (static_cast<std::uint64_t>(slot) >= static_cast<std::uint64_t>(src.capacity)) return;
  // The winner (the largest bid: the slot's last pair) clears the word for the next update, once
  // every lane of its group has read it; a losing pair reads the winner's bid or 0, never its own.
  // So no bid outlives its update, and bids need no epoch.
  const bool wins = t.winner[slot] == static_cast<unsigned long long>(i) + 1;
  __syncwarp(group);
  if (!wins) return;
  if (leader) t.winner[slot] = 0;
  if (!failed && leader) {
    const float p = src.priority(i);
    t.raw[slot] = p;
    t.nodes[t.shape.leaf(slot)] = priority_leaf(p, alpha);
  }
  std::int64_t j = slot;
  for (int d = t.shape.levels - 1; d > 0; --d) {
    const unsigned bit = 1u << (j % sum_tree_fanout);
    j /= sum_tree_fanout;
    const std::int64_t node = t.shape.offset[d - 1] + j;
    // The arrival releases this child's value; the last arrival acquires every sibling's, and the
    // warp barrier passes that on to the group's lanes before they load the children.
    unsigned now = 0;
    if (leader)
      now = cuda::atomic_ref<unsigned, cuda::thread_scope_device>(t.flags[node])
                .fetch_or(bit << 16, cuda::memory_order_acq_rel) |
            (bit << 16);
    now = __shfl_sync(group, now, 0, sum_tree_group);
    if ((now >> 16) != (now & 0xFFFFu)) return;  // a touched sibling is still on its way
    __syncwarp(group);
    if (!failed) {
      const double mine = __ldcg(t.nodes + t.shape.offset[d] + j * sum_tree_fanout + lane);
      double sum = 0;
      for (int c = 0; c < sum_tree_fanout; ++c) sum += __shfl_sync(group, mine, c, sum_tree_group);
      if (leader) t.nodes[node] = sum;
    }
    if (leader) t.flags[node] = 0;
  }
}

template <class Tree>  // always priority_tree; a template so that headers define it once per use
__global__ void priority_leaves_kernel(Tree t, double alpha, std::int64_t capacity) {
  const std::int64_t slot = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (slot >= capacity) return;
  t.nodes[t.shape.leaf(slot)] = priority_leaf(t.raw[slot], alpha);
}

/// Level d of a rebuild: each node the sum of its 16 children, in index order (the host's sums,
/// bit for bit). Hand-written: cub::DeviceSegmentedReduce::Sum per level took 1129 us against
/// this kernel's 96 us for N = 2^24 (gear_cub_variants, H100, 2026-12-05), and its sums differ
/// from the host's in the last bit for half the nodes.
template <class Tree>  // always priority_tree; a template so that headers define it once per use
__global__ void sum_tree_level_kernel(Tree t, int d) {
  const std::int64_t j = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (j >= t.shape.count[d]) return;
  t.nodes[t.shape.offset[d] + j] = sum_tree_children(t.nodes, t.shape, d, j);
}

/// Functors of the range reduction (positive floats order as their bits do).
struct bits_min {
  __device__ unsigned operator()(unsigned a, unsigned b) const { return a < b ? a : b; }
};
struct bits_max {
  __device__ unsigned operator()(unsigned a, unsigned b) const { return a > b ? a : b; }
};

/// Folds the smallest positive and the largest of raw[0, n) (as float bits) into out[0], out[1]:
/// a grid-stride pass per thread, cub::BlockReduce per block, one atomic per block.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    priority_range_kernel(const float* raw, std::int64_t n, unsigned* out) {
  using reduce = cub::BlockReduce<unsigned, Threads>;
  __shared__ typename reduce::TempStorage low_storage, high_storage;
  unsigned low = 0x7F800000u, high = 0;
  for (std::int64_t i = blockIdx.x * std::int64_t{Threads} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * Threads) {
    const float p = raw[i];
    if (p > 0 && p <= 3.402823466e38f) {  // positive and finite; NaN and none (< 0) fail
      const unsigned b = __float_as_uint(p);
      low = b < low ? b : low;
      high = b > high ? b : high;
    }
  }
  low = reduce(low_storage).Reduce(low, bits_min{});
  high = reduce(high_storage).Reduce(high, bits_max{});
  if (threadIdx.x == 0) {
    atomicMin(out, low);
    atomicMax(out + 1, high);
  }
}

inline unsigned blocks_for(std::int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace gear::detail
