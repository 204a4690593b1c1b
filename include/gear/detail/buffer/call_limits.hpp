#pragma once
// replay_buffer::reserve_staging: the staging of calls up to declared limits (gear::call_limits),
// allocated at once instead of during the run.
//
// The buffer's staging pool (staging.hpp) gets `in_flight` + `writers` large entries, each with
// room for the largest insert (its rows table and plan, its host data, its commit records) or a
// writer's chunk (with device room for its data where host inserts may land, held until
// published); 2 x `in_flight` for the leases of settles publishing landing inserts (one per call
// in flight, of the size of the largest settle, or small), and 2 x `in_flight` small ones
// for the rest (the records of a batch's removals and the rows it stages for the GPU, an erase
// or a commit; the rows a sample under max_times_sampled reads back, which holds two at once);
// the selection state its own staging (select::fifo / lifo's chosen rows where a sample has no
// lease of its own, select::prioritized's host-span updates); a consuming policy its return
// counts.
// Leases take the smallest idle entry that fits, so small calls keep to the small entries (and a
// small call takes a larger idle entry before it makes one: staging.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <gear/call_limits.hpp>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/buffer/insert_pipeline.hpp>
#include <gear/error.hpp>
#include <gear/select/concept.hpp>
#include <gear/writer.hpp>
#include <string>

namespace gear::detail {

/// Throws errc::invalid_argument, naming the field, unless `l` suits a buffer of `capacity` slots
/// of `max_length` steps.
inline void check_call_limits(const call_limits& l, std::int64_t capacity,
                              std::int64_t max_length) {
  auto require = [](bool ok, const char* what, std::int64_t got, const std::string& range) {
    GEAR_REQUIRE(ok, errc::invalid_argument,
                 std::string("call_limits.") + what + " must be in " + range + ", got " +
                     std::to_string(got));
  };
  const std::int64_t trajectories = l.insert_trajectories;
  require(trajectories >= 1 && trajectories <= capacity, "insert_trajectories", trajectories,
          "[1, capacity = " + std::to_string(capacity) + "]");
  const std::int64_t steps = l.insert_steps;  // at most max_length a trajectory, without overflow
  require(steps >= trajectories &&
              steps / trajectories + (steps % trajectories != 0 ? 1 : 0) <= max_length,
          "insert_steps", steps,
          "[insert_trajectories, insert_trajectories x max_length = " +
              std::to_string(trajectories) + " x " + std::to_string(max_length) + "]");
  require(l.batch >= 1 && l.batch <= (std::int64_t{1} << 32), "batch", l.batch, "[1, 2^32]");
  require(l.in_flight >= 1 && l.in_flight <= 64, "in_flight", l.in_flight, "[1, 64]");
  require(l.writers >= 0 && l.writers <= 256, "writers", l.writers, "[0, 256]");
}

template <class Core>
void reserve_call_staging(Core& b, const call_limits& l) {
  check_call_limits(l, b.capacity_, b.max_length_);
  if constexpr (Core::on_device) {
    const auto held = b.lock();
    b.check_usable();
    // The journal of `count` slots, with as many dense-index changes still pending from calls
    // that applied none (landing inserts).
    auto records = [](std::int64_t count) { return Core::journal_bytes(count, count); };
    const insert_staging<Core> insert(l.insert_trajectories, l.insert_steps, /*from_host=*/true);
    const auto batch = static_cast<std::size_t>(l.batch);
    const auto in_flight = static_cast<std::size_t>(l.in_flight);
    // A consuming sample's lease holds its rows after its removal's records (sample.hpp).
    const std::size_t small = std::max({records(l.batch) + batch * sizeof(std::int64_t),
                                        records(l.insert_trajectories)});
    const std::size_t large = std::max({insert.records_at() + records(l.insert_trajectories),
                                        writer<Core>::staging_bytes(b.max_length_), small});
    // A landing insert (landing.hpp) holds its entry, pinned and device parts, until a later call
    // publishes it: it counts among the inserts in flight, and where inserts may land (every
    // column in device memory) the insert entries have device room for their data.
    const auto staged = static_cast<std::size_t>(insert.staged_bytes);
    const std::size_t device =
        std::max(insert.table_bytes, Core::all_in_device_memory ? staged : std::size_t{0});
    // A settle publishing them: a record, a dense-index change and a piece per trajectory and
    // column, and a signal per insert. Any call may settle first, so each call in flight, insert
    // or other, may hold a settle's lease beside its own staging: entries of their own, so that
    // the small ones stay small.
    const std::int64_t landed = l.in_flight * l.insert_trajectories;
    const std::size_t settle = settle_layout(Core::journal_bytes(landed, landed),
                                             landed * static_cast<std::int64_t>(Core::num_columns))
                                   .bytes(l.in_flight + 1);
    // Counted from the largest down: every larger entry also fits a smaller lease (an insert's
    // needs its device part, which only the large entries have).
    const auto large_count = in_flight + static_cast<std::size_t>(l.writers);
    const std::size_t settles = 2 * in_flight;
    if (settle > large) b.staging_.reserve(settles, settle, 0);
    b.staging_.reserve(large_count, large, device);
    if (settle > small && settle <= large) b.staging_.reserve(large_count + settles, settle, 0);
    b.staging_.reserve(large_count + settles + 2 * in_flight, small, 0);
    if constexpr (staging_reserving<typename Core::state_type>)
      b.selection_->reserve_staging(l.batch);
    b.drawn_slots_.reserve(batch);
    b.removal_runs_.reserve(batch);
    if (consuming_policy<typename Core::selection_type> && b.times_sampled_.empty())
      b.times_sampled_.assign(static_cast<std::size_t>(b.capacity_), 0);
  } else {
    (void)b;  // host storage stages nothing: selection and copies run on the CPU
  }
}

}  // namespace gear::detail
