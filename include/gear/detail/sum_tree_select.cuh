#pragma once
// Prioritized selection on the GPU: the sum tree's descent by groups of 16 lanes, and the kernel
// that selects a batch and writes its importance weights.
//
// A group of sum_tree_fanout (16) lanes descends for one row: at each level lane c loads child c
// of the current node, so the node's children are one coalesced 128-byte load per row (one lane
// per row issued 16 loads touching 32 different lines per warp instruction, and the L1's
// wavefronts bounded the descent). The levels just below the root, which every row reads, are
// read once per block into shared memory (tuning::select_shared_levels). The group then takes the
// children's prefix sums with cub::WarpScan (a 16-lane logical warp) and picks its child with two
// ballots. The host descent (sum_tree_find) adds the prefixes in the same order (Kogge-Stone,
// sum_tree_scan_children), so the device selects bit for bit the rows the host selects from the
// same tree and draws; select_gpu_tests checks it at the draws where the order matters.
//
// Weights: each row's log leaf goes to scratch, and each block's smallest (cub::BlockReduce) to
// scratch word b of block b. With an arrivals word (selection_request::arrivals, 0 between
// samples) and a batch of at most tuning::select_fused_weights_max_rows, each block then counts
// itself in that word, and the last block to arrive (last_block.cuh) reduces the blocks' minima
// and writes every weight: one launch per selection. Otherwise a second launch reduces the minima
// in every block and writes the weights spread over the GPU; or, by default
// (tuning::select_weights_grid_sync), launched cooperatively while the whole grid is resident,
// every block waits at a grid-wide barrier, then reduces the minima and writes its own rows'
// weights: one launch.
//
// A weight is (leaf_min / leaf)^beta, computed as exp(beta * (log leaf_min - log leaf)): the logs
// are taken in the selection's parallel part, so the last block spends one exp per row, and no
// intermediate can overflow.

#include <cooperative_groups.h>

#include <cmath>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_scan.cuh>
#include <gear/detail/dependent_launch.cuh>
#include <gear/detail/last_block.cuh>
#include <gear/detail/sum_tree.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/select/concept.hpp>
#include <gear/select/prioritized.hpp>
#include <gear/select/uniform.hpp>

namespace gear::detail {

/// The prefix sums of one node's children, a lane each.
using sum_tree_scan = cub::WarpScan<double, sum_tree_group>;

/// sum_tree_find by the group of sum_tree_group lanes the calling lane (lane = its index in the
/// group) belongs to, with the group's scan storage; every lane of the warp calls it with its
/// group's u (ballots and shuffles span the whole warp). Levels 1 .. top_levels are read from
/// `top` (their entries, level 1 first, as in the tree); the rest from `tree`. Returns the slot,
/// and its leaf's value in `leaf`. Requires levels >= 2 and a one-dimensional block.
__device__ inline std::int64_t sum_tree_find_group(sum_tree_scan::TempStorage& storage,
                                                   const double* tree, const double* top,
                                                   int top_levels, const sum_tree_shape& s,
                                                   double u, int lane, double& leaf) {
  constexpr unsigned all = 0xFFFFFFFFu, group_bits = (1u << sum_tree_group) - 1;
  const unsigned shift = threadIdx.x % 32 / sum_tree_group * sum_tree_group;  // group's lanes
  std::int64_t j = 0;
  for (int d = 0; d + 1 < s.levels; ++d) {
    const std::int64_t at = s.offset[d + 1] + j * sum_tree_fanout + lane;
    const double mine = d < top_levels ? top[at - s.offset[1]] : tree[at];
    double prefix = 0;
    sum_tree_scan(storage).InclusiveSum(mine, prefix);
    // sum_tree_pick: the first positive child whose prefix exceeds u, else the last positive.
    const unsigned hits = __ballot_sync(all, mine > 0 && u < prefix) >> shift & group_bits;
    const unsigned positive = __ballot_sync(all, mine > 0) >> shift & group_bits;
    const int pick = hits != 0       ? __ffs(static_cast<int>(hits)) - 1
                     : positive != 0 ? 31 - __clz(static_cast<int>(positive))
                                     : 0;
    const double below = __shfl_sync(all, prefix, pick > 0 ? pick - 1 : 0, sum_tree_group);
    leaf = __shfl_sync(all, mine, pick, sum_tree_group);
    if (pick > 0) u -= below;
    j = j * sum_tree_fanout + pick;
  }
  return j;
}

/// Who writes a prioritized selection's importance weights (prioritized_select_kernel).
enum class select_weights : int {
  second_launch,  ///< prioritized_weights_kernel, launched after the selection
  last_block,     ///< the selection's last block to arrive (r.arrivals), for small batches
  grid_sync,      ///< every block, for its own rows, after a grid-wide barrier (cooperative launch)
};

struct double_min {
  __device__ double operator()(double a, double b) const { return b < a ? b : a; }
};

/// The smallest of the block's `mine`, given to every thread (cub::BlockReduce, then shared
/// memory). Every thread of the block calls it.
template <int Threads>
__device__ double block_min_to_all(double mine) {
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage storage;
  __shared__ double smallest;
  mine = reduce(storage).Reduce(mine, double_min{});
  if (threadIdx.x == 0) smallest = mine;
  __syncthreads();
  return smallest;
}

/// Entries of levels 1 .. tuning::select_shared_levels, at most (level 1 has at most 16 nodes, and
/// each level below at most 16 times the one above).
constexpr int sum_tree_shared_entries() {
  int entries = 0, level = 1;
  for (int d = 0; d < tuning::select_shared_levels; ++d) entries += level *= sum_tree_fanout;
  return entries;
}

__device__ inline double word_as_double(const std::uint64_t* word) {
  return __longlong_as_double(
      static_cast<long long>(__ldcg(reinterpret_cast<const unsigned long long*>(word))));
}
__device__ inline std::uint64_t double_as_word(double x) {
  return static_cast<std::uint64_t>(__double_as_longlong(x));
}

/// (P_min / P_i)^beta from the logs of the smallest leaf and row i's.
__device__ inline float importance_weight_of_logs(double beta, double log_min, double log_leaf) {
  return static_cast<float>(::exp(beta * (log_min - log_leaf)));
}

/// Weights from the rows' log leaves (r.scratch[batch, 2 * batch)) and the smallest one, for rows
/// first, first + stride, ... (importance_weight, computed as the file's top says). Each thread
/// loads 8 rows' leaves before it computes any: the last block writes a whole batch, and one load
/// at a time would wait out the L2's latency once per row.
__device__ inline void write_weights(const selection_request& r, double log_min, double beta,
                                     std::int64_t first, std::int64_t stride) {
  constexpr int in_flight = 8;
  for (std::int64_t base = first; base < r.batch; base += in_flight * stride) {
    double log_leaf[in_flight];
#pragma unroll
    for (int k = 0; k < in_flight; ++k) {
      const std::int64_t row = base + k * stride;
      log_leaf[k] = row < r.batch ? word_as_double(r.scratch + r.batch + row) : 0.0;
    }
#pragma unroll
    for (int k = 0; k < in_flight; ++k) {
      const std::int64_t row = base + k * stride;
      if (row < r.batch) r.weights[row] = importance_weight_of_logs(beta, log_min, log_leaf[k]);
    }
  }
}

/// The smallest of the blocks' minima (r.scratch[0, minima)), given to every thread of the block.
template <int Threads>
__device__ double smallest_of_blocks(const selection_request& r, unsigned minima) {
  double smallest = INFINITY;
  for (unsigned b = threadIdx.x; b < minima; b += Threads) {
    const double m = word_as_double(r.scratch + b);
    smallest = m < smallest ? m : smallest;
  }
  return block_min_to_all<Threads>(smallest);
}

/// Selects r.batch rows by priority (a group of lanes per row, groups striding over the rows
/// when the batch is larger than the grid) and writes their slots and probabilities; row i's log
/// leaf goes into r.scratch[batch + i] and block b's smallest into r.scratch[b] (scratch holds
/// 2 * batch words, and there are at most batch / 16 blocks). `weights` says who then writes the
/// weights (select_weights; grid_sync only in a cooperative launch). With a
/// root of 0 (every priority 0) rows are uniform with weight 1.
/// GridSync: the instance launched cooperatively (select_weights::grid_sync); the others never
/// carry the barrier's code (it costs registers).
template <int Threads, class Request, bool GridSync = false>  // Request: selection_request
__global__ void __launch_bounds__(Threads)
    prioritized_select_kernel(slot_table table, Request r, const double* nodes,
                              sum_tree_shape shape, bool stratified, double beta,
                              select_weights weights) {
  allow_dependents();  // a gather after it may be placed now (dependent_launch.cuh)
  static_assert(Threads % 32 == 0, "whole warps");
  constexpr int rows_per_block = Threads / sum_tree_group;
  __shared__ double top[sum_tree_shared_entries()];
  __shared__ sum_tree_scan::TempStorage scan_storage[rows_per_block];
  const int lane = static_cast<int>(threadIdx.x % sum_tree_group);
  read_device_counts(table, r);
  const int top_levels = shape.levels - 1 < tuning::select_shared_levels
                             ? shape.levels - 1
                             : tuning::select_shared_levels;
  const auto top_entries =  // levels 1 .. top_levels, with their padding
      top_levels < 1 ? 0
                     : static_cast<int>(shape.offset[top_levels] - shape.offset[1] +
                                        sum_tree_padded(shape.count[top_levels]));
  const double root = nodes[0];  // loaded beside the top levels, not after them
  for (int i = static_cast<int>(threadIdx.x); i < top_entries; i += Threads)
    top[i] = nodes[shape.offset[1] + i];
  __syncthreads();
  double smallest = INFINITY;
  // Whole warps take the same number of turns: the shuffles need every lane of the warp. Lanes
  // past the batch descend for row 0 and write nothing.
  for (std::int64_t first = blockIdx.x * std::int64_t{rows_per_block}; first < r.batch;
       first += std::int64_t{gridDim.x} * rows_per_block) {
    const std::int64_t row = first + static_cast<std::int64_t>(threadIdx.x) / sum_tree_group;
    const bool writes = row < r.batch && lane == 0;
    if (!(root > 0)) {  // the same for every thread of the grid
      if (writes) {
        r.slots[row] = uniform_row(table, r, true, row);
        r.probabilities[row] = table.live > 0 ? 1.0f / static_cast<float>(table.live) : 0.0f;
        r.weights[row] = 1.0f;
      }
      continue;
    }
    const double u = priority_target(r.draw, row < r.batch ? row : 0, r.batch, stratified, root);
    double leaf = root;  // a tree of one leaf is its root
    const std::int64_t slot =
        shape.levels > 1 ? sum_tree_find_group(scan_storage[threadIdx.x / sum_tree_group], nodes,
                                               top, top_levels, shape, u, lane, leaf)
                         : 0;
    if (writes) {
      r.slots[row] = slot;
      r.probabilities[row] = static_cast<float>(leaf / root);
      const double log_leaf = ::log(leaf);
      r.scratch[r.batch + row] = double_as_word(log_leaf);
      smallest = log_leaf < smallest ? log_leaf : smallest;
    }
  }
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage storage;
  smallest = reduce(storage).Reduce(smallest, double_min{});
  if (threadIdx.x == 0) r.scratch[blockIdx.x] = double_as_word(smallest);
  // `weights` is the same for the whole grid.
  if (weights == select_weights::second_launch) return;
  if constexpr (GridSync) {                  // launched cooperatively: every block resident
    cooperative_groups::this_grid().sync();  // every block's words written and visible
    const double log_min = smallest_of_blocks<Threads>(r, gridDim.x);
    if (root > 0)
      write_weights(r, log_min, beta, blockIdx.x * std::int64_t{Threads} + threadIdx.x,
                    std::int64_t{gridDim.x} * Threads);
    return;
  }
  // The last block sees every block's words.
  if (!last_block_to_arrive(r.arrivals)) return;
  const double log_min = smallest_of_blocks<Threads>(r, gridDim.x);
  if (root > 0) write_weights(r, log_min, beta, threadIdx.x, Threads);
}

/// The weights of the rows prioritized_select_kernel selected with `minima` blocks, with
/// select_weights::second_launch: every block reduces the blocks' minima, then writes its rows'
/// weights.
template <int Threads, class Request>  // Request is always selection_request
__global__ void __launch_bounds__(Threads)
    prioritized_weights_kernel(Request r, const double* nodes, double beta, unsigned minima) {
  allow_dependents();  // a gather after it may be placed now (dependent_launch.cuh)
  // One row per thread (the grid covers the batch). The root, the row's log leaf and the blocks'
  // minima are loaded at once: one wait for memory, not three in a row.
  const std::int64_t row = blockIdx.x * std::int64_t{Threads} + threadIdx.x;
  const double root = nodes[0];
  const double log_leaf = row < r.batch ? word_as_double(r.scratch + r.batch + row) : 0.0;
  const double log_min = smallest_of_blocks<Threads>(r, minima);
  if (root > 0 && row < r.batch)  // with a root of 0, uniform rows have their weights
    r.weights[row] = importance_weight_of_logs(beta, log_min, log_leaf);
}

}  // namespace gear::detail
