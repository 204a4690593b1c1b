#pragma once
// gear::call_limits: the most that one call of a buffer will ask for, declared up front.
//
// A GPU buffer hands host data to the GPU through staging: pinned memory (and device memory for
// an insert's rows table, and for its data where every column is in device memory: an insert
// that lands uploads it there) leased to each call and reused once the stream work that reads it
// has finished. Staging grows on demand, so the first calls of a run, and any call larger than all
// before it, allocate (cudaHostAlloc takes milliseconds: 1.4 ms at 4 MiB, 25 ms at 64 MiB).
// replay_buffer::reserve_staging(call_limits) allocates it all at once instead:
//
//   buf.reserve_staging({.insert_trajectories = 16, .insert_steps = 16 * 1000, .batch = 256});
//
// after which calls within the limits allocate no pinned or device memory, as long as no more
// than `in_flight` inserts, `in_flight` other calls and `writers` writers have GPU work queued or
// staging held at once. A call over the limits is not refused: its staging grows as before. A
// landing insert (a host insert into storage::device used from several streams) holds its
// staging until a later call publishes it: count those among the inserts in flight.

#include <cstdint>

namespace gear {

struct call_limits {
  /// Trajectories in one insert_async (and slots of one reserve / commit).
  std::int64_t insert_trajectories = 1;
  /// Steps in one insert_async, summed over its trajectories.
  std::int64_t insert_steps = 1;
  /// Rows of one sample_async, pairs of one host-span priority update, keys of one erase.
  std::int64_t batch = 1;
  /// Calls of each kind (inserts; everything else) whose GPU work may be queued at once.
  std::int64_t in_flight = 8;
  /// Writers (make_writer) open at once: each holds a chunk of staging from its first append to
  /// its commit.
  std::int64_t writers = 0;
};

}  // namespace gear
