// sharded_buffer over storage::host shards: routing of inserts, updates and erases by the shard a
// key names; the union's laws (chi-square at significance 0.001, fixed printed seeds, each with a
// power check: the same test rejects a planted wrong distribution on the same counts); global
// probabilities and weights; bad input that changes nothing.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <gear/sharded_buffer.hpp>
#include <map>
#include <random>
#include <set>
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
