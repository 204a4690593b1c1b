#pragma once
// The sum tree behind gear::select::prioritized: shape maths, descent and refresh, shared
// unchanged by the host state and the device kernels.
//
// A 16-ary tree of fp64 sums stored level by level in one array, root first:
//
//   level 0          [root][pad x 15]
//   level 1          [n0 .. n15]                         children of the root
//   ...
//   level D-1 (leaf) [leaf 0 .. leaf capacity-1][pad]    leaf i holds slot i's p_i^alpha
//
// Each level is padded to a multiple of 16 entries (padding holds 0), so the 16 children of any
// node are one aligned 128-byte line: a descent reads D - 1 lines and a refresh of one node sums
// one line. Every internal node always equals the fp64 sum of its 16 children added in index
// order, recomputed (never adjusted by deltas) whenever a child changes, so the tree after any
// history of updates is bit for bit the tree built fresh from its leaves: the sums cannot drift.

#include <cstdint>
#include <gear/config.hpp>

namespace gear::detail {

/// Children per node; 16 doubles are one 128-byte cache line.
inline constexpr int sum_tree_fanout = 16;
/// Lanes of a GPU group that works on one node's children together (the descent of a row, the
/// refresh of an updated pair's path): one per child.
inline constexpr int sum_tree_group = sum_tree_fanout;
static_assert(32 % sum_tree_group == 0, "a group of lanes lies within one warp");
/// Levels of the largest tree (16^10 = 2^40 leaves, the largest capacity, plus the root).
inline constexpr int sum_tree_max_levels = 12;

/// Where each level of a sum tree over `capacity` leaves lives in its node array.
struct sum_tree_shape {
  int levels = 1;                                 ///< root is level 0, leaves level levels - 1
  std::int64_t offset[sum_tree_max_levels] = {};  ///< first entry of each level
  std::int64_t count[sum_tree_max_levels] = {};   ///< entries in use at each level
  std::int64_t total = 0;                         ///< entries of the whole array, padding included

  /// Array index of the leaf of `slot`.
  GEAR_HD constexpr std::int64_t leaf(std::int64_t slot) const noexcept {
    return offset[levels - 1] + slot;
  }
  /// Entries of levels 0 .. levels - 2 (the internal nodes, which come first).
  GEAR_HD constexpr std::int64_t internal() const noexcept { return offset[levels - 1]; }
};

GEAR_HD constexpr std::int64_t sum_tree_padded(std::int64_t n) noexcept {
  return (n + sum_tree_fanout - 1) / sum_tree_fanout * sum_tree_fanout;
}

/// The shape of the tree over `capacity` >= 1 leaves.
GEAR_HD constexpr sum_tree_shape make_sum_tree_shape(std::int64_t capacity) noexcept {
  std::int64_t counts[sum_tree_max_levels] = {};
  int n = 0;
  for (std::int64_t c = capacity;; c = (c + sum_tree_fanout - 1) / sum_tree_fanout) {
    counts[n++] = c;  // bottom-up
    if (c == 1) break;
  }
  sum_tree_shape s;
  s.levels = n;
  std::int64_t at = 0;
  for (int d = 0; d < n; ++d) {
    s.count[d] = counts[n - 1 - d];
    s.offset[d] = at;
    at += sum_tree_padded(s.count[d]);
  }
  s.total = at;
  return s;
}

/// The fp64 sum of the 16 children of node j of level d (d < levels - 1), in index order.
GEAR_HD inline double sum_tree_children(const double* tree, const sum_tree_shape& s, int d,
                                        std::int64_t j) noexcept {
  const double* child = tree + s.offset[d + 1] + j * sum_tree_fanout;
  double sum = 0;
  for (int c = 0; c < sum_tree_fanout; ++c) sum += child[c];
  return sum;
}

/// The inclusive prefix sums of a node's 16 children in the order a 16-lane warp scan adds them
/// (Kogge-Stone: at step k every entry adds the one 2^k before it), so that the host and the
/// device descent (sum_tree_select.cuh, cub::WarpScan) compute the same bits. Not the index-order
/// fold of sum_tree_children: prefixes only pick a child, and never become a node's sum.
GEAR_HD inline void sum_tree_scan_children(const double* v, double* prefix) noexcept {
  for (int c = 0; c < sum_tree_fanout; ++c) prefix[c] = v[c];
  for (int offset = 1; offset < sum_tree_fanout; offset *= 2)
    for (int c = sum_tree_fanout - 1; c >= offset; --c)  // downwards: reads the last step's
      prefix[c] = prefix[c - offset] + prefix[c];
}

/// The child a descent takes at a node with children `v` and their prefixes (as above): the first
/// positive child whose prefix exceeds u, or, when rounding carries u past them all, the last
/// positive one. u becomes u less the prefix before that child.
GEAR_HD inline int sum_tree_pick(const double* v, const double* prefix, double& u) noexcept {
  int pick = -1, last = 0;
  for (int c = 0; c < sum_tree_fanout; ++c) {
    if (!(v[c] > 0)) continue;
    last = c;
    if (pick < 0 && u < prefix[c]) pick = c;
  }
  if (pick < 0) pick = last;
  if (pick > 0) u -= prefix[pick - 1];
  return pick;
}

/// The leaf (slot) whose prefix interval of the leaf values holds u, 0 <= u < root. Only leaves
/// with a positive value are ever returned: rounding that carries u past the last positive child
/// of a node picks that child. Requires the root to be positive. Bit for bit the device's
/// descent (sum_tree_find_group) for the same tree and u.
GEAR_HD inline std::int64_t sum_tree_find(const double* tree, const sum_tree_shape& s,
                                          double u) noexcept {
  std::int64_t j = 0;
  for (int d = 0; d + 1 < s.levels; ++d) {
    const double* child = tree + s.offset[d + 1] + j * sum_tree_fanout;
    double v[sum_tree_fanout], prefix[sum_tree_fanout];
    for (int c = 0; c < sum_tree_fanout; ++c)
      v[c] = child[c];  // one line, loads in flight together
    sum_tree_scan_children(v, prefix);
    j = j * sum_tree_fanout + sum_tree_pick(v, prefix, u);
  }
  return j;
}

/// Recomputes the ancestors of leaf `slot` after it changed (host; the device refresh is in
/// select_prioritized.cuh and produces the same sums).
inline void sum_tree_refresh_path(double* tree, const sum_tree_shape& s,
                                  std::int64_t slot) noexcept {
  std::int64_t j = slot;
  for (int d = s.levels - 1; d > 0; --d) {
    j /= sum_tree_fanout;
    tree[s.offset[d - 1] + j] = sum_tree_children(tree, s, d - 1, j);
  }
}

/// Recomputes every internal node from the leaves (host).
inline void sum_tree_rebuild(double* tree, const sum_tree_shape& s) noexcept {
  for (int d = s.levels - 2; d >= 0; --d)
    for (std::int64_t j = 0; j < s.count[d]; ++j)
      tree[s.offset[d] + j] = sum_tree_children(tree, s, d, j);
}

/// A uniform double in [0, 1) from 53 random bits.
GEAR_HD constexpr double unit_interval(std::uint64_t bits) noexcept {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace gear::detail
