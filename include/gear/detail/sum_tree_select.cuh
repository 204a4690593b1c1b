#pragma once
// Prioritized selection on the GPU: the sum tree's descent by groups of 16 lanes, and the one
// kernel that selects a batch and writes its importance weights.
//
// A group of sum_tree_fanout (16) lanes descends for one row: at each level lane c loads child c
// of the current node, so the node's children are one coalesced 128-byte load per row (one lane
// per row issued 16 loads touching 32 different lines per warp instruction, and the L1's
// wavefronts bounded the descent). The pick is then folded in index order, exactly as
// sum_tree_find does on the host (the 16 values reach every lane by shuffles), so the device
// selects bit for bit the rows the host selects from the same tree and draws. The fold is
// hand-written: cub::WarpScan would add the children in a tree order of its own, which the host
// tree does not reproduce and CUB does not promise to keep.
//
// The batch's smallest leaf (for the weights) is reduced per block with cub::BlockReduce into
// scratch word b of block b; a second launch reduces those words in every block and writes the
// weights (double pow, spread over the GPU). Two launches and no memset per sample, where there
// were two launches and a memset.

#include <cmath>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <gear/detail/sum_tree.hpp>
#include <gear/select/concept.hpp>
#include <gear/select/prioritized.hpp>
#include <gear/select/uniform.hpp>

namespace gear::detail {

/// sum_tree_find by the group of sum_tree_group lanes the calling lane (lane = its index in the
/// group) belongs to; every lane of the warp calls it with its group's u (the shuffles span the
/// whole warp). Returns the slot, and its leaf's value in `leaf`. Requires levels >= 2.
__device__ inline std::int64_t sum_tree_find_group(const double* tree, const sum_tree_shape& s,
                                                   double u, int lane, double& leaf) {
  std::int64_t j = 0;
  for (int d = 0; d + 1 < s.levels; ++d) {
    const double mine = tree[s.offset[d + 1] + j * sum_tree_fanout + lane];
    int pick = -1, last = 0;
    double picked = 0, last_value = 0;
    for (int c = 0; c < sum_tree_fanout; ++c) {  // sum_tree_find's fold, branch-free
      const double v = __shfl_sync(0xFFFFFFFFu, mine, c, sum_tree_group);
      const bool positive = v > 0;
      const bool open = positive && pick < 0;
      const bool here = open && u < v;
      last = positive ? c : last;
      last_value = positive ? v : last_value;
      pick = here ? c : pick;
      picked = here ? v : picked;
      u = open && !here ? u - v : u;
    }
    j = j * sum_tree_fanout + (pick >= 0 ? pick : last);
    leaf = pick >= 0 ? picked : last_value;
  }
  return j;
}

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

/// Selects r.batch rows by priority (a group of lanes per row, groups striding over the rows
/// when the batch is larger than the grid) and writes their slots and probabilities; row i's leaf
/// goes into r.scratch[batch + i] and block b's smallest leaf into r.scratch[b] (a double's bits;
/// scratch holds 2 * batch words, and there are at most batch / 16 blocks). With a root of 0
/// (every priority 0) rows are uniform with weight 1.
template <int Threads, class Request>  // Request is always selection_request
__global__ void __launch_bounds__(Threads)
    prioritized_select_kernel(slot_table table, Request r, const double* nodes,
                              sum_tree_shape shape, bool stratified) {
  static_assert(Threads % 32 == 0, "whole warps");
  constexpr int rows_per_block = Threads / sum_tree_group;
  const int lane = static_cast<int>(threadIdx.x % sum_tree_group);
  read_device_counts(table, r);
  const double root = nodes[0];
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
        shape.levels > 1 ? sum_tree_find_group(nodes, shape, u, lane, leaf) : 0;
    if (writes) {
      r.slots[row] = slot;
      r.probabilities[row] = static_cast<float>(leaf / root);
      r.scratch[r.batch + row] = static_cast<std::uint64_t>(__double_as_longlong(leaf));
      smallest = leaf < smallest ? leaf : smallest;
    }
  }
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage storage;
  smallest = reduce(storage).Reduce(smallest, double_min{});
  if (threadIdx.x == 0)
    r.scratch[blockIdx.x] = static_cast<std::uint64_t>(__double_as_longlong(smallest));
}

/// The weights of the rows prioritized_select_kernel selected with `minima` blocks: every block
/// reduces the blocks' smallest leaves (r.scratch[0, minima)), then writes its rows' weights from
/// their leaves (r.scratch[batch, 2 * batch)).
template <int Threads, class Request>  // Request is always selection_request
__global__ void __launch_bounds__(Threads)
    prioritized_weights_kernel(Request r, const double* nodes, double beta, unsigned minima) {
  if (!(nodes[0] > 0)) return;  // uniform rows have their weights
  double smallest = INFINITY;
  for (unsigned b = threadIdx.x; b < minima; b += Threads) {
    const double m = __longlong_as_double(static_cast<long long>(r.scratch[b]));
    smallest = m < smallest ? m : smallest;
  }
  const double leaf_min = block_min_to_all<Threads>(smallest);
  const std::int64_t row = blockIdx.x * std::int64_t{Threads} + threadIdx.x;
  if (row < r.batch)
    r.weights[row] = importance_weight(
        __longlong_as_double(static_cast<long long>(r.scratch[r.batch + row])), leaf_min, beta);
}

}  // namespace gear::detail
