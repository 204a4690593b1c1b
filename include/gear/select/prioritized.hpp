#pragma once
// Prioritized selection (Schaul et al., "Prioritized Experience Replay", 2016).
//
// Every committed trajectory i has a priority p_i >= 0 and is drawn with probability
//
//   P(i) = p_i^alpha / sum_j p_j^alpha          (j over committed trajectories)
//
// with replacement. Each row also gets the importance weight
//
//   w_i = (N * P(i))^-beta / max_{rows k of this batch} (N * P(k))^-beta  =  (P_min / P(i))^beta
//
// normalised by the largest weight *of the batch* (as in the paper's algorithm 1), so weights lie
// in [0, 1] (0 only where (P_min / P(i))^beta underflows a float: a large beta over a wide range
// of priorities) and the row with the smallest probability has weight 1; N is the number of
// committed trajectories.
//
// - New trajectories enter with the largest priority given so far, or 1 where that is larger
//   (so 1 before any update, and while every priority given is below 1).
// - replay_buffer::update_priorities(keys, priorities) sets priorities in batches and returns
//   {applied, stale}: keys must be of this shard (errc::key_out_of_range) and priorities finite
//   and >= 0 (errc::invalid_priority), checked before anything changes; keys whose trajectory was
//   evicted or removed since it was sampled are skipped and counted. A slot named twice in one
//   batch takes the priority of its *last* occurrence (last write wins).
// - On the GPU, update_priorities(keys, priorities, gear::memory_kind::device, stream) takes both
//   arrays in device memory (a batch's keys, TD errors from the learner): the same checks run on
//   the GPU, in the update's own two launches; stale keys are skipped and counted (stale_pairs);
//   a batch with a bad pair changes nothing and its error is raised later on the host (see
//   replay_buffer::update_priorities_async).
// - The largest priority so far is tracked where the state lives (on the device: in device
//   memory, folded by the update kernels; commits read it there in stream order).
// - alpha and beta change at run time with state::set_exponents (buf.selection_state()):
//   beta costs nothing, a new alpha recomputes every leaf (O(capacity), once). The buffer does
//   not order this call against its other streams: make it while no other thread uses the
//   buffer, on the stream that samples, or after synchronising the buffer's streams. A CUDA
//   graph captured before keeps the exponents it was captured with (its kernels take them as
//   arguments): capture it again after changing them.
// - With alpha > 0, a trajectory of priority 0 is never drawn while some other has a positive
//   priority, and if every committed priority is 0, selection falls back to uniform, with
//   weights 1. With alpha = 0 every trajectory weighs 1 (0^0 = 1): uniform, priority 0 included.
//   A priority whose p^alpha could make the tree's sum overflow (p^alpha x capacity not finite),
//   or underflows to 0 for p > 0, is refused (errc::invalid_priority) rather than taking every
//   draw or none; on the GPU too, for updates from device memory.
// - stratified = true draws row r from the r-th of B equal slices of the total mass (the paper's
//   stratified sampling): lower variance, same marginal distribution for a row picked at random.
//
// Both states keep p^alpha in a 16-ary fp64 sum tree (detail/sum_tree.hpp). Selection descends it
// once per row, O(B log N); an update rewrites the touched leaves and recomputes exactly their
// ancestors, O(B log N), independent of capacity. Internal nodes are always recomputed from their
// children, never adjusted by deltas, so the sums do not drift however many updates are made
// (an update whose launches fail halfway makes the buffer unusable: its sums are not trusted).
// Slots that are empty, pending or evicted have leaf 0.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/config.hpp>
#include <gear/detail/sum_tree.hpp>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <gear/select/concept.hpp>
#include <gear/select/uniform.hpp>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace gear::select {

/// Prioritized selection with importance weights.
struct prioritized {
  /// Priority exponent: 0 is uniform, 1 is proportional to the priority.
  double alpha = 0.6;
  /// Importance-weight exponent: 0 gives weights 1, 1 fully corrects the sampling bias.
  double beta = 0.4;
  /// Draw row r of B from the r-th of B equal slices of the total mass.
  bool stratified = false;

  template <class Space>
  class state;
};

}  // namespace gear::select

namespace gear::detail {

/// A slot's raw priority when it holds no committed trajectory (its leaf is 0). Any negative or
/// NaN raw priority means the same (device memory starts as all-ones bytes, a NaN).
inline constexpr float no_priority = -1.0f;

/// The leaf value of a raw priority: p^alpha, or 0 for a slot without a committed trajectory.
GEAR_HD inline double priority_leaf(float priority, double alpha) noexcept {
  return priority >= 0 ? ::pow(static_cast<double>(priority), alpha) : 0.0;
}

/// Whether a sum tree of `capacity` leaves may take priority p (finite and >= 0) under `alpha`:
/// p^alpha times the capacity finite (so the leaves' sum is, whichever they are), and p^alpha > 0
/// for p > 0 (else it could never be drawn).
GEAR_HD inline bool priority_in_range(float p, double alpha, std::int64_t capacity) noexcept {
  if (!(p >= 0 && p <= 0x1.fffffep127f)) return false;  // NaN, negative or infinite
  if (p == 0) return true;  // leaf 0, or 1 at alpha 0 (the apply kernel's key-only check too)
  const double leaf = priority_leaf(p, alpha);
  return leaf * static_cast<double>(capacity) <= 0x1.fffffffffffffp1023 && leaf > 0;
}

/// The uniform variate in [0, root) that row `row` descends the tree with.
GEAR_HD inline double priority_target(const rng_draw& draw, std::int64_t row, std::int64_t batch,
                                      bool stratified, double root) noexcept {
  const detail::u32x4 b = draw.bits(static_cast<std::uint64_t>(row), 0);
  const double u = unit_interval((std::uint64_t{b.x} << 32) | b.y);
  const double at = stratified ? (static_cast<double>(row) + u) / static_cast<double>(batch) : u;
  return std::min(at, 1.0) * root;
}

/// (P_min / P_i)^beta = (leaf_min / leaf_i)^beta: row i's weight normalised by the batch maximum.
GEAR_HD inline float importance_weight(double leaf, double leaf_min, double beta) noexcept {
  return static_cast<float>(::pow(leaf_min / leaf, beta));
}

inline void validate_exponents(double alpha, double beta) {
  GEAR_REQUIRE(std::isfinite(alpha) && alpha >= 0, errc::invalid_argument,
               "priority exponent alpha must be finite and >= 0, got " + std::to_string(alpha));
  GEAR_REQUIRE(std::isfinite(beta) && beta >= 0, errc::invalid_argument,
               "importance exponent beta must be finite and >= 0, got " + std::to_string(beta));
}

/// Throws errc::invalid_argument (a new alpha is refused, nothing changes) unless the priorities
/// stored, from the smallest positive one to the largest (or the one new trajectories enter
/// with, if larger), keep p^alpha in the range a sum tree of `capacity` leaves draws from: no
/// leaf infinite or 0 for p > 0, and their sum finite.
inline void validate_alpha_change(double alpha, float smallest_positive, float largest,
                                  std::int64_t capacity) {
  const double top = priority_leaf(largest, alpha);
  GEAR_REQUIRE(std::isfinite(top * static_cast<double>(capacity)), errc::invalid_argument,
               "alpha " + std::to_string(alpha) + " would make the priority " +
                   std::to_string(largest) + " weigh " + std::to_string(top) +
                   " (p^alpha), past what a sum tree of " + std::to_string(capacity) +
                   " leaves can add up; the exponents stay as they were");
  if (smallest_positive > 0 && std::isfinite(smallest_positive))
    GEAR_REQUIRE(priority_leaf(smallest_positive, alpha) > 0, errc::invalid_argument,
                 "alpha " + std::to_string(alpha) + " would make the priority " +
                     std::to_string(smallest_positive) +
                     " weigh 0 (p^alpha underflows): it could never be drawn; the exponents "
                     "stay as they were");
}

// ---- updates from device memory: checks made on the GPU, and their verdicts ------------------

/// The verdict of an update without a bad pair.
inline constexpr unsigned long long priority_ok = ~0ull;

/// The verdict naming pair `index` as bad for `code`. Verdicts are folded with a minimum, which
/// picks the first bad key or, when every key is good, the first bad priority: the order in which
/// the host path checks (every key, then every priority).
GEAR_HD constexpr unsigned long long priority_verdict(errc code, std::uint64_t index) noexcept {
  const unsigned long long priority_class = code == errc::invalid_priority ? 1ull << 63 : 0;
  return priority_class | (index << 8) | static_cast<unsigned long long>(code);
}
GEAR_HD constexpr std::uint64_t priority_verdict_index(unsigned long long verdict) noexcept {
  return (verdict & ~(1ull << 63)) >> 8;
}
GEAR_HD constexpr errc priority_verdict_code(unsigned long long verdict) noexcept {
  return static_cast<errc>(verdict & 0xFFu);
}

/// The verdict of a good pair whose key names a sibling shard (another shard of the same
/// sharded_buffer): that shard's to apply; skipped here, not counted as stale.
inline constexpr unsigned long long priority_sibling = ~0ull - 1;

/// Checks pair `index` of an update the way replay_buffer::check_key and validate_priorities do,
/// against slot metadata (lengths: committed length, 0 unless committed; tickets): returns
/// priority_ok, priority_sibling (a key of shard [0, siblings) other than the owner's, of its
/// incarnation, with a good priority) or the pair's verdict. Runs unchanged in the update kernel.
GEAR_HD inline unsigned long long check_priority_pair(const key& k, float priority, double alpha,
                                                      std::uint64_t index,
                                                      const std::int64_t* lengths,
                                                      const std::uint64_t* tickets,
                                                      std::int64_t capacity, key_owner owner,
                                                      std::uint32_t siblings = 0) noexcept {
  const bool sibling =
      k.incarnation == owner.incarnation && k.shard != owner.shard && k.shard < siblings;
  if (!owner.owns(k) && !sibling)  // another buffer's shard, or another incarnation
    return priority_verdict(errc::key_out_of_range, index);
  if (!priority_in_range(priority, alpha, capacity))  // NaN, negative, infinite; p^alpha
    return priority_verdict(errc::invalid_priority, index);
  if (sibling) return priority_sibling;
  const std::int64_t slot = k.slot(capacity);
  if (tickets[slot] != k.ticket || lengths[slot] <= 0)
    return priority_verdict(errc::stale_key, index);  // skipped and counted, not a failure
  return priority_ok;
}

/// A failed update from device memory, as the GPU records it for the host.
struct priority_failure {
  std::uint64_t call = 0;   ///< which update from device memory on this state (1 for the first)
  std::uint64_t index = 0;  ///< its first bad pair
  key bad_key{};            ///< that pair's key
  float priority = 0;       ///< that pair's priority
  std::int32_t code = 0;    ///< the errc
};

/// Failures recorded before the host raises them; older ones are overwritten.
inline constexpr int priority_failure_log = 64;

/// Where the GPU reports failed updates from device memory (mapped pinned memory, written only by
/// the update kernels, read by the host without synchronising).
struct priority_report {
  priority_failure log[priority_failure_log];  ///< failure n (0, 1, ...) at n % log size
  std::uint64_t failures = 0;                  ///< failures so far, stored after their entry
};

/// What went wrong in one failure (`capacity` slots), for the message of its gear::error.
inline std::string priority_failure_message(const priority_failure& f, std::int64_t capacity) {
  const key& k = f.bad_key;
  std::string what = "update_priorities from device memory (call " + std::to_string(f.call) +
                     ") changed nothing: ";
  switch (static_cast<errc>(f.code)) {
    case errc::key_out_of_range:
      return what + "key " + std::to_string(f.index) + " (shard " + std::to_string(k.shard) +
             ", incarnation " + std::to_string(k.incarnation) + ", ticket " +
             std::to_string(k.ticket) + ") is not in this shard";
    case errc::stale_key:
      return what + "key " + std::to_string(f.index) + " (ticket " + std::to_string(k.ticket) +
             ", slot " + std::to_string(k.slot(capacity)) + ") names a trajectory no longer stored";
    default:
      return what + "priority " + std::to_string(f.index) + " is " + std::to_string(f.priority) +
             "; priorities must be finite and >= 0";
  }
}

/// Throws the earliest failure in `report` not yet raised (`raised` counts those that were), naming
/// how many more failed since; afterwards every failure seen is counted as raised. Never blocks:
/// a failure whose kernel has not finished is not seen yet.
inline void raise_priority_failures(priority_report& report, std::uint64_t& raised,
                                    std::int64_t capacity) {
  auto failures = [&] {
    return std::atomic_ref<std::uint64_t>(report.failures).load(std::memory_order_acquire);
  };
  const std::uint64_t seen = failures();
  if (seen <= raised) return;
  const std::uint64_t first = raised, more = seen - first - 1;
  raised = seen;
  constexpr auto log = static_cast<std::uint64_t>(priority_failure_log);
  const priority_failure f = report.log[first % log];
  std::atomic_thread_fence(std::memory_order_acquire);  // the entry is read before the recount
  std::string tail;
  if (more > 0)
    tail = " (and " + std::to_string(more) + " later update" + (more > 1 ? "s" : "") +
           " from device memory failed and changed nothing)";
  if (failures() - first < log)  // failure first + log (same entry) had not started writing
    throw error(static_cast<errc>(f.code), priority_failure_message(f, capacity) + tail);
  // More failed than the log holds before any was raised: the first one's entry is gone.
  const priority_failure latest = report.log[(seen - 1) % log];
  throw error(static_cast<errc>(latest.code),
              std::to_string(more + 1) +
                  " updates from device memory failed and changed nothing before any was raised; "
                  "the latest: " +
                  priority_failure_message(latest, capacity));
}

/// Throws (changing nothing) unless there is one priority per key and each is finite and >= 0.
/// Returns the largest priority.
/// Also refuses a priority out of range for a tree of `capacity` leaves under `alpha`
/// (priority_in_range: p^alpha so large that the leaves' sum could overflow, or 0 while p > 0).
/// p^alpha rises with p (alpha >= 0), so only the smallest positive and the largest priority are
/// raised to alpha; a pair found bad that way is then looked for from the first, so that the
/// error names the first bad pair.
inline float validate_priorities(std::span<const key> keys, std::span<const float> priorities,
                                 double alpha, std::int64_t capacity) {
  GEAR_REQUIRE(keys.size() == priorities.size(), errc::invalid_argument,
               "update_priorities needs one priority per key: " + std::to_string(keys.size()) +
                   " keys, " + std::to_string(priorities.size()) + " priorities");
  check_not_null(keys.data(), keys.size(), "keys");
  check_not_null(priorities.data(), priorities.size(), "priorities");
  GEAR_REQUIRE(keys.size() < (std::size_t{1} << 32), errc::invalid_argument,
               "update_priorities takes fewer than 2^32 keys at once");
  const auto in_range = [&](float p) { return priority_in_range(p, alpha, capacity); };
  float largest = 0, smallest = std::numeric_limits<float>::infinity();  // smallest positive
  bool finite = true;
  for (const float p : priorities) {  // one branch-free pass: NaN fails `p >= 0`
    finite &= p >= 0 && p <= std::numeric_limits<float>::max();
    largest = std::max(largest, p);
    smallest = p > 0 ? std::min(smallest, p) : smallest;
  }
  if (finite && in_range(largest) && (std::isinf(smallest) || in_range(smallest))) return largest;
  for (std::size_t i = 0; i < priorities.size(); ++i) {
    const float p = priorities[i];
    GEAR_REQUIRE(std::isfinite(p) && p >= 0, errc::invalid_priority,
                 "priority " + std::to_string(i) + " is " + std::to_string(p) +
                     "; priorities must be finite and >= 0");
    GEAR_REQUIRE(in_range(p), errc::invalid_priority,
                 "priority " + std::to_string(i) + " is " + std::to_string(p) +
                     ": p^alpha (alpha " + std::to_string(alpha) + ") is " +
                     std::to_string(priority_leaf(p, alpha)) +
                     ", outside the range a sum tree of " + std::to_string(capacity) +
                     " leaves can draw from (p^alpha x capacity finite, > 0 for p > 0)");
  }
  return largest;  // not reached: a pair failed above
}

}  // namespace gear::detail

namespace gear::select {

/// Host side: the sum tree in host memory; a loop over rows. Also the tests' oracle.
template <>
class prioritized::state<exec::host> {
 public:
  state(const prioritized& policy, std::int64_t capacity)
      : policy_(policy),
        shape_(detail::make_sum_tree_shape(capacity)),
        tree_(static_cast<std::size_t>(shape_.total), 0.0),
        priorities_(static_cast<std::size_t>(capacity), detail::no_priority) {
    detail::validate_exponents(policy.alpha, policy.beta);
  }

  // ---- settings ----------------------------------------------------------------------------

  /// Sets the exponents (beta annealing: call before each sample). A changed alpha recomputes
  /// every leaf, O(capacity). Throws errc::invalid_argument (not finite, or negative; or an alpha
  /// under which a stored priority's p^alpha would leave the range, validate_alpha_change),
  /// changing nothing.
  void set_exponents(double alpha, double beta) {
    detail::validate_exponents(alpha, beta);
    const bool rebuild = alpha != policy_.alpha;
    if (rebuild) {
      float smallest = std::numeric_limits<float>::infinity(), largest = max_priority_;
      for (const float p : priorities_)
        if (p > 0) {
          smallest = std::min(smallest, p);
          largest = std::max(largest, p);
        }
      detail::validate_alpha_change(alpha, smallest, largest,
                                    static_cast<std::int64_t>(priorities_.size()));
    }
    policy_.alpha = alpha;
    policy_.beta = beta;
    if (!rebuild) return;
    for (std::size_t i = 0; i < priorities_.size(); ++i)
      tree_[static_cast<std::size_t>(shape_.leaf(static_cast<std::int64_t>(i)))] =
          detail::priority_leaf(priorities_[i], alpha);
    detail::sum_tree_rebuild(tree_.data(), shape_);
    root_.store(tree_[0], std::memory_order_relaxed);
  }
  void set_exponents(double alpha, double beta, cuda::stream_ref) { set_exponents(alpha, beta); }
  [[nodiscard]] double alpha() const noexcept { return policy_.alpha; }
  [[nodiscard]] double beta() const noexcept { return policy_.beta; }
  /// The settings as they are now.
  [[nodiscard]] const prioritized& policy() const noexcept { return policy_; }
  /// The priority new trajectories enter with: max(1, the largest given so far).
  [[nodiscard]] float max_priority() const noexcept { return max_priority_; }
  /// The same; the stream is for code written for both states (the device state's synchronises).
  [[nodiscard]] float max_priority(cuda::stream_ref) const noexcept { return max_priority_; }

  // ---- inspection (tests, diagnostics) -----------------------------------------------------

  /// sum of p^alpha over committed trajectories (the root of the tree). Any thread may read it
  /// while the buffer changes the tree (a copy of the root kept atomic: a sharded buffer's or a
  /// shard server's snapshot of the masses).
  [[nodiscard]] double total() const noexcept { return root_.load(std::memory_order_relaxed); }
  /// The raw priority of `slot` (-1 without a committed trajectory).
  [[nodiscard]] float priority(std::int64_t slot) const {
    return priorities_.at(static_cast<std::size_t>(slot));
  }
  /// p^alpha of `slot` as the tree holds it.
  [[nodiscard]] double leaf(std::int64_t slot) const {
    return tree_.at(static_cast<std::size_t>(shape_.leaf(slot)));
  }
  [[nodiscard]] const detail::sum_tree_shape& shape() const noexcept { return shape_; }
  [[nodiscard]] const std::vector<double>& nodes() const noexcept { return tree_; }

  // ---- the selection concept ---------------------------------------------------------------

  void validate(const slot_table&, std::int64_t) const {}

  void select(const slot_table& t, const selection_request& r, cuda::stream_ref) {
    const double root = tree_[0];
    if (!(root > 0)) {  // every committed priority is 0: uniform
      for (std::int64_t row = 0; row < r.batch; ++row) {
        r.slots[row] = detail::uniform_row(t, r, true, row);
        r.probabilities[row] = 1.0f / static_cast<float>(t.live);
        r.weights[row] = 1.0f;
      }
      return;
    }
    double leaf_min = root;
    for (std::int64_t row = 0; row < r.batch; ++row) {
      const double u = detail::priority_target(r.draw, row, r.batch, policy_.stratified, root);
      const std::int64_t slot = detail::sum_tree_find(tree_.data(), shape_, u);
      const double leaf = tree_[static_cast<std::size_t>(shape_.leaf(slot))];
      r.slots[row] = slot;
      r.probabilities[row] = static_cast<float>(leaf / root);
      leaf_min = std::min(leaf_min, leaf);
    }
    for (std::int64_t row = 0; row < r.batch; ++row)
      r.weights[row] = detail::importance_weight(
          tree_[static_cast<std::size_t>(shape_.leaf(r.slots[row]))], leaf_min, policy_.beta);
  }

  // ---- hooks the buffer calls --------------------------------------------------------------

  /// Sets the priorities of live keys (checked by the buffer). Last write wins for a slot named
  /// twice. Throws errc::invalid_priority / errc::invalid_argument before changing anything.
  void update(const slot_table&, std::span<const key> keys, std::span<const float> priorities,
              cuda::stream_ref) {
    const float largest = detail::validate_priorities(
        keys, priorities, policy_.alpha, static_cast<std::int64_t>(priorities_.size()));
    for (std::size_t i = 0; i < keys.size(); ++i)
      set(keys[i].slot(static_cast<std::int64_t>(priorities_.size())), priorities[i]);
    max_priority_ = std::max(max_priority_, largest);
  }

  void on_commit(const slot_table& t, std::uint64_t first_ticket, std::int64_t count,
                 cuda::stream_ref) {
    for (std::int64_t i = 0; i < count; ++i) set(ring_slot(t, first_ticket, i), max_priority_);
  }

  void on_evict(const slot_table& t, std::uint64_t first_ticket, std::int64_t count,
                cuda::stream_ref) {
    for (std::int64_t i = 0; i < count; ++i)
      set(ring_slot(t, first_ticket, i), detail::no_priority);
  }

 private:
  static std::int64_t ring_slot(const slot_table& t, std::uint64_t first, std::int64_t i) noexcept {
    return static_cast<std::int64_t>((first + static_cast<std::uint64_t>(i)) %
                                     static_cast<std::uint64_t>(t.capacity));
  }

  void set(std::int64_t slot, float priority) {
    priorities_[static_cast<std::size_t>(slot)] = priority;
    tree_[static_cast<std::size_t>(shape_.leaf(slot))] =
        detail::priority_leaf(priority, policy_.alpha);
    detail::sum_tree_refresh_path(tree_.data(), shape_, slot);
    root_.store(tree_[0], std::memory_order_relaxed);
  }

  prioritized policy_;
  detail::sum_tree_shape shape_;
  std::vector<double> tree_;
  std::atomic<double> root_{0.0};  // tree_[0], for total()
  std::vector<float> priorities_;
  float max_priority_ = 1.0f;
};

}  // namespace gear::select
