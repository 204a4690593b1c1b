// Stress, host storage: 8 threads insert, write, sample, update priorities and erase on one
// buffer with no lock of their own (tests/stress.hpp), with prioritized selection and with the
// consuming fifo and lifo; rank threads draw through a rank_sampler while actors insert; 6
// threads copy through the process's copy workers at once; a sharded erase beside inserts that
// evict, and a sharded sample beside calls made through shard(s). CI builds this suite with
// ThreadSanitizer; GEAR_STRESS_OPS sets the operations per thread (default 2500: 2 * 10^4 in all).

#include <gear/gear.hpp>
#include <gear/rank_sampler.hpp>
#include <gear/sharded_buffer.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "select_common.hpp"
#include "stress.hpp"

namespace {

struct no_streams {
  cuda::stream_ref get(int) const { return gear::detail::no_stream(); }
  void sync(int) const {}
};

template <class Batch>
struct host_view {
  std::span<const gear::key> keys;
  std::span<const std::uint8_t> mask;
  std::span<const std::int64_t> v;
};

/// A batch's keys, mask and column 0, where they already are (host memory).
constexpr auto host_fetch = [](auto& batch, cuda::stream_ref) {
  const std::int64_t n = batch.batch_size() * batch.window_length();
  return host_view<void>{{batch.keys_data(), static_cast<std::size_t>(batch.batch_size())},
                         {batch.mask_data(), static_cast<std::size_t>(n)},
                         {reinterpret_cast<const std::int64_t*>(batch.column_data(0)),
                          static_cast<std::size_t>(n * 3)}};
};

/// 8 threads of GEAR_STRESS_OPS operations each (tests/stress.hpp) on buf, checked.
template <class Buffer>
void stress(Buffer& buf, std::uint64_t seed, std::int64_t max_returns = 0) {
  const char* env = std::getenv("GEAR_STRESS_OPS");
  const std::int64_t ops = env != nullptr ? std::atoll(env) : 2500;
  no_streams streams;
  const auto r = gear_stress::run(buf, 8, ops, seed, streams, host_fetch, max_returns);
  gear_stress::check(r, 8, ops);
}

}  // namespace

TEST_CASE("stress: 8 threads on one host buffer, no lock of theirs: no torn or mislabeled row") {
  gear::replay_buffer<gear_stress::spec, gear::storage::host, gear::select::prioritized> buf{
      gear::capacity{256}, gear::max_length{gear_stress::max_len}};
  stress(buf, 42);
}

TEST_CASE("stress: 8 threads on one sharded host buffer (3 shards), no lock of theirs") {
  gear::sharded_buffer<gear_stress::spec, gear::storage::host, gear::select::prioritized> buf(
      {0, 0, 0}, gear::capacity{96}, gear::max_length{gear_stress::max_len}, {},
      gear::insert_route::round_robin);
  stress(buf, 43);
}

TEST_CASE(
    "stress: 4 rank threads through a rank_sampler while 2 actors insert: every step's rows "
    "disjoint, every row its key's trajectory") {
  using id_spec = gear::spec<gear::column<"id", std::int64_t>>;
  using shards = gear::sharded_buffer<id_spec, gear::storage::host, gear::select::uniform>;
  shards buf({0, 0}, gear::capacity{64}, gear::max_length{1},
             gear::select::uniform{.replacement = false}, gear::insert_route::round_robin);
  std::mutex ids_mutex;  // the test's own bookkeeping, not the buffer's
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::int64_t> ids;
  std::atomic<std::int64_t> next_id{0};
  auto insert = [&](int count) {
    std::vector<std::int64_t> values(static_cast<std::size_t>(count));
    for (auto& v : values) v = next_id++;
    const std::vector<std::int64_t> lengths(values.size(), 1);
    std::vector<gear::key> keys(values.size());
    buf.insert({lengths, {gear::input(values.data())}, gear::memory_kind::host}, keys);
    const std::lock_guard<std::mutex> held(ids_mutex);
    for (std::size_t i = 0; i < keys.size(); ++i) ids[{keys[i].shard, keys[i].ticket}] = values[i];
  };
  for (int i = 0; i < 20; ++i) insert(4);
  constexpr std::int64_t ranks = 4, rows = 4;
  const int steps = 300;
  gear::rank_sampler<shards> sampler(buf, gear::rank_count{ranks}, gear::batch_size{rows},
                                     gear::window{1}, gear::rng{77});
  // [step][rank][row]: the key and the id each rank read.
  std::vector<gear::key> seen_keys(std::size_t(steps * ranks * rows));
  std::vector<std::int64_t> seen_ids(seen_keys.size());
  std::vector<std::thread> pool;
  for (int a = 0; a < 2; ++a)
    pool.emplace_back([&] {
      for (int i = 0; i < steps; ++i) insert(2);
    });
  for (std::int64_t r = 0; r < ranks; ++r)
    pool.emplace_back([&, r] {
      auto b = sampler.make_batch();
      for (int t = 0; t < steps; ++t) {
        sampler.sample(r, b);
        for (std::int64_t i = 0; i < rows; ++i) {
          const auto at = std::size_t((t * ranks + r) * rows + i);
          seen_keys[at] = b.keys_data()[i];
          seen_ids[at] = b.column<"id">()(i, 0);
        }
      }
    });
  for (auto& th : pool) th.join();
  for (int t = 0; t < steps; ++t) {
    std::set<std::pair<std::uint32_t, std::uint64_t>> step;
    for (std::int64_t k = 0; k < ranks * rows; ++k) {
      const auto at = std::size_t(t * ranks * rows + k);
      const gear::key key = seen_keys[at];
      step.insert({key.shard, key.ticket});
      REQUIRE(ids.at({key.shard, key.ticket}) == seen_ids[at]);
    }
    REQUIRE(step.size() == std::size_t(ranks * rows));
  }
}

TEST_CASE("stress: 6 threads copying at once through the process's copy workers") {
  // Each part fills its own range with its thread's, copy's and part's mark; the caller then reads
  // every range: ThreadSanitizer sees each worker's writes ordered before the caller's reads.
  constexpr int threads = 6, copies = 40;
  constexpr unsigned parts = 5;
  constexpr std::size_t part_bytes = 4096;
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < threads; ++c)
    callers.emplace_back([&, c] {
      std::vector<unsigned char> out(parts * part_bytes);
      for (int k = 0; k < copies; ++k) {
        const auto mark = [&](unsigned t) {
          return static_cast<unsigned char>(c * 31 + k * 7 + t);
        };
        gear::detail::parallel_for(parts, [&](unsigned t) {
          std::memset(out.data() + t * part_bytes, mark(t), part_bytes);
        });
        for (unsigned t = 0; t < parts; ++t)
          for (std::size_t i = 0; i < part_bytes; ++i)
            if (out[t * part_bytes + i] != mark(t)) bad.fetch_add(1);
      }
    });
  for (auto& t : callers) t.join();
  CHECK(bad.load() == 0);
}

TEST_CASE_TEMPLATE(
    "stress: 8 threads on one host queue or stack, no lock of theirs: each trajectory returned "
    "once, each sample in order",
    Policy, gear::select::fifo, gear::select::lifo) {
  gear::replay_buffer<gear_stress::spec, gear::storage::host, Policy> buf{
      gear::capacity{256}, gear::max_length{gear_stress::max_len}};
  stress(buf, 44);
}

TEST_CASE(
    "stress: 8 threads on one host buffer with max_times_sampled 2 (uniform without replacement): "
    "no trajectory returned more than twice") {
  gear::replay_buffer<gear_stress::spec, gear::storage::host, gear::select::uniform> buf{
      gear::capacity{256}, gear::max_length{gear_stress::max_len},
      gear::select::uniform{.replacement = false}};
  stress(buf, 45, 2);
}

TEST_CASE(
    "stress: 8 threads on one host buffer with max_times_sampled 2 (uniform with replacement): no "
    "trajectory comes back in more than two samples") {
  gear::replay_buffer<gear_stress::spec, gear::storage::host, gear::select::uniform> buf{
      gear::capacity{256}, gear::max_length{gear_stress::max_len}};
  stress(buf, 46, 2);
}

TEST_CASE("stress: a sharded erase beside inserts that evict removes all of its keys or none") {
  // Two shards of 2 slots; one thread inserts without pause, so a key checked by the erase may be
  // evicted before its shard removes it. An erase that throws must have removed nothing: a key
  // its shard has not evicted since (tickets_issued within its ticket + capacity) is still there.
  using shards = gear::sharded_buffer<select_test::spec, gear::storage::host,
                                      gear::select::uniform>;
  constexpr std::int64_t capacity = 2;
  shards buf({0, 0}, gear::capacity{capacity}, gear::max_length{1}, {},
             gear::insert_route::round_robin);
  std::atomic<bool> stop{false};
  std::thread actor([&] {
    while (!stop.load()) (void)select_test::insert_ids(buf, 1, 1);
  });
  int attempts = 0, erased = 0, refused = 0, partial = 0;
  // Until 3000 erases removed both keys (each such call passed its check, the window in which an
  // eviction can come between a shard's removal and the next's), or 8 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  while (erased < 3000 && attempts < 400000 && std::chrono::steady_clock::now() < deadline) {
    gear::key mine[2];
    bool have[2] = {false, false};
    while (!(have[0] && have[1])) {
      const gear::key k = select_test::insert_ids(buf, 2, 1)[0];
      mine[k.shard] = k;
      have[k.shard] = true;
    }
    ++attempts;
    try {
      buf.erase(std::span<const gear::key>(mine, 2));
      ++erased;
      CHECK(!buf.contains(mine[0]));
      CHECK(!buf.contains(mine[1]));
    } catch (const gear::error& e) {
      REQUIRE(e.code() == gear::errc::stale_key);
      ++refused;
      for (std::uint32_t s = 0; s < 2; ++s) {  // gone, and then still not evicted
        const bool gone = !buf.contains(mine[s]);
        const std::uint64_t issued = buf.shard(s).tickets_issued();
        partial += gone && issued <= mine[s].ticket + std::uint64_t(capacity);
      }
    }
  }
  stop.store(true);
  actor.join();
  MESSAGE(attempts << " erases: " << erased << " removed both keys, " << refused
                   << " refused (a key evicted first), " << partial << " removed a key and threw");
  CHECK(partial == 0);
  CHECK(erased + refused == attempts);
}

TEST_CASE("stress: a sharded prioritized sample beside inserts and updates through shard(s)") {
  // Calls through shard(s) change that shard's host tree under the shard's own mutex; the sharded
  // sample's snapshot reads the root's atomic copy (ThreadSanitizer saw a race on the tree), and
  // every row holds the trajectory its key names.
  using shards = gear::sharded_buffer<select_test::spec, gear::storage::host,
                                      gear::select::prioritized>;
  shards buf({0, 0}, gear::capacity{32}, gear::max_length{1}, {},
             gear::insert_route::round_robin);
  std::mutex ids_mutex;
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::int32_t> id_of;
  auto record = [&](const std::vector<gear::key>& keys, std::int32_t first) {
    const std::lock_guard<std::mutex> held(ids_mutex);
    for (std::size_t i = 0; i < keys.size(); ++i)
      id_of[{keys[i].shard, keys[i].ticket}] = first + std::int32_t(i);
  };
  record(select_test::insert_ids(buf, 0, 16), 0);
  std::atomic<bool> stop{false};
  std::thread direct([&] {
    for (std::int32_t n = 0; n < 4000 && !stop.load(); ++n) {
      auto& shard = buf.shard(std::size_t(n % 2));
      const std::vector<gear::key> k = select_test::insert_ids(shard, 100 + n, 1);
      record(k, 100 + n);
      const float p = float(n % 7);
      (void)shard.update_priorities(std::span<const gear::key>(k), std::span<const float>(&p, 1));
    }
  });
  auto out = buf.make_batch(gear::batch_size{8}, gear::window_length{1});
  gear::rng g{5};
  std::vector<std::pair<std::pair<std::uint32_t, std::uint64_t>, std::int32_t>> seen;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (int i = 0; i < 3000 && std::chrono::steady_clock::now() < deadline; ++i) {
    try {
      buf.sample(out, gear::window{.length = 1}, g);
    } catch (const gear::error& e) {  // a shard emptied of mass since the snapshot
      REQUIRE(e.code() == gear::errc::empty_buffer);
      continue;
    }
    for (std::int64_t r = 0; r < 8; ++r)
      seen.push_back({{out.keys_data()[r].shard, out.keys_data()[r].ticket},
                      out.column<"id">()(r, 0)});
  }
  stop.store(true);
  direct.join();
  int wrong = 0;
  for (const auto& [k, id] : seen) {
    const auto it = id_of.find(k);
    wrong += it == id_of.end() || it->second != id;
  }
  MESSAGE(seen.size() << " rows sampled beside the shard's own calls");
  CHECK(!seen.empty());
  CHECK(wrong == 0);
}
