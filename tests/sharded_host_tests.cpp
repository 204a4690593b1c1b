// sharded_buffer over storage::host shards: routing of inserts, updates and erases by the shard a
// key names; the union's laws (chi-square at significance 0.001, fixed printed seeds, each with a
// power check: the same test rejects a planted wrong distribution on the same counts); global
// probabilities and weights; bad input that changes nothing.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <gear/rank_sampler.hpp>
#include <gear/sharded_buffer.hpp>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "select_common.hpp"

using namespace select_test;
using uniform_shards = gear::sharded_buffer<spec, gear::storage::host, gear::select::uniform>;
using per_shards = gear::sharded_buffer<spec, gear::storage::host, gear::select::prioritized>;

namespace {

/// Inserts ids [first, first + count) into shard `s` (round robin: the call's turn) and records
/// each key's id.
template <class Buffer>
std::vector<gear::key> insert_into(Buffer& buf, std::int32_t first, std::int64_t count,
                                   std::map<std::pair<std::uint32_t, std::uint64_t>, int>& ids) {
  const auto keys = insert_ids(buf, first, count);
  for (std::int64_t i = 0; i < count; ++i)
    ids[{keys[std::size_t(i)].shard, keys[std::size_t(i)].ticket}] = first + int(i);
  return keys;
}

}  // namespace

TEST_CASE("sharded: 1 to 64 shards; inserts go round robin and keys name their shard") {
  CHECK(gear_test::code_of([] {
          uniform_shards b(std::vector<int>{}, gear::capacity{4}, gear::max_length{1});
        }) == gear::errc::invalid_argument);
  CHECK(gear_test::code_of([] {
          uniform_shards b(std::vector<int>(65, 0), gear::capacity{4}, gear::max_length{1});
        }) == gear::errc::invalid_argument);
  uniform_shards buf({0, 0, 0}, gear::capacity{100}, gear::max_length{1}, {},
                     gear::insert_route::round_robin);
  REQUIRE(buf.shard_count() == 3);
  for (int call = 0; call < 9; ++call) {
    const auto keys = insert_ids(buf, call * 10, 10);
    for (const auto& k : keys) CHECK(k.shard == std::uint32_t(call % 3));
    for (const auto& k : keys) CHECK(buf.contains(k));
  }
  for (std::size_t s = 0; s < 3; ++s) CHECK(buf.shard(s).size() == 30);
  CHECK(buf.size() == 90);
}

TEST_CASE("sharded: every shard's slots come from the memory resource, given back once") {
  struct counting {  // a resource of one's own: blocks handed out and taken back
    std::multiset<void*> out;
    int taken = 0;
    void* allocate(std::size_t bytes, std::size_t alignment) {
      void* p = ::operator new(bytes, std::align_val_t{alignment});
      out.insert(p);
      return p;
    }
    void deallocate(void* p, std::size_t, std::size_t alignment) {
      CHECK(out.count(p) == 1);
      out.erase(p);
      ++taken;
      ::operator delete(p, std::align_val_t{alignment});
    }
  } resource;
  {
    uniform_shards buf({0, 0, 0}, gear::capacity{8}, gear::max_length{2}, {},
                       gear::insert_route::round_robin, {.host = resource});
    CHECK(resource.out.size() == 3);  // one region per shard
    for (std::size_t s = 0; s < 3; ++s) {
      const auto* step = buf.shard(s).ref(gear::op::write_steps{}).step<0>(0, 0);
      bool inside = false;  // the step lies in one of the blocks
      for (void* p : resource.out)
        inside = inside || (static_cast<const void*>(step) >= p &&
                            reinterpret_cast<const std::byte*>(step) <
                                static_cast<std::byte*>(p) + 8 * 2 * 24);
      CHECK(inside);
    }
  }
  CHECK(resource.out.empty());
  CHECK(resource.taken == 3);
}

TEST_CASE("sharded uniform: rows follow 1/N over the union (chi-square, 0.001); power check") {
  const std::uint64_t seed = 20261204;
  MESSAGE("sharded uniform chi-square seed " << seed);
  uniform_shards buf({0, 0, 0}, gear::capacity{200}, gear::max_length{1}, {},
                     gear::insert_route::round_robin);
  std::map<std::pair<std::uint32_t, std::uint64_t>, int> ids;
  insert_into(buf, 0, 10, ids);   // shard 0: 10
  insert_into(buf, 10, 30, ids);  // shard 1: 30
  insert_into(buf, 40, 60, ids);  // shard 2: 60
  const double n = 100;
  gear::rng g{seed};
  auto b = buf.make_batch(gear::batch_size{64}, gear::window_length{1});
  std::vector<double> counts(100, 0);
  double worst_p = 0;
  const int calls = 3000;
  for (int c = 0; c < calls; ++c) {
    buf.sample(b, gear::window{1}, g);
    for (std::int64_t r = 0; r < 64; ++r) {
      const gear::key k = b.keys_data()[r];
      const int id = ids.at({k.shard, k.ticket});
      REQUIRE(b.column<"id">()(r, 0) == id);  // the row's bytes are its key's trajectory
      counts[std::size_t(id)] += 1;
      worst_p = std::max(worst_p, std::abs(b.probabilities_data()[r] - 1 / n) * n);
      REQUIRE(b.weights_data()[r] == 1.0f);
    }
  }
  CHECK(worst_p < 1e-5);
  const double draws = 64.0 * calls;
  const auto fair = chi2_test(counts, std::vector<double>(100, 1 / n), draws);
  MESSAGE("uniform over the union: chi2 " << fair.statistic << " critical " << fair.critical);
  CHECK_FALSE(fair.rejects());
  // Power: shards drawn in equal thirds (what splitting by shard count would give) is rejected.
  std::vector<double> thirds(100);
  for (int i = 0; i < 100; ++i)
    thirds[std::size_t(i)] = i < 10 ? 1 / 30.0 : i < 40 ? 1 / 90.0 : 1 / 180.0;
  CHECK(chi2_test(counts, thirds, draws).rejects());
}

TEST_CASE("sharded uniform without replacement: distinct rows over the union; too many refused") {
  uniform_shards buf({0, 0}, gear::capacity{50}, gear::max_length{1},
                     gear::select::uniform{.replacement = false}, gear::insert_route::round_robin);
  std::map<std::pair<std::uint32_t, std::uint64_t>, int> ids;
  insert_into(buf, 0, 7, ids);
  insert_into(buf, 7, 5, ids);
  gear::rng g{3};
  auto b = buf.make_batch(gear::batch_size{12}, gear::window_length{1});
  for (int c = 0; c < 50; ++c) {
    buf.sample(b, gear::window{1}, g);
    std::set<int> seen;
    for (std::int64_t r = 0; r < 12; ++r) seen.insert(b.column<"id">()(r, 0));
    REQUIRE(seen.size() == 12);
  }
  auto big = buf.make_batch(gear::batch_size{13}, gear::window_length{1});
  const auto calls_before = g.calls();
  CHECK(gear_test::code_of([&] { buf.sample(big, gear::window{1}, g); }) ==
        gear::errc::not_enough_items);
  CHECK(g.calls() == calls_before);
  auto taken = std::move(b);  // a batch moved from holds no memory: refused, nothing drawn
  CHECK(gear_test::code_of([&] { buf.sample(b, gear::window{1}, g); }) ==
        gear::errc::batch_mismatch);
  CHECK(g.calls() == calls_before);
  CHECK(buf.size() == 12);
}

TEST_CASE(
    "sharded prioritized: p^alpha / M over the union, global probabilities and weights; "
    "updates land on the shard a key names; bad input changes nothing") {
  const std::uint64_t seed = 777;
  MESSAGE("sharded prioritized chi-square seed " << seed);
  const double alpha = 0.7, beta = 0.5;
  per_shards buf({0, 0, 0, 0}, gear::capacity{100}, gear::max_length{1},
                 gear::select::prioritized{alpha, beta}, gear::insert_route::round_robin);
  std::map<std::pair<std::uint32_t, std::uint64_t>, int> ids;
  std::vector<gear::key> all;
  for (int s = 0; s < 4; ++s) {
    const auto k = insert_into(buf, s * 50, 50, ids);
    all.insert(all.end(), k.begin(), k.end());
  }
  std::mt19937_64 gen(seed);
  std::vector<float> p(all.size());
  for (auto& x : p) x = float(0.05 + double(gen() % 1000) / 50.0);
  // Shuffled, so that one call updates every shard.
  std::vector<std::size_t> order(all.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen);
  std::vector<gear::key> ks;
  std::vector<float> ps;
  for (const auto i : order) {
    ks.push_back(all[i]);
    ps.push_back(p[i]);
  }
  const auto r = buf.update_priorities(ks, ps);
  CHECK(r.applied == 200);
  CHECK(r.stale == 0);
  for (std::size_t i = 0; i < all.size(); ++i)
    REQUIRE(buf.shard(all[i].shard)
                .selection_state()
                .priority(all[i].slot(buf.shard(all[i].shard).capacity())) == p[i]);

  // Bad input: a key of a shard the buffer does not have, a NaN; nothing changes.
  const auto before = [&] {
    std::vector<double> roots;
    for (std::size_t s = 0; s < 4; ++s) roots.push_back(buf.shard(s).selection_state().total());
    return roots;
  };
  const auto roots = before();
  gear::key foreign = all[0];
  foreign.shard = 9;
  CHECK(gear_test::code_of([&] {
          (void)buf.update_priorities(std::vector<gear::key>{all[1], foreign},
                                      std::vector<float>{3.0f, 3.0f});
        }) == gear::errc::key_out_of_range);
  CHECK(gear_test::code_of([&] {
          (void)buf.update_priorities(std::vector<gear::key>{all[1], all[60]},
                                      std::vector<float>{3.0f, std::nanf("")});
        }) == gear::errc::invalid_priority);
  CHECK(before() == roots);
  {  // a key of another incarnation of the last shard, after a good key of the first
    const auto first = std::find_if(all.begin(), all.end(), [](auto& k) { return k.shard == 0; });
    auto other = *std::find_if(all.begin(), all.end(), [](auto& k) { return k.shard == 3; });
    other.incarnation += 7;
    CHECK(gear_test::code_of([&] {
            (void)buf.update_priorities(std::vector<gear::key>{*first, other},
                                        std::vector<float>{5.0f, 5.0f});
          }) == gear::errc::key_out_of_range);
    CHECK(before() == roots);
    CHECK(gear_test::code_of([&] {
            buf.erase(std::vector<gear::key>{*first, other});
          }) == gear::errc::key_out_of_range);
    CHECK(buf.size() == 200);
  }
  {  // p^alpha out of the tree's range: refused before any shard is asked
    per_shards steep({0, 0}, gear::capacity{4}, gear::max_length{1},
                     gear::select::prioritized{10.0, 0.5}, gear::insert_route::round_robin);
    const auto a = insert_ids(steep, 0, 2), b = insert_ids(steep, 2, 2);
    const double r0 = steep.shard(0).selection_state().total();
    const double r1 = steep.shard(1).selection_state().total();
    CHECK(gear_test::code_of([&] {
            (void)steep.update_priorities(std::vector<gear::key>{a[0], b[0]},
                                          std::vector<float>{2.0f, 3e38f});
          }) == gear::errc::invalid_priority);
    CHECK(steep.shard(0).selection_state().total() == r0);
    CHECK(steep.shard(1).selection_state().total() == r1);
  }
  CHECK(gear_test::code_of([&] {
          buf.erase(std::vector<gear::key>{all[1], foreign});
        }) == gear::errc::key_out_of_range);
  CHECK(gear_test::code_of([&] {
          buf.erase(std::vector<gear::key>{all[1], all[1]});
        }) == gear::errc::stale_key);
  CHECK(buf.size() == 200);
  CHECK(before() == roots);

  // The union's law: P(id) = p^alpha / sum p^alpha.
  std::vector<double> want(200);
  double m = 0;
  for (std::size_t i = 0; i < all.size(); ++i) m += std::pow(double(p[i]), alpha);
  for (std::size_t i = 0; i < all.size(); ++i)
    want[std::size_t(ids.at({all[i].shard, all[i].ticket}))] = std::pow(double(p[i]), alpha) / m;
  gear::rng g{seed};
  auto b = buf.make_batch(gear::batch_size{128}, gear::window_length{1});
  std::vector<double> counts(200, 0);
  double worst_p = 0, worst_w = 0;
  const int calls = 2000;
  for (int c = 0; c < calls; ++c) {
    buf.sample(b, gear::window{1}, g);
    double pmin = 1;
    for (std::int64_t r = 0; r < 128; ++r)
      pmin = std::min(pmin, want[std::size_t(b.column<"id">()(r, 0))]);
    for (std::int64_t r = 0; r < 128; ++r) {
      const gear::key k = b.keys_data()[r];
      const int id = ids.at({k.shard, k.ticket});
      REQUIRE(b.column<"id">()(r, 0) == id);
      counts[std::size_t(id)] += 1;
      const double w = want[std::size_t(id)];
      worst_p = std::max(worst_p, std::abs(b.probabilities_data()[r] - w) / w);
      worst_w = std::max(worst_w, std::abs(b.weights_data()[r] - std::pow(pmin / w, beta)));
    }
  }
  CHECK(worst_p < 1e-5);
  CHECK(worst_w < 1e-5);
  const double draws = 128.0 * calls;
  const auto fair = chi2_test(counts, want, draws);
  MESSAGE("prioritized over the union: chi2 " << fair.statistic << " critical " << fair.critical);
  CHECK_FALSE(fair.rejects());
  // Power: the law with alpha 0.6 instead of 0.7 is rejected on the same counts.
  std::vector<double> planted(200);
  double m6 = 0;
  for (std::size_t i = 0; i < all.size(); ++i) m6 += std::pow(double(p[i]), 0.6);
  for (std::size_t i = 0; i < all.size(); ++i)
    planted[std::size_t(ids.at({all[i].shard, all[i].ticket}))] = std::pow(double(p[i]), 0.6) / m6;
  CHECK(chi2_test(counts, planted, draws).rejects());

  // Erase routes too: the shard that held each key no longer does, the others are untouched.
  buf.erase(std::vector<gear::key>{all[0], all[120]});
  CHECK_FALSE(buf.contains(all[0]));
  CHECK_FALSE(buf.contains(all[120]));
  CHECK(buf.size() == 198);
  CHECK(buf.shard(all[0].shard).size() == 49);
  CHECK(buf.shard(all[120].shard).size() == 49);
}

// ---- rank_sampler: data-parallel ranks with disjoint rows ------------------------------------

namespace {

/// A buffer of 3 shards holding ids 0..99 (10, 30 and 60 of them), uniform without replacement.
struct ranked_union {
  uniform_shards buf{{0, 0, 0},
                     gear::capacity{100},
                     gear::max_length{1},
                     gear::select::uniform{.replacement = false},
                     gear::insert_route::round_robin};
  std::map<std::pair<std::uint32_t, std::uint64_t>, int> ids;
  ranked_union() {
    insert_into(buf, 0, 10, ids);
    insert_into(buf, 10, 30, ids);
    insert_into(buf, 40, 60, ids);
  }
  /// The ids of a batch's rows, each checked against its key.
  std::vector<int> rows_of(const uniform_shards::batch_type& b) const {
    std::vector<int> out;
    for (std::int64_t r = 0; r < b.batch_size(); ++r) {
      const gear::key k = b.keys_data()[r];
      const int id = ids.at({k.shard, k.ticket});
      REQUIRE(b.column<"id">()(r, 0) == id);
      out.push_back(id);
    }
    return out;
  }
};
using ranks4 = gear::rank_sampler<uniform_shards>;

}  // namespace

TEST_CASE(
    "rank_sampler: the ranks of a step hold disjoint rows; each rank's rows are uniform over the "
    "union (chi-square, 0.001); power: unshuffled slices of the joint draw are rejected") {
  const std::uint64_t seed = 4242;
  MESSAGE("rank_sampler chi-square seed " << seed);
  ranked_union u;
  constexpr std::int64_t ranks = 4, rows = 8;
  ranks4 sampler(u.buf, gear::rank_count{ranks}, gear::batch_size{rows}, gear::window{1},
                 gear::rng{seed});
  std::vector<uniform_shards::batch_type> out;
  for (int r = 0; r < ranks; ++r) out.push_back(sampler.make_batch());
  std::vector<double> counts(100, 0);
  const int steps = 4000;
  for (int t = 0; t < steps; ++t) {
    std::set<int> step_ids;
    for (std::int64_t r = 0; r < ranks; ++r) {
      sampler.sample(r, out[std::size_t(r)]);
      for (const int id : u.rows_of(out[std::size_t(r)])) {
        step_ids.insert(id);
        if (r == 2) counts[std::size_t(id)] += 1;
      }
      REQUIRE(out[std::size_t(r)].probabilities_data()[0] > 0);
    }
    REQUIRE(step_ids.size() == std::size_t(ranks * rows));  // no id in two ranks (or twice)
  }
  for (std::int64_t r = 0; r < ranks; ++r) CHECK(sampler.next_step(r) == std::uint64_t(steps));
  const double draws = double(rows) * steps;
  const auto fair = chi2_test(counts, std::vector<double>(100, 0.01), draws);
  MESSAGE("rank 2 over the union: chi2 " << fair.statistic << " critical " << fair.critical);
  CHECK_FALSE(fair.rejects());
  // Power: rank 2 taking positions [16, 24) of the joint draw as it comes (rows grouped by
  // shard, not shuffled) sees shard 2's ids far more often; the same test rejects it.
  std::vector<double> planted(100, 0);
  auto joint = u.buf.make_batch(gear::batch_size{ranks * rows}, gear::window_length{1});
  gear::rng g{seed};
  for (int t = 0; t < steps; ++t) {
    u.buf.sample(joint, gear::window{1}, g);
    const auto ids = u.rows_of(joint);
    for (std::int64_t i = 2 * rows; i < 3 * rows; ++i)
      planted[std::size_t(ids[std::size_t(i)])] += 1;
  }
  CHECK(chi2_test(planted, std::vector<double>(100, 0.01), draws).rejects());
}

TEST_CASE(
    "rank_sampler: 4 rank threads at once, each step disjoint; the same seed, the same rows") {
  ranked_union u;
  constexpr std::int64_t ranks = 4, rows = 5;
  const int steps = 400;
  // [step][rank][row] ids, written by the rank threads.
  std::vector<int> seen(std::size_t(steps * ranks * rows), -1);
  {
    ranks4 sampler(u.buf, gear::rank_count{ranks}, gear::batch_size{rows}, gear::window{1},
                   gear::rng{9});
    std::vector<std::thread> pool;
    for (std::int64_t r = 0; r < ranks; ++r)
      pool.emplace_back([&, r] {
        auto b = sampler.make_batch();
        for (int t = 0; t < steps; ++t) {
          sampler.sample(r, b);
          for (std::int64_t i = 0; i < rows; ++i)
            seen[std::size_t((t * ranks + r) * rows + i)] = b.column<"id">()(i, 0);
        }
      });
    for (auto& th : pool) th.join();
  }
  for (int t = 0; t < steps; ++t) {
    const std::set<int> step_ids(seen.begin() + (t * ranks) * rows,
                                 seen.begin() + (t + 1) * ranks * rows);
    REQUIRE(step_ids.size() == std::size_t(ranks * rows));
    REQUIRE(*step_ids.begin() >= 0);
  }
  // One thread, ranks in turn, the same seed: the same rows (the draw is the seed's, whichever
  // rank makes it).
  ranks4 again(u.buf, gear::rank_count{ranks}, gear::batch_size{rows}, gear::window{1},
               gear::rng{9});
  auto b = again.make_batch();
  for (int t = 0; t < steps; ++t)
    for (std::int64_t r = ranks - 1; r >= 0; --r) {
      again.sample(r, b);
      for (std::int64_t i = 0; i < rows; ++i)
        REQUIRE(b.column<"id">()(i, 0) == seen[std::size_t((t * ranks + r) * rows + i)]);
    }
}

TEST_CASE(
    "rank_sampler: bad input and failed draws change nothing; a rank too far ahead times out") {
  ranked_union u;
  using opts = gear::rank_sampler_options;
  CHECK(gear_test::code_of([&] {
          ranks4 s(u.buf, gear::rank_count{0}, gear::batch_size{4}, gear::window{1}, gear::rng{1});
        }) == gear::errc::invalid_argument);
  CHECK(gear_test::code_of([&] {
          ranks4 s(u.buf, gear::rank_count{2}, gear::batch_size{0}, gear::window{1}, gear::rng{1});
        }) == gear::errc::invalid_argument);
  CHECK(gear_test::code_of([&] {
          ranks4 s(u.buf, gear::rank_count{2}, gear::batch_size{4}, gear::window{1}, gear::rng{1},
                   opts{.rounds_ahead = 0});
        }) == gear::errc::invalid_argument);
  CHECK(gear_test::code_of([&] {
          ranks4 s(u.buf, gear::rank_count{2}, gear::batch_size{4}, gear::window{0}, gear::rng{1});
        }) == gear::errc::empty_window);
  CHECK(gear_test::code_of([&] {
          ranks4 s(u.buf, gear::rank_count{2}, gear::batch_size{4}, gear::window{1}, gear::rng{1},
                   opts{.rounds_ahead = std::int64_t{1} << 50});
        }) == gear::errc::invalid_argument);

  ranks4 sampler(u.buf, gear::rank_count{2}, gear::batch_size{4}, gear::window{1}, gear::rng{5},
                 opts{.rounds_ahead = 1, .wait = std::chrono::milliseconds{50}});
  auto b = sampler.make_batch();
  auto steps = [&] { return std::pair{sampler.next_step(0), sampler.next_step(1)}; };
  CHECK(gear_test::code_of([&] { sampler.sample(2, b); }) == gear::errc::invalid_argument);
  CHECK(gear_test::code_of([&] { sampler.sample(-1, b); }) == gear::errc::invalid_argument);
  auto wide = u.buf.make_batch(gear::batch_size{5}, gear::window_length{1});
  CHECK(gear_test::code_of([&] { sampler.sample(0, wide); }) == gear::errc::batch_mismatch);
  auto longer = u.buf.make_batch(gear::batch_size{4}, gear::window_length{2});
  CHECK(gear_test::code_of([&] { sampler.sample(0, longer); }) == gear::errc::batch_mismatch);
  auto moved = sampler.make_batch();
  auto taken = std::move(moved);
  CHECK(gear_test::code_of([&] { sampler.sample(0, moved); }) == gear::errc::batch_mismatch);
  CHECK(steps() == std::pair<std::uint64_t, std::uint64_t>{0, 0});

  // Rank 0 takes step 0; its step 1 needs the one staging, which rank 1 has not taken yet.
  sampler.sample(0, b);
  const auto step0 = u.rows_of(b);
  std::string message;
  try {
    sampler.sample(0, b);
  } catch (const gear::error& e) {
    message = e.what();
    CHECK(e.code() == gear::errc::timeout);
  }
  MESSAGE(message);
  CHECK(message.find("rank 1 has not taken step 0") != std::string::npos);
  CHECK(steps() == std::pair<std::uint64_t, std::uint64_t>{1, 0});
  CHECK(u.rows_of(b) == step0);  // the timed-out call wrote nothing
  sampler.sample(1, b);          // rank 1's step 0: disjoint from rank 0's
  for (const int id : u.rows_of(b)) CHECK(std::find(step0.begin(), step0.end(), id) == step0.end());
  sampler.sample(0, b);
  CHECK(steps() == std::pair<std::uint64_t, std::uint64_t>{2, 1});

  // A joint draw that fails (8 distinct rows from a union of 5) takes no step; after inserts the
  // same step is drawn.
  uniform_shards tiny({0, 0}, gear::capacity{10}, gear::max_length{1},
                      gear::select::uniform{.replacement = false}, gear::insert_route::round_robin);
  insert_ids(tiny, 0, 5);
  gear::rank_sampler<uniform_shards> two(tiny, gear::rank_count{2}, gear::batch_size{4},
                                         gear::window{1}, gear::rng{3});
  auto c = two.make_batch();
  CHECK(gear_test::code_of([&] { two.sample(1, c); }) == gear::errc::not_enough_items);
  CHECK(two.next_step(1) == 0);
  CHECK(tiny.size() == 5);
  insert_ids(tiny, 5, 5);
  two.sample(1, c);
  CHECK(two.next_step(1) == 1);
  // The failed draw left the sampler's rng alone: a fresh sampler of the seed draws the same.
  gear::rank_sampler<uniform_shards> fresh(tiny, gear::rank_count{2}, gear::batch_size{4},
                                           gear::window{1}, gear::rng{3});
  auto d = fresh.make_batch();
  fresh.sample(1, d);
  for (std::int64_t i = 0; i < 4; ++i) CHECK(d.keys_data()[i] == c.keys_data()[i]);
  two.sample(0, c);
  CHECK(two.next_step(0) == 1);
}

TEST_CASE(
    "rank_sampler over prioritized shards: each step's weights are normalised over its joint "
    "draw (the largest of all ranks' is 1); probabilities are the union's") {
  per_shards buf({0, 0}, gear::capacity{100}, gear::max_length{1},
                 gear::select::prioritized{0.6, 0.4}, gear::insert_route::round_robin);
  std::vector<gear::key> all = insert_ids(buf, 0, 50);
  const auto more = insert_ids(buf, 50, 50);
  all.insert(all.end(), more.begin(), more.end());
  const auto p = random_priorities(31, all.size(), false);
  buf.update_priorities(all, p);
  std::vector<double> want(100);
  double m = 0;
  for (std::size_t i = 0; i < 100; ++i) m += std::pow(double(p[i]), 0.6);
  for (std::size_t i = 0; i < 100; ++i) want[i] = std::pow(double(p[i]), 0.6) / m;
  gear::rank_sampler<per_shards> sampler(buf, gear::rank_count{3}, gear::batch_size{16},
                                         gear::window{1}, gear::rng{11});
  auto b = sampler.make_batch();
  int per_rank_below_one = 0;
  for (int t = 0; t < 200; ++t) {
    float largest = 0;
    for (std::int64_t r = 0; r < 3; ++r) {
      sampler.sample(r, b);
      float rank_largest = 0;
      for (std::int64_t i = 0; i < 16; ++i) {
        const int id = b.column<"id">()(i, 0);
        REQUIRE(std::abs(b.probabilities_data()[i] - want[std::size_t(id)]) <=
                1e-5 * want[std::size_t(id)]);
        rank_largest = std::max(rank_largest, b.weights_data()[i]);
      }
      per_rank_below_one += rank_largest < 1.0f;
      largest = std::max(largest, rank_largest);
    }
    REQUIRE(largest == 1.0f);
  }
  // Some rank's own rows miss the step's rarest row: its weights are not rescaled to reach 1.
  CHECK(per_rank_below_one > 0);
}

TEST_CASE(
    "sharded updates from device memory: the GPU's pair check skips a sibling shard's good "
    "pair, fails a bad one alike in every shard; host shards refuse device memory") {
  using gear::detail::check_priority_pair;
  const std::int64_t lengths[4] = {1, 1, 0, 1};
  const std::uint64_t tickets[4] = {0, 1, 2, 3};
  const gear::key_owner shard1{1, 0};
  auto verdict = [&](gear::key k, float p, std::uint32_t siblings) {
    return check_priority_pair(k, p, 0.6, 9, lengths, tickets, 4, shard1, siblings);
  };
  const auto code = [](unsigned long long v) { return gear::detail::priority_verdict_code(v); };
  CHECK(verdict({1, 1, 0}, 2.0f, 3) == gear::detail::priority_ok);
  CHECK(code(verdict({2, 1, 0}, 2.0f, 3)) == gear::errc::stale_key);  // slot 2 not committed
  CHECK(verdict({1, 0, 0}, 2.0f, 3) == gear::detail::priority_sibling);
  CHECK(verdict({1, 2, 0}, 2.0f, 3) == gear::detail::priority_sibling);
  CHECK(code(verdict({1, 3, 0}, 2.0f, 3)) == gear::errc::key_out_of_range);   // no shard 3
  CHECK(code(verdict({1, 0, 1}, 2.0f, 3)) == gear::errc::key_out_of_range);   // other incarnation
  CHECK(code(verdict({1, 0, 0}, 2.0f, 0)) == gear::errc::key_out_of_range);   // a lone buffer
  CHECK(code(verdict({1, 0, 0}, -1.0f, 3)) == gear::errc::invalid_priority);  // checked anyway
  CHECK(gear::detail::priority_verdict_index(verdict({1, 0, 0}, -1.0f, 3)) == 9);

  per_shards buf({0, 0}, gear::capacity{10}, gear::max_length{1}, gear::select::prioritized{},
                 gear::insert_route::round_robin);
  const auto keys = insert_ids(buf, 0, 4);
  const std::vector<float> p(4, 3.0f);
  const double before = buf.shard(0).selection_state().total();
  CHECK(gear_test::code_of([&] {
          buf.update_priorities(keys, p, gear::memory_kind::device, gear::detail::no_stream());
        }) == gear::errc::wrong_memory);
  CHECK(buf.shard(0).selection_state().total() == before);
  buf.update_priorities(keys, p, gear::memory_kind::host, gear::detail::no_stream());
  CHECK(buf.shard(0).selection_state().total() != before);
}

TEST_CASE(
    "rank_sampler over one replay_buffer: the same contract (disjoint ranks, each row its "
    "key's trajectory)") {
  using single = gear::replay_buffer<spec, gear::storage::host, gear::select::uniform>;
  single buf{gear::capacity{64}, gear::max_length{1}, gear::select::uniform{.replacement = false}};
  const auto keys = insert_ids(buf, 0, 40);
  gear::rank_sampler<single> sampler(buf, gear::rank_count{3}, gear::batch_size{10},
                                     gear::window{1}, gear::rng{8});
  auto b = sampler.make_batch();
  for (int t = 0; t < 100; ++t) {
    std::set<int> step;
    for (std::int64_t r = 0; r < 3; ++r) {
      sampler.sample(r, b);
      for (std::int64_t i = 0; i < 10; ++i) {
        const int id = b.column<"id">()(i, 0);
        REQUIRE(b.keys_data()[i] == keys[std::size_t(id)]);
        step.insert(id);
      }
    }
    REQUIRE(step.size() == 30);
  }
}

TEST_CASE(
    "sharded insert routing: device_first picks the caller's device's shards in turn, else "
    "every shard in turn") {
  using gear::detail::route_insert;
  const std::vector<int> devices{0, 1, 0, 1, 2};
  std::vector<std::size_t> on1, on0, on3, none;
  for (std::size_t turn = 0; turn < 6; ++turn) {
    on1.push_back(route_insert(turn, devices, 1));
    on0.push_back(route_insert(turn, devices, 0));
    on3.push_back(route_insert(turn, devices, 3));    // no shard on device 3
    none.push_back(route_insert(turn, devices, -1));  // round_robin, or host storage
  }
  CHECK(on1 == std::vector<std::size_t>{1, 3, 1, 3, 1, 3});
  CHECK(on0 == std::vector<std::size_t>{0, 2, 0, 2, 0, 2});
  CHECK(on3 == std::vector<std::size_t>{0, 1, 2, 3, 4, 0});
  CHECK(none == on3);
  CHECK(route_insert(7, {2}, 2) == 0);
}

TEST_CASE(
    "sharded prioritized: set_exponents sets every shard or none; the weights use the shards' "
    "beta; shards whose exponents differ are refused by name, changing nothing") {
  per_shards buf({0, 0}, gear::capacity{8}, gear::max_length{1},
                 gear::select::prioritized{0.6, 0.4}, gear::insert_route::round_robin);
  const auto a = insert_ids(buf, 0, 4), b = insert_ids(buf, 4, 4);  // shard 0, shard 1
  REQUIRE(a[0].shard == 0);
  REQUIRE(b[0].shard == 1);
  std::vector<gear::key> ks(a.begin(), a.end());
  ks.insert(ks.end(), b.begin(), b.end());
  (void)buf.update_priorities(ks, std::vector<float>{1, 2, 3, 4, 3e38f, 6, 7, 8});
  const auto state = [&] {
    std::vector<double> v;
    for (std::size_t s = 0; s < 2; ++s) {
      const auto& st = buf.shard(s).selection_state();
      v.insert(v.end(), {st.total(), st.alpha(), st.beta()});
    }
    return v;
  };
  const auto before = state();
  // alpha 10 suits shard 0 (4^10) but not shard 1 (3e38^10 overflows): shard 0 is set back.
  CHECK(gear_test::code_of([&] { buf.set_exponents(10.0, 1.0, gear::detail::no_stream()); }) ==
        gear::errc::invalid_argument);
  CHECK(state() == before);
  // beta annealed on every shard: each row's weight is (P_min / P_i)^1 over the batch.
  (void)buf.update_priorities(std::vector<gear::key>{b[0]}, std::vector<float>{5.0f});
  buf.set_exponents(0.6, 1.0, gear::detail::no_stream());
  CHECK(buf.shard(0).selection_state().beta() == 1.0);
  CHECK(buf.shard(1).selection_state().beta() == 1.0);
  auto out = buf.make_batch(gear::batch_size{64}, gear::window_length{1});
  gear::rng g{5};
  buf.sample(out, gear::window{1}, g);
  const float* p = out.probabilities_data();
  const float p_min = *std::min_element(p, p + 64);
  CHECK(*std::max_element(p, p + 64) > 2 * p_min);  // rows of several priorities
  for (std::int64_t r = 0; r < 64; ++r)
    REQUIRE(out.weights_data()[r] == doctest::Approx(p_min / p[r]).epsilon(1e-5));
  // One shard's exponents set alone: samples and updates name the shard and change nothing.
  buf.shard(1).selection_state().set_exponents(0.6, 0.5);
  const auto now = state();
  gear::rng kept = g;
  std::string message;
  try {
    buf.sample(out, gear::window{1}, g);
  } catch (const gear::error& e) {
    CHECK(e.code() == gear::errc::invalid_argument);
    message = e.what();
  }
  CHECK(message.rfind("gear: invalid_argument: shard 1 has exponents alpha 0.6", 0) == 0);
  CHECK(g.next().call == kept.next().call);  // not advanced
  CHECK(gear_test::code_of([&] {
          (void)buf.update_priorities(std::vector<gear::key>{a[0]}, std::vector<float>{9.0f});
        }) == gear::errc::invalid_argument);
  CHECK(state() == now);
  buf.set_exponents(0.6, 0.5, gear::detail::no_stream());  // agreeing again
  buf.sample(out, gear::window{1}, g);
}

TEST_CASE("reserve_staging reaches every shard, and a bad limit is refused by name") {
  uniform_shards buf({0, 0, 0}, gear::capacity{8}, gear::max_length{4});  // 8 slots a shard
  buf.reserve_staging({.insert_trajectories = 8, .insert_steps = 32, .batch = 64});
  std::string what;
  try {
    buf.reserve_staging({.insert_trajectories = 9});  // every shard holds 8
  } catch (const gear::error& e) {
    CHECK(e.code() == gear::errc::invalid_argument);
    what = e.what();
  }
  CHECK_MESSAGE(what.find("call_limits.insert_trajectories") != std::string::npos, what);
  CHECK(buf.size() == 0);
}

TEST_CASE("keys of another buffer (sharded or not) are refused, never taken for this one's") {
  std::map<std::pair<std::uint32_t, std::uint64_t>, int> ids;
  per_shards a({0, 0}, gear::capacity{8}, gear::max_length{1});
  per_shards b({0, 0}, gear::capacity{8}, gear::max_length{1});
  const auto ka = insert_into(a, 0, 4, ids);
  const auto kb = insert_into(b, 100, 4, ids);
  REQUIRE(ka[0].ticket == kb[0].ticket);  // the same tickets and shards, another incarnation
  REQUIRE(ka[0].shard == kb[0].shard);
  const auto ka2 = insert_into(a, 10, 1, ids);  // round robin: the other shard
  CHECK(ka2[0].shard != ka[0].shard);
  CHECK(ka2[0].incarnation == ka[0].incarnation);  // one incarnation for all of a's shards
  CHECK(ka[0].incarnation != kb[0].incarnation);
  CHECK(!b.contains(ka[0]));
  const float five[] = {5.0f};
  CHECK(gear_test::code_of([&] { (void)b.update_priorities(std::span(ka).first(1), five); }) ==
        gear::errc::key_out_of_range);
  CHECK(gear_test::code_of([&] { b.erase(std::span(ka).first(1)); }) ==
        gear::errc::key_out_of_range);
  CHECK(gear_test::code_of([&] {
          b.erase(std::span<const gear::key>(static_cast<const gear::key*>(nullptr), 1));
        }) == gear::errc::null_pointer);
  CHECK(b.size() == 4);
  // A lone buffer's keys and a shard's are told apart too.
  gear::replay_buffer<spec, gear::storage::host, gear::select::prioritized> lone{
      gear::capacity{8}, gear::max_length{1}};
  const auto kl = insert_ids(lone, 200, 4);
  CHECK(kl[0].ticket == ka[0].ticket);
  CHECK(!a.contains(kl[0]));
  CHECK(!lone.contains(ka[0]));
  CHECK(lone.owner().incarnation == kl[0].incarnation);
  CHECK(gear_test::code_of([&] { (void)lone.update_priorities(std::span(kb).first(1), five); }) ==
        gear::errc::key_out_of_range);
  CHECK(lone.size() == 4);
  const std::span<const float> no_priorities(static_cast<const float*>(nullptr), 1);
  CHECK(gear_test::code_of([&] {
          (void)lone.update_priorities(std::span(kl).first(1), no_priorities);
        }) == gear::errc::null_pointer);
}
