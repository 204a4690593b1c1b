#pragma once
// gear::buffer_stats: what replay_buffer::stats() reports, for logs and dashboards: sizes, the
// slot memory by kind, and counts since the buffer was built, as of the calls that returned
// (host state: no GPU work is waited for). Counting costs a few additions a call. A call
// captured into a CUDA graph counts once, at its capture, not at each replay; an update from
// device memory counts when it is queued (its pairs are checked on the GPU, and a failure found
// there does not take the count back).

#include <array>
#include <cstddef>
#include <cstdint>

namespace gear {

struct buffer_stats {
  std::int64_t capacity = 0;         ///< slots
  std::int64_t size = 0;             ///< stored trajectories, as size() counts them
  std::int64_t pending = 0;          ///< slots reserved and not yet committed (writers, reserve)
  std::uint64_t tickets_issued = 0;  ///< reservations made so far
  /// Bytes of slot memory in each memory_kind (indexed by it: host, pinned_host, device).
  std::array<std::size_t, 3> slot_bytes{};

  // ---- counts since the buffer was built -----------------------------------------------------
  std::uint64_t committed = 0;  ///< trajectories made visible (inserts, commits, writers)
  /// Committed trajectories overwritten by newer reservations. (A host insert still landing,
  /// overwritten before a call published it, is counted in size meanwhile and then nowhere.)
  std::uint64_t evicted = 0;
  /// Committed trajectories removed: by erase, by set_max_times_sampled, consumed by fifo / lifo.
  std::uint64_t removed = 0;
  std::uint64_t samples = 0;       ///< sample calls that returned
  std::uint64_t rows_sampled = 0;  ///< rows those samples returned
  /// Priority update calls that returned (from host spans and from device memory).
  std::uint64_t priority_updates = 0;
  /// Pairs of the updates from host spans: applied, and skipped as stale. (Updates from device
  /// memory count their stale pairs on the GPU: select::prioritized's state, stale_pairs().)
  std::uint64_t priorities_applied = 0, priorities_stale = 0;
};

}  // namespace gear
