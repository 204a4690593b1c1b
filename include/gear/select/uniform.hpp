#pragma once
// Uniform selection: every committed trajectory equally likely, with or without replacement.
//
// Each row draws a position in the buffer's dense index of committed slots (slot_ring.hpp): one
// draw per row, exactly uniform, O(1) whatever the occupancy (a buffer of 2^20 slots with 1000
// live costs what a full one does). Without replacement a row redraws while it hits a slot
// another row of the batch already claimed: uniform over subsets of the batch's size, a batch of
// B from N costing O(B * N / (N - B)) draws in all; every row stops after 64 draws and falls back
// to the first unclaimed position from a uniform start, so no loop is unbounded. That fallback is
// not exactly uniform: it favours positions just after long claimed runs. A row reaches it with
// probability (c / N)^64 (c: rows claimed before it), so only batches close to N feel it: at
// B = N - 2 = 98, the two positions left out were adjacent in 2.22% of 200,000 simulated batches
// against 2.02% for uniform subsets. Draw fewer rows than about 0.9 N where that matters.
//
// The host and device states draw the same numbers from the same rng_draw, so with replacement
// they select the same slots. Without replacement on the GPU, when two rows draw the same slot,
// which of them keeps it depends on timing: the batch is a uniform subset either way, but not
// the same one at every run of the same seed. (A sample under max_times_sampled draws its rows
// on the host, one after another, and the GPU gathers those: the same subset at every run.)

#include <algorithm>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/config.hpp>
#include <gear/detail/claim.hpp>
#include <gear/detail/select_rows.hpp>
#include <gear/error.hpp>
#include <gear/select/concept.hpp>
#include <string>

namespace gear::select {

/// Uniform selection over committed trajectories.
struct uniform {
  /// false: the rows of one batch name distinct trajectories.
  bool replacement = true;

  template <class Space>
  class state;
};

}  // namespace gear::select

namespace gear::detail {

/// Draws one row makes without replacement before it falls back to a scan.
inline constexpr std::uint32_t max_uniform_attempts = 64;

/// The attempt number reserved for a row's window draw, apart from its selection draws.
inline constexpr std::uint32_t window_attempt = 0xFFFFFFFFu;

/// Selects the slot of one row uniformly (see gear::select::uniform) from the dense index of
/// committed slots: with replacement one draw of a position in [0, live), exactly uniform, O(1)
/// whatever the occupancy; without replacement up to max_uniform_attempts draws, redrawn while
/// another row has already claimed the slot, then the first unclaimed position from a uniform
/// starting point. -1 only if no committed slot is left to claim (or none is committed: a
/// replayed graph may sample a buffer emptied since its capture).
GEAR_HD inline std::int64_t uniform_row(const slot_table& t, const selection_request& r,
                                        bool replacement, std::int64_t row) {
  const auto live = static_cast<std::uint64_t>(t.live);
  const auto at = static_cast<std::uint64_t>(row);
  if (live == 0) return -1;
  if (replacement) return t.dense[r.draw.below(live, at, 0)];
  for (std::uint32_t attempt = 0; attempt < max_uniform_attempts; ++attempt) {
    const std::int64_t slot = t.dense[r.draw.below(live, at, attempt)];
    if (claim_slot(r.scratch, r.scratch_size, slot)) return slot;
  }
  const std::uint64_t pick = r.draw.below(live, at, max_uniform_attempts);
  for (std::uint64_t k = 0; k < live; ++k) {
    const std::int64_t slot = t.dense[(pick + k) % live];
    if (claim_slot(r.scratch, r.scratch_size, slot)) return slot;
  }
  return -1;
}

/// uniform_row without replacement, for row functions that several callers run for the same row
/// (the gather's blocks): the same candidates in the same order, claimed for the row
/// (claim_slot_for), so every caller settles on the same slot. Rows below 2^24 - 1.
GEAR_HD inline std::int64_t uniform_row_claimed_for(const slot_table& t, const selection_request& r,
                                                    std::int64_t row) {
  const auto live = static_cast<std::uint64_t>(t.live);
  const auto at = static_cast<std::uint64_t>(row);
  if (live == 0) return -1;
  for (std::uint32_t attempt = 0; attempt < max_uniform_attempts; ++attempt) {
    const std::int64_t slot = t.dense[r.draw.below(live, at, attempt)];
    if (claim_slot_for(r.scratch, r.scratch_size, slot, row)) return slot;
  }
  const std::uint64_t pick = r.draw.below(live, at, max_uniform_attempts);
  for (std::uint64_t k = 0; k < live; ++k) {
    const std::int64_t slot = t.dense[(pick + k) % live];
    if (claim_slot_for(r.scratch, r.scratch_size, slot, row)) return slot;
  }
  return -1;
}

/// Row function of uniform selection (see selection_policy_for's row_selector). Without
/// replacement it claims slots in request.scratch, so only the select() launch may use it then
/// (one thread per row; per_thread holds there too: a row is claimed by the one thread that
/// draws it).
struct uniform_rows {
  slot_table table;
  selection_request request;
  bool replacement = true;
  static constexpr bool per_thread = true;  // each thread may draw a row on its own

  GEAR_HD selected_row operator()(std::int64_t row) const {
    const std::int64_t slot = uniform_row(table, request, replacement, row);
    return {slot, probability(slot), 1.0f};
  }
  /// The probability of a row's `slot` (-1: none).
  GEAR_HD float probability(std::int64_t slot) const {
    return slot < 0 ? 0.0f : 1.0f / static_cast<float>(table.live);
  }
  /// In a kernel of a sample with a gear::device_rng: the live count and draw as they are now.
  GEAR_HD void read_device_counts() noexcept { detail::read_device_counts(table, request); }
};

inline void validate_uniform(const slot_table& t, std::int64_t batch, bool replacement) {
  GEAR_REQUIRE(replacement || batch <= t.live, errc::not_enough_items,
               "cannot draw " + std::to_string(batch) + " distinct trajectories from " +
                   std::to_string(t.live));
}

}  // namespace gear::detail

namespace gear::select {

/// Host side: a loop over rows.
template <>
class uniform::state<exec::host> {
 public:
  state(const uniform& policy, std::int64_t /*capacity*/) : policy_(policy) {}

  void validate(const slot_table& t, std::int64_t batch) const {
    detail::validate_uniform(t, batch, policy_.replacement);
  }

  void select(const slot_table& t, const selection_request& r, cuda::stream_ref) {
    if (!policy_.replacement) std::fill_n(r.scratch, r.scratch_size, std::uint64_t{0});
    detail::select_rows_on_host(detail::uniform_rows{t, r, policy_.replacement}, r);
  }

 private:
  uniform policy_;
};

}  // namespace gear::select
