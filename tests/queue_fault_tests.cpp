// fifo and lifo when a sample fails half-way. A sample chooses its rows first (the queue's cursor
// and the stack's skip links are prepared then), and the buffer tells the policy that they were
// consumed (gear::consumed_hook) only once their removal has changed the ring. This suite fails
// the k-th heap allocation of a sample (operator new is replaced in this binary alone), before or
// after the rows were chosen, among random inserts, erases and writers on host storage, and checks
// every later sample against a model: a failed sample removes nothing, a later one returns the
// oldest (fifo) or newest (lifo) live trajectories in order.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <set>

#include "select_common.hpp"

// Replaced operator new/delete pairs are matched by construction; GCC cannot see that through
// what a new-expression returned once inlined and warns.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
thread_local long allocations_left = -1;  // > 0: the allocation that brings it to 0 throws
long failures_injected = 0;
}  // namespace

void* operator new(std::size_t bytes) {
  if (allocations_left > 0 && --allocations_left == 0) {
    allocations_left = -1;
    ++failures_injected;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using select_test::spec;

bool rows_chosen = false;  // set by the tracked policy's select

/// fifo or lifo, saying when its rows have been chosen (so a failure can be told before or after),
/// then allocating once more, as a policy's select may. The buffer itself allocates nothing once
/// the rows are chosen (their removal is planned from the policy's runs of tickets), so this is
/// where a failure after the choice comes from: the rows are chosen, on_consumed is prepared,
/// and neither the removal nor on_consumed follows.
template <class Policy>
struct tracked {
  static constexpr bool consumes = true;
  static constexpr bool reads_dense = false;
  template <class Space>
  struct state : Policy::template state<Space> {
    state(const tracked&, std::int64_t capacity)
        : Policy::template state<Space>(Policy{}, capacity) {}
    void select(const gear::slot_table& t, const gear::selection_request& r,
                cuda::stream_ref stream) {
      Policy::template state<Space>::select(t, r, stream);
      rows_chosen = true;
      ::operator delete(::operator new(1));  // may be the failing allocation (a call, not elided)
    }
  };
};

struct fault_counts {
  long before_choice = 0, after_choice = 0;
};

template <class Policy>
void run_model(std::uint64_t seed, std::int64_t capacity, fault_counts& counts) {
  constexpr bool oldest_first = std::is_same_v<Policy, gear::select::fifo>;
  using buffer = gear::replay_buffer<spec, gear::storage::host, tracked<Policy>>;
  static_assert(gear::consumed_hook<typename tracked<Policy>::template state<gear::exec::host>>);
  buffer buf{gear::capacity{capacity}, gear::max_length{1}};
  select_test::queue_world<buffer> world{buf, {}, {}};
  std::mt19937_64 gen(seed);
  gear::rng g{seed};
  for (int step = 0; step < 400; ++step) {
    if (gen() % 7 < 5) {
      world.change(gen);
    } else {
      const auto rows = static_cast<std::int64_t>(1 + gen() % 6);
      if (static_cast<std::int64_t>(world.live.size()) < rows) continue;
      auto batch = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
      if (gen() % 3 == 0) allocations_left = 1 + static_cast<long>(gen() % 6);
      rows_chosen = false;
      bool failed = false;
      try {
        buf.sample(batch, gear::window{.length = 1}, g);
      } catch (const std::bad_alloc&) {
        failed = true;
      } catch (const gear::error& e) {
        CHECK(e.code() == gear::errc::out_of_memory);
        failed = true;
      }
      allocations_left = -1;
      if (failed) {
        (rows_chosen ? counts.after_choice : counts.before_choice) += 1;
      } else {
        for (std::int64_t r = 0; r < rows; ++r) {
          REQUIRE(batch.keys()[static_cast<std::size_t>(r)].ticket == world.next(oldest_first));
          world.live.erase(world.next(oldest_first));
        }
      }
    }
    // A failed sample removed nothing: the model stays as it was.
    REQUIRE(buf.size() == static_cast<std::int64_t>(world.live.size()));
  }
}

}  // namespace

TEST_CASE_TEMPLATE(
    "fifo and lifo: a sample that fails before or after choosing its rows leaves "
    "the next samples right",
    Policy, gear::select::fifo, gear::select::lifo) {
  fault_counts counts;
  const long injected = failures_injected;
  for (std::uint64_t seed = 1; seed <= 150; ++seed)
    for (const std::int64_t capacity : {1, 3, 7, 16, 64}) run_model<Policy>(seed, capacity, counts);
  // Both kinds of failure happened, many times each (a test of the failure paths, not a formality).
  CHECK(failures_injected - injected > 100);
  CHECK(counts.before_choice > 20);
  CHECK(counts.after_choice > 20);
  MESSAGE("allocation failures: " << counts.before_choice << " before the rows were chosen, "
                                  << counts.after_choice << " after");
}
