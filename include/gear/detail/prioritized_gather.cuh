#pragma once
// Prioritized rows drawn inside the gather kernel (select::prioritized's row_selector): one launch
// per sample where select() takes one and the gather another.
//
// In each block that copies part of a row, the first warp of the row's group (gather.cuh) descends
// the sum tree for the row (two groups of 16 lanes with the same target, sum_tree_find_group,
// reading every level from the tree) and the group shares the slot and leaf; the row's log leaf
// goes to the request's scratch, as the select kernel leaves it (every block of the row writes
// the same word). The weights need the batch's
// smallest leaf: the gather's last block to draw its row reduces the logs and writes every weight
// (prioritized_weights_epilogue), after the row's first block has published the rest. Rows,
// probabilities and weights are those select() gives, bit for bit: the same descent, the same
// additions, the same reduction and formula (sum_tree_select.cuh). With a root of 0 (every
// priority 0) rows are uniform with weight 1, as there.

#include <cmath>
#include <cstdint>
#include <gear/detail/sum_tree.hpp>
#include <gear/detail/sum_tree_select.cuh>
#include <gear/detail/tuning.hpp>
#include <gear/select/concept.hpp>
#include <gear/select/prioritized.hpp>
#include <gear/select/uniform.hpp>

namespace gear::detail {

/// Writes the weights of a batch drawn by prioritized_gather_rows, in the gather's last block.
struct prioritized_weights_epilogue {
  selection_request request;
  const double* nodes = nullptr;
  double beta = 0;
  unsigned* arrivals = nullptr;
  static constexpr bool present = true;
  __device__ void operator()() const {
    const double root = nodes[0];  // as the rows saw it: the sample orders itself after writes
    if (!(root > 0)) return;       // uniform rows (weight 1), no log leaves; the whole block
    double smallest = INFINITY;
    for (std::int64_t row = threadIdx.x; row < request.batch; row += blockDim.x) {
      const double log_leaf = word_as_double(request.scratch + request.batch + row);
      smallest = log_leaf < smallest ? log_leaf : smallest;
    }
    const double log_min = block_min_to_all<tuning::copy_threads>(smallest);
    write_weights(request, log_min, beta, threadIdx.x, blockDim.x);
  }
};

/// The row function (block-cooperative: only for a kernel whose every thread calls it once, with
/// tuning::copy_threads threads per block and groups of whole warps: the gather).
struct prioritized_gather_rows {
  slot_table table;
  selection_request request;  // scratch: 2 * batch words, the log leaves at [batch, 2 * batch)
  const double* nodes = nullptr;
  sum_tree_shape shape{};
  bool stratified = false;
  double beta = 0;

  __device__ selected_row operator()(std::int64_t row, const row_group& g) const {
    constexpr int halves = 32 / sum_tree_group;  // 16-lane groups in a warp
    __shared__ sum_tree_scan::TempStorage storage[row_group::max_groups * halves];
    __shared__ std::int64_t chosen[row_group::max_groups];
    __shared__ double chosen_leaf[row_group::max_groups], chosen_root[row_group::max_groups];
    const int k = g.group;
    if (g.active && g.lane < 32) {  // the group's first warp, all of it or none
      const double root = nodes[0];
      if (root > 0) {
        const double u = priority_target(request.draw, row, request.batch, stratified, root);
        double leaf = root;  // a tree of one leaf is its root
        const int lane = g.lane % sum_tree_group;
        const std::int64_t slot =
            shape.levels > 1
                ? sum_tree_find_group(storage[k * halves + g.lane / sum_tree_group], nodes, nodes,
                                      /*top_levels=*/0, shape, u, lane, leaf)
                : 0;
        if (g.lane == 0) {
          chosen[k] = slot;
          chosen_leaf[k] = leaf;
          chosen_root[k] = root;
          request.scratch[request.batch + row] = double_as_word(::log(leaf));
        }
      } else if (g.lane == 0) {
        chosen[k] = uniform_row(table, request, true, row);
        chosen_leaf[k] = 0;
        chosen_root[k] = 0;
      }
    }
    __syncthreads();
    if (!g.active) return {};
    const std::int64_t slot = chosen[k];
    if (!(chosen_root[k] > 0))
      return {slot, table.live > 0 ? 1.0f / static_cast<float>(table.live) : 0.0f, 1.0f};
    return {slot, static_cast<float>(chosen_leaf[k] / chosen_root[k]), 1.0f};  // weight: epilogue
  }
  /// In a kernel of a sample with a gear::device_rng: the live count and draw as they are now.
  __device__ void read_device_counts() noexcept { detail::read_device_counts(table, request); }
  [[nodiscard]] prioritized_weights_epilogue epilogue() const noexcept {
    return {request, nodes, beta, request.arrivals};
  }
};

}  // namespace gear::detail
