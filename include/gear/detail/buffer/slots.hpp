#pragma once
// Reservations, commits and removals (replay_buffer::reserve, commit_async, erase_async, a
// writer's abandon, and removal after max_times_sampled returns), in the three phases of
// core.hpp: each leases memory for its slot records first, changes the ring (which writes the
// records), then publishes them to the device mirror with one apply launch, in stream order.

#include <algorithm>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/buffer/insert_pipeline.hpp>
#include <gear/key.hpp>
#include <gear/ref.hpp>
#include <span>
#include <string>
#include <vector>

namespace gear::detail {

/// Reserves `count` slots; their occupants are evicted in stream order (work enqueued earlier
/// still sees them). Does not synchronise, except to take over an open reservation (it waits
/// for the device: wait_for_takeovers) and on a buffer's first call from a second stream.
template <class Core>
reservation reserve_slots(Core& b, std::int64_t count, cuda::stream_ref stream) {
  const auto held = b.lock();
  b.check_usable(stream);
  GEAR_REQUIRE(count >= 1 && count <= b.capacity_, errc::invalid_argument,
               "reserve count must be in [1, " + std::to_string(b.capacity_) + "], got " +
                   std::to_string(count));
  settle_landing(b, landing_force{}, stream);
  const auto lease = b.lease_records(count);
  const std::uint64_t first = b.ring_.next_ticket();
  reservation r{};
  b.order_write(lease, stream);
  try {
    wait_for_takeovers(b, count);
  } catch (...) {
    b.give_back(lease);
    throw;
  }
  b.enqueue([&] {
    run_evict_hook(b, first, count, stream);
    r = b.reserve_in_ring(count, b.records_of(lease));
    b.publish(lease, count, stream);
    b.order_after(stream, Core::write);
  });
  return r;
}

/// Commits the reservation r with `lengths`; writes the keys. Stream-ordered.
template <class Core>
void commit_slots(Core& b, const reservation& r, std::span<const std::int64_t> lengths,
                  std::span<key> keys_out, cuda::stream_ref stream) {
  const auto held = b.lock();
  b.check_usable(stream);
  GEAR_REQUIRE(static_cast<std::int64_t>(lengths.size()) == r.count &&
                   static_cast<std::int64_t>(keys_out.size()) >= r.count,
               errc::invalid_argument, "commit needs one length and one key per reserved slot");
  check_not_null(lengths.data(), lengths.size(), "lengths");
  check_not_null(keys_out.data(), keys_out.size(), "keys_out");
  b.ring_.check_reservation(r);
  check_lengths(lengths, b.max_length_);
  settle_landing(b, landing_force{}, stream);
  const auto lease = b.lease_records(r.count);
  b.order_write(lease, stream);
  b.enqueue([&] {
    commit_to_ring(b, r, lengths, keys_out, b.records_of(lease));
    b.publish(lease, r.count, stream);
    run_commit_hook(b, r.first_ticket, r.count, stream);
    b.order_after(stream, Core::write);
  });
}

/// Gives up the pending slot of `ticket` (a writer destroyed without commit). Never throws; a
/// failure to publish makes the buffer unusable.
template <class Core>
void abandon_slot(Core& b, std::uint64_t ticket, cuda::stream_ref stream) noexcept {
  try {
    const auto held = b.lock();
    if (!b.failure_.empty() || !b.ring_.is_pending(ticket)) return;
    // Inside a CUDA graph capture nothing may be acquired or enqueued: the slot stays pending
    // (never sampled) until the ring comes round, as when the lease below fails.
    if constexpr (Core::on_device)
      if (stream_capturing(stream)) return;
    settle_landing(b, landing_force{}, stream);
    const auto lease = b.lease_records(1);
    b.order_write(lease, stream);
    b.enqueue([&] {
      b.ring_.abandon(ticket, b.records_of(lease));
      b.publish(lease, 1, stream);
      b.order_after(stream, Core::write);
    });
  } catch (...) {
    // Either nothing changed (the lease failed: the slot stays pending until the ring comes
    // round, never sampled), or the buffer recorded the failure.
  }
}

/// Removes the committed trajectories of `runs` (distinct tickets, each held) from the ring,
/// writing their records to `records` (null for host storage), after the policy's eviction hook
/// for each run (it may enqueue work on `stream`). Throws only what the hook throws, before the
/// ring changes.
template <class Core>
void remove_in_ring(Core& b, std::span<const ticket_run> runs, slot_record* records,
                    cuda::stream_ref stream) {
  for (const ticket_run& r : runs) run_evict_hook(b, r.first, r.count, stream);
  b.ring_.remove(runs, records);
}

/// The number of tickets in `runs`.
inline std::int64_t tickets_in(std::span<const ticket_run> runs) noexcept {
  std::int64_t n = 0;
  for (const ticket_run& r : runs) n += r.count;
  return n;
}

/// Removes the committed trajectories of `runs` (distinct tickets, each held), with a records
/// lease acquired by the caller (room for them; given back if nothing is removed) or, without
/// one, its own. Expects the buffer's mutex held.
template <class Core>
void remove_runs(Core& b, std::span<const ticket_run> runs, cuda::stream_ref stream,
                 std::optional<staging_pool::lease> lease = std::nullopt) {
  const std::int64_t n = tickets_in(runs);
  if (n == 0) {
    b.give_back(lease);
    return;
  }
  if (!lease) lease = b.lease_records(n);
  b.order_write(lease, stream);
  b.enqueue([&] {
    remove_in_ring(b, runs, b.records_of(lease), stream);
    b.publish(lease, n, stream);
    b.order_after(stream, Core::write, /*bytes=*/false);
  });
}

/// Removes the trajectories `keys`, with b's mutex held. Throws (removing nothing) for a key that
/// is not live or named twice.
template <class Core>
void erase_held_keys(Core& b, std::span<const key> keys, cuda::stream_ref stream) {
  b.check_usable(stream);
  check_not_null(keys.data(), keys.size(), "keys");
  std::vector<std::uint64_t> tickets;
  tickets.reserve(keys.size());
  for (const key& k : keys) {
    b.check_key(k);  // a landing insert's key passes: it is published below
    tickets.push_back(k.ticket);
  }
  std::sort(tickets.begin(), tickets.end());
  const auto twice = std::adjacent_find(tickets.begin(), tickets.end());
  GEAR_REQUIRE(
      twice == tickets.end(), errc::stale_key,
      "key (ticket " + std::to_string(twice == tickets.end() ? 0 : *twice) + ") is named twice");
  std::vector<ticket_run> runs;  // before anything is published
  for_each_ticket_run(tickets, [&](std::uint64_t first, std::int64_t count) {
    runs.push_back({first, count});
  });
  settle_landing(b, landing_force{landing_force::kind::keys, {}, keys}, stream);
  remove_runs(b, runs, stream);
}

/// erase_held_keys under b's mutex.
template <class Core>
void erase_keys(Core& b, std::span<const key> keys, cuda::stream_ref stream) {
  const auto held = b.lock();
  erase_held_keys(b, keys, stream);
}

}  // namespace gear::detail
