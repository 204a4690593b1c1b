// Selection suite, host side: prioritized and recency selection on storage::host buffers, the sum
// tree maths the kernels share, and the statistical tests (chi-square at significance 0.001, fixed
// printed seeds, each with a power check that the same test rejects a planted wrong distribution).

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <gear/detail/recency_scan.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "select_common.hpp"

using namespace select_test;
using per_buffer = gear::replay_buffer<spec, gear::storage::host, gear::select::prioritized>;
using recent_buffer = gear::replay_buffer<spec, gear::storage::host, gear::select::recency>;

namespace {

/// Draws `calls` batches of `rows` and counts each slot; checks the reported probability of every
/// row against `want` (by slot) to 1e-5 relative.
template <class Buffer>
std::vector<double> draw_counts(Buffer& buf, gear::rng& g, std::int64_t rows, int calls,
                                const std::vector<double>& want_by_slot, double* worst_p) {
  std::vector<double> counts(static_cast<std::size_t>(buf.capacity()), 0);
  auto b = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
  for (int c = 0; c < calls; ++c) {
    buf.sample(b, gear::window{1}, g);
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto slot = static_cast<std::size_t>(b.slots_data()[r]);
      counts[slot] += 1;
      const double want = want_by_slot[slot];
      *worst_p = std::max(*worst_p, std::abs(b.probabilities_data()[r] - want) / want);
    }
  }
  return counts;
}

}  // namespace

// ---- sum tree maths ---------------------------------------------------------------------------

TEST_CASE(
    "selection_workspace: sizes, claims and arrivals clear, a batch's own; moved from, null") {
  for (const std::int64_t rows : {1, 2, 3, 255, 256, 4097}) {
    gear::detail::selection_workspace w(gear::memory_kind::host, rows);
    INFO("rows " << rows);
    CHECK(w.size() == gear::detail::claim_table_size(rows));
    CHECK(w.size() >= 2 * rows);
    CHECK((w.size() & (w.size() - 1)) == 0);
    CHECK(std::all_of(w.claims(), w.claims() + w.size(), [](std::uint64_t c) { return c == 0; }));
    CHECK(*w.arrivals() == 0u);
    CHECK(w.claims() == w.scratch() + w.size());  // three regions, apart
    CHECK(reinterpret_cast<std::uint64_t*>(w.arrivals()) == w.claims() + w.size());
    CHECK(reinterpret_cast<std::uintptr_t>(w.claims()) % 16 == 0);  // 16-byte clears
    gear::selection_request r;
    w.lend_to(r);
    CHECK(r.scratch == w.scratch());
    CHECK(r.scratch_size == w.size());
    CHECK(r.claims == w.claims());
    CHECK(r.arrivals == w.arrivals());
    gear::detail::selection_workspace moved(std::move(w));
    CHECK(moved.claims() == r.claims);
    CHECK(w.size() == 0);  // NOLINT(bugprone-use-after-move): what a moved-from one lends
    CHECK(w.claims() == nullptr);
    CHECK(w.arrivals() == nullptr);
  }
  // Each batch has its own.
  gear::batch<spec> a(gear::memory_kind::host, gear::batch_size{8}, gear::window_length{1});
  gear::batch<spec> b(gear::memory_kind::host, gear::batch_size{8}, gear::window_length{1});
  CHECK(a.workspace().claims() != b.workspace().claims());
  CHECK(a.workspace().size() == 16);
}

TEST_CASE("sum tree shape: every node's 16 children lie inside the padded next level") {
  for (std::int64_t cap :
       {1, 2, 15, 16, 17, 255, 256, 257, 4095, 4096, 4097, 100000, 1 << 24, (1 << 24) + 1}) {
    const auto s = gear::detail::make_sum_tree_shape(cap);
    INFO("capacity " << cap);
    REQUIRE(s.count[0] == 1);
    REQUIRE(s.count[s.levels - 1] == cap);
    REQUIRE(s.offset[0] == 0);
    for (int d = 0; d + 1 < s.levels; ++d) {
      REQUIRE(s.count[d] == (s.count[d + 1] + 15) / 16);
      REQUIRE(s.offset[d + 1] % 16 == 0);
      REQUIRE(s.offset[d + 1] >= s.offset[d] + s.count[d]);
      REQUIRE(s.offset[d + 1] + s.count[d] * 16 <= (d + 2 < s.levels ? s.offset[d + 2] : s.total));
    }
  }
  CHECK(gear::detail::make_sum_tree_shape(1 << 24).levels == 7);  // root + 6 levels of 16
  CHECK(gear::detail::make_sum_tree_shape(std::int64_t{1} << 40).levels <=
        gear::detail::sum_tree_max_levels);
}

TEST_CASE("sum_tree_find returns the leaf whose prefix interval holds u, never a zero leaf") {
  const std::uint64_t seed = 101;
  INFO("seed " << seed);
  std::mt19937_64 gen(seed);
  for (std::int64_t cap : {1, 3, 16, 17, 300, 5000}) {
    const auto s = gear::detail::make_sum_tree_shape(cap);
    std::vector<double> tree(static_cast<std::size_t>(s.total), 0.0),
        leaves(static_cast<std::size_t>(cap));
    for (std::int64_t i = 0; i < cap; ++i)
      tree[static_cast<std::size_t>(s.leaf(i))] = leaves[static_cast<std::size_t>(i)] =
          (gen() % 4 == 0 && cap > 1) ? 0.0 : std::ldexp(double(gen() % 1000 + 1), -int(gen() % 8));
    if (std::all_of(leaves.begin(), leaves.end(), [](double v) { return v == 0; })) continue;
    gear::detail::sum_tree_rebuild(tree.data(), s);
    std::vector<double> prefix(leaves.size() + 1, 0.0);
    for (std::size_t i = 0; i < leaves.size(); ++i) prefix[i + 1] = prefix[i] + leaves[i];
    for (int k = 0; k < 2000; ++k) {
      const double u = gear::detail::unit_interval(gen()) * tree[0];
      const auto slot = gear::detail::sum_tree_find(tree.data(), s, u);
      REQUIRE(slot >= 0);
      REQUIRE(slot < cap);
      REQUIRE(leaves[static_cast<std::size_t>(slot)] > 0);
      // Dyadic leaves: every sum is exact, so the interval is exact too.
      REQUIRE(prefix[static_cast<std::size_t>(slot)] <= u);
      REQUIRE(u < prefix[static_cast<std::size_t>(slot) + 1]);
    }
    // u at or beyond the root (rounding) still lands on the last positive leaf.
    const auto last = gear::detail::sum_tree_find(tree.data(), s, tree[0] * 2);
    REQUIRE(leaves[static_cast<std::size_t>(last)] > 0);
  }
}

TEST_CASE("sum_tree_scan_children adds in a warp scan's order; sum_tree_pick follows it") {
  // 2^53 and fifteen 1s: one at a time, each 1 is lost to rounding (2^53 + 1 rounds to 2^53); a
  // Kogge-Stone scan adds the 1s among themselves first, so its prefixes climb in steps of 2.
  double v[16], prefix[16];
  v[0] = 0x1p53;
  for (int c = 1; c < 16; ++c) v[c] = 1.0;
  gear::detail::sum_tree_scan_children(v, prefix);
  CHECK(prefix[0] == 0x1p53);
  CHECK(prefix[1] == 0x1p53);  // 2^53 + 1, rounded to even: a prefix that does not rise
  CHECK(prefix[2] == 0x1p53 + 2);
  CHECK(prefix[3] == 0x1p53 + 2);  // (2^53 + 1) + (1 + 1) after two steps
  CHECK(prefix[15] == 0x1p53 + 14);
  // A positive child whose prefix does not rise is never picked: u = 2^53 passes child 1 and
  // lands on child 2, less the prefix before it.
  double u = 0x1p53;
  CHECK(gear::detail::sum_tree_pick(v, prefix, u) == 2);
  CHECK(u == 0.0);
  // Past every prefix (rounding): the last positive child, zeros after it skipped.
  v[15] = 0.0;
  gear::detail::sum_tree_scan_children(v, prefix);
  u = 0x1p54;
  CHECK(gear::detail::sum_tree_pick(v, prefix, u) == 14);
  // Below the first prefix: the first positive child, u unchanged.
  v[0] = 0.0;
  gear::detail::sum_tree_scan_children(v, prefix);
  u = 0.5;
  CHECK(gear::detail::sum_tree_pick(v, prefix, u) == 1);
  CHECK(u == 0.5);
}

// ---- prioritized ------------------------------------------------------------------------------

TEST_CASE("prioritized: 10^6 draws follow p^alpha / sum p^alpha (chi-square, 0.001); power check") {
  const std::uint64_t seed = 20261202;
  const double alpha = 0.7, beta = 0.5;
  MESSAGE("prioritized host chi-square seed " << seed);
  const std::int64_t n = 300;
  per_buffer buf{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{alpha, beta}};
  const auto keys = insert_ids(buf, 0, n);
  const auto p = random_priorities(seed, static_cast<std::size_t>(n));
  buf.update_priorities(keys, p);
  const auto want = exact_probabilities(p, alpha);  // slot i holds keys[i] (fresh buffer)
  gear::rng g{seed};
  double worst_p = 0;
  const int calls = 245;
  const std::int64_t rows = 4096;  // 1,003,520 draws
  const auto counts = draw_counts(buf, g, rows, calls, want, &worst_p);
  const double draws = double(calls) * rows;
  CHECK(worst_p < 1e-5);
  for (std::size_t i = 0; i < p.size(); ++i)
    if (p[i] == 0) CHECK(counts[i] == 0);
  const auto fit = chi2_test(counts, want, draws);
  MESSAGE("chi2 " << fit.statistic << " df " << fit.df << " critical(0.001) " << fit.critical);
  CHECK_FALSE(fit.rejects());
  // Power: the same counts against the distribution of a slightly different alpha.
  const auto planted = exact_probabilities(p, alpha * 0.97);
  const auto wrong = chi2_test(counts, planted, draws);
  MESSAGE("planted alpha " << alpha * 0.97 << ": chi2 " << wrong.statistic);
  CHECK(wrong.rejects());
}

TEST_CASE("prioritized: importance weights equal (N P_i)^-beta / max over the batch to 1e-5") {
  const std::uint64_t seed = 7;
  INFO("seed " << seed);
  const std::int64_t n = 1000;
  per_buffer buf{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
  const auto keys = insert_ids(buf, 0, n);
  const auto p = random_priorities(seed, static_cast<std::size_t>(n));
  buf.update_priorities(keys, p);
  gear::rng g{seed};
  for (double beta : {0.0, 0.4, 1.0}) {
    buf.selection_state().set_exponents(0.6, beta);
    const auto P = exact_probabilities(p, 0.6);
    auto b = buf.make_batch(gear::batch_size{513}, gear::window_length{1});
    buf.sample(b, gear::window{1}, g);
    double max_w = 0;
    for (std::int64_t r = 0; r < 513; ++r)
      max_w = std::max(max_w,
                       std::pow(double(n) * P[static_cast<std::size_t>(b.slots_data()[r])], -beta));
    for (std::int64_t r = 0; r < 513; ++r) {
      const double w =
          std::pow(double(n) * P[static_cast<std::size_t>(b.slots_data()[r])], -beta) / max_w;
      REQUIRE(std::abs(b.weights_data()[r] - w) <= 1e-5 * w);
    }
  }
}

TEST_CASE("prioritized: new items enter at the largest priority so far; eviction removes theirs") {
  per_buffer buf{gear::capacity{4}, gear::max_length{1}, gear::select::prioritized{1.0, 0.5}};
  auto& st = buf.selection_state();
  auto k = insert_ids(buf, 0, 2);
  CHECK(st.priority(0) == 1.0f);
  CHECK(st.priority(2) < 0);  // never reserved: no priority, leaf 0
  CHECK(st.total() == 2.0);
  const std::vector<float> p{3.0f, 0.5f};
  buf.update_priorities(k, p);
  CHECK(st.max_priority() == 3.0f);
  insert_ids(buf, 2, 3);  // ticket 4 evicts slot 0
  CHECK(st.priority(0) == 3.0f);
  CHECK(st.priority(1) == 0.5f);
  CHECK(st.total() == 3.0 * 3 + 0.5);
  // A pending slot (open writer) is never drawn.
  {
    auto w = buf.make_writer();  // reserves slot 1, evicting its trajectory
    CHECK(st.leaf(1) == 0.0);
    gear::rng g{3};
    auto b = buf.make_batch(gear::batch_size{2000}, gear::window_length{1});
    buf.sample(b, gear::window{1}, g);
    for (std::int64_t r = 0; r < 2000; ++r) REQUIRE(b.slots_data()[r] != 1);
  }
  CHECK(st.leaf(1) == 0.0);  // abandoned
}

TEST_CASE("prioritized: duplicate keys in one update, last write wins") {
  per_buffer buf{gear::capacity{8}, gear::max_length{1}, gear::select::prioritized{0.5, 0.5}};
  const auto k = insert_ids(buf, 0, 8);
  const std::vector<gear::key> ks{k[2], k[5], k[2], k[5], k[2]};
  const std::vector<float> ps{4.0f, 9.0f, 16.0f, 1.0f, 0.25f};
  buf.update_priorities(ks, ps);
  auto& st = buf.selection_state();
  CHECK(st.priority(2) == 0.25f);
  CHECK(st.priority(5) == 1.0f);
  CHECK(st.leaf(2) == doctest::Approx(0.5));
  CHECK(st.total() == doctest::Approx(6 * 1.0 + 0.5 + 1.0));
  CHECK(st.max_priority() == 16.0f);  // the largest given, even though overwritten
}

TEST_CASE(
    "prioritized: keys of another shard and bad priorities change nothing; stale keys are skipped "
    "and counted") {
  const std::uint64_t seed = 99;
  INFO("seed " << seed);
  per_buffer buf{gear::capacity{50}, gear::max_length{1}, gear::select::prioritized{0.8, 0.6}};
  const auto old_keys = insert_ids(buf, 0, 50);
  const auto keys = insert_ids(buf, 50, 20);  // evicts old_keys[0..20)
  const auto& st = buf.selection_state();
  auto sample_once = [&] {
    gear::rng g{seed};
    auto b = buf.make_batch(gear::batch_size{300}, gear::window_length{1});
    buf.sample(b, gear::window{1}, g);
    return std::make_tuple(std::vector<std::int64_t>(b.slots_data(), b.slots_data() + 300),
                           std::vector<float>(b.probabilities_data(), b.probabilities_data() + 300),
                           std::vector<float>(b.weights_data(), b.weights_data() + 300));
  };
  const std::vector<float> ok{2.0f, 3.0f};
  CHECK(buf.update_priorities(std::vector<gear::key>{keys[0], old_keys[30]}, ok) ==
        gear::priority_update_result{2, 0});
  const auto before = sample_once();
  const auto nodes = st.nodes();
  const auto size = buf.size();
  const float max_before = st.max_priority();
  auto expect = [&](gear::errc code, std::vector<gear::key> ks, std::vector<float> ps) {
    CHECK(gear_test::code_of([&] { buf.update_priorities(ks, ps); }) == code);
    CHECK(st.nodes() == nodes);
    CHECK(st.max_priority() == max_before);
    CHECK(buf.size() == size);
    CHECK(sample_once() == before);
  };
  gear::key far = keys[1], reborn = keys[1];
  far.shard = 1;
  reborn.incarnation = keys[1].incarnation + 1;
  expect(gear::errc::key_out_of_range, {keys[1], far}, {5.0f, 5.0f});
  expect(gear::errc::key_out_of_range, {old_keys[3], reborn}, {5.0f, 5.0f});
  expect(gear::errc::invalid_priority, {keys[1], keys[2]}, {100.0f, std::nanf("")});
  expect(gear::errc::invalid_priority, {keys[1], keys[2]}, {100.0f, -1.0f});
  expect(gear::errc::invalid_priority, {keys[1], keys[2]}, {100.0f, INFINITY});
  // A stale key does not excuse a bad priority, its own or another pair's.
  expect(gear::errc::invalid_priority, {keys[1], old_keys[3]}, {100.0f, -1.0f});
  expect(gear::errc::invalid_priority, {old_keys[3], keys[2]}, {100.0f, std::nanf("")});
  expect(gear::errc::invalid_argument, {keys[1], keys[2]}, {100.0f});
  CHECK(gear_test::code_of([&] { buf.selection_state().set_exponents(-1, 0.5); }) ==
        gear::errc::invalid_argument);
  CHECK(sample_once() == before);
  // Stale keys (old_keys[3] was evicted by keys[3], which now holds slot 3) are skipped and
  // counted: the live pair is applied, the new occupant keeps its priority, and the stale pair's
  // priority does not raise the maximum.
  const float slot3 = st.priority(3);
  const auto r = buf.update_priorities(std::vector<gear::key>{keys[1], old_keys[3]},
                                       std::vector<float>{5.0f, 50.0f});
  CHECK(r == gear::priority_update_result{1, 1});
  CHECK(st.priority(keys[1].slot(50)) == 5.0f);
  CHECK(st.priority(3) == slot3);
  CHECK(st.max_priority() == std::max(max_before, 5.0f));  // not 50
  CHECK(buf.size() == size);
  CHECK(sample_once() != before);
  // Only stale keys: nothing applied, nothing thrown.
  const auto changed = st.nodes();
  CHECK(buf.update_priorities(std::vector<gear::key>{old_keys[0], old_keys[19], old_keys[0]},
                              std::vector<float>{1.0f, 2.0f, 3.0f}) ==
        gear::priority_update_result{0, 3});
  CHECK(st.nodes() == changed);
  CHECK(buf.update_priorities(std::vector<gear::key>{}, std::vector<float>{}) ==
        gear::priority_update_result{0, 0});
}

TEST_CASE("prioritized: the GPU's pair check agrees with check_key and the host priority check") {
  per_buffer buf{gear::capacity{40}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
  const auto old_keys = insert_ids(buf, 0, 40);
  const auto keys = insert_ids(buf, 40, 10);  // evicts old_keys[0..10)
  buf.erase(std::vector<gear::key>{keys[4]});
  auto w = buf.make_writer();  // slot 10 pending
  const gear::slot_table t = buf.selection_table();
  std::vector<gear::key> probes(old_keys.begin(), old_keys.end());
  probes.insert(probes.end(), keys.begin(), keys.end());
  CHECK(buf.ticket(10) == 50);
  const gear::key_owner ours{0, keys[0].incarnation};  // this buffer's keys
  const gear::key pending{buf.ticket(10), 0, keys[0].incarnation};
  gear::key ahead = keys[0], shard = keys[0], none = keys[0], stale_shard = old_keys[0];
  ahead.ticket = buf.tickets_issued() + 40;  // not issued yet; its slot (11) holds ticket 11, live
  shard.shard = 3;
  none.ticket = gear::no_ticket;
  stale_shard.shard = 1;
  probes.insert(probes.end(), {pending, ahead, shard, none, stale_shard});
  for (std::size_t i = 0; i < probes.size(); ++i) {
    const gear::key& k = probes[i];
    INFO("probe " << i << ": ticket " << k.ticket << " shard " << k.shard);
    const auto verdict = gear::detail::check_priority_pair(k, 1.0f, 0.6, i, t.lengths, t.tickets,
                                                           t.capacity, ours);
    const gear::errc host = gear_test::code_of([&] { buf.check_key(k); });
    if (host == gear::errc{}) {
      CHECK(verdict == gear::detail::priority_ok);
      continue;
    }
    REQUIRE(verdict != gear::detail::priority_ok);
    CHECK(gear::detail::priority_verdict_code(verdict) == host);
    CHECK(gear::detail::priority_verdict_index(verdict) == i);
  }
  for (float p : {0.0f, -0.0f, 1e-30f, 3.0f, 0x1.fffffep127f})
    CHECK(gear::detail::check_priority_pair(keys[0], p, 0.6, 0, t.lengths, t.tickets, 40,
                                            ours) == gear::detail::priority_ok);
  for (float p : {-1e-30f, -1.0f, INFINITY, -INFINITY, std::nanf("")})
    CHECK(gear::detail::priority_verdict_code(gear::detail::check_priority_pair(
              keys[0], p, 0.6, 7, t.lengths, t.tickets, 40, ours)) ==
          gear::errc::invalid_priority);
  // p^alpha as the host checks it (validate_priorities): a leaf whose capacity-fold overflows
  // (3.2e38^8 is about 1.1e308: one fits, two could not be added), or 0 for p > 0 (1e-33^10),
  // is refused on the GPU too.
  const auto pair_code = [&](float p, double alpha, std::int64_t capacity) {
    const auto v = gear::detail::check_priority_pair(keys[0], p, alpha, 0, t.lengths, t.tickets,
                                                     capacity, ours);
    return v == gear::detail::priority_ok ? gear::errc{} : gear::detail::priority_verdict_code(v);
  };
  const auto host_code = [&](float p, double alpha, std::int64_t capacity) {
    return gear_test::code_of([&] {
      const float ps[1] = {p};
      (void)gear::detail::validate_priorities(std::span(keys).first(1), ps, alpha, capacity);
    });
  };
  for (const auto& [p, alpha, capacity, ok] :
       std::vector<std::tuple<float, double, std::int64_t, bool>>{{3.2e38f, 8.0, 1, true},
                                                                  {3.2e38f, 8.0, 2, false},
                                                                  {1e38f, 9.0, 1, false},
                                                                  {1e-33f, 10.0, 1, false},
                                                                  {1e-33f, 1.0, 1, true},
                                                                  {0.0f, 10.0, 40, true}}) {
    CAPTURE(p);
    CAPTURE(alpha);
    CAPTURE(capacity);
    const gear::errc want = ok ? gear::errc{} : gear::errc::invalid_priority;
    CHECK(pair_code(p, alpha, capacity) == want);
    CHECK(host_code(p, alpha, capacity) == want);
  }
  // The minimum of verdicts names the first bad key, else the first bad priority.
  using gear::errc;
  using gear::detail::priority_verdict;
  CHECK(priority_verdict(errc::stale_key, 900) < priority_verdict(errc::invalid_priority, 0));
  CHECK(priority_verdict(errc::key_out_of_range, 5) < priority_verdict(errc::stale_key, 6));
  CHECK(priority_verdict(errc::stale_key, 5) < priority_verdict(errc::key_out_of_range, 6));
  CHECK(priority_verdict(errc::invalid_priority, 5) < priority_verdict(errc::invalid_priority, 6));
  CHECK(priority_verdict(errc::invalid_priority, (std::uint64_t{1} << 32) - 1) <
        gear::detail::priority_ok);
  CHECK(gear::detail::priority_verdict_index(priority_verdict(errc::invalid_priority, 123456)) ==
        123456);
}

TEST_CASE("prioritized: the GPU's pair check refuses keys of another incarnation") {
  per_buffer buf{gear::capacity{8}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
  const auto keys = insert_ids(buf, 0, 8);
  const gear::slot_table t = buf.selection_table();
  gear::key reborn = keys[2];
  reborn.incarnation = keys[2].incarnation + 1;
  REQUIRE(gear_test::code_of([&] { buf.check_key(reborn); }) == gear::errc::key_out_of_range);
  const gear::key_owner ours{0, keys[2].incarnation};
  const auto verdict = gear::detail::check_priority_pair(reborn, 1.0f, 0.6, 4, t.lengths,
                                                         t.tickets, t.capacity, ours);
  CHECK(verdict != gear::detail::priority_ok);
  CHECK(gear::detail::priority_verdict_code(verdict) == gear::errc::key_out_of_range);
}

TEST_CASE("prioritized: failures reported by the GPU are raised once, the earliest first") {
  using gear::detail::priority_failure;
  gear::detail::priority_report report{};
  std::uint64_t raised = 0;
  auto record = [&](priority_failure f) {  // what the update kernel writes
    report.log[report.failures % gear::detail::priority_failure_log] = f;
    ++report.failures;
  };
  auto raise = [&] {
    try {
      gear::detail::raise_priority_failures(report, raised, 50);
    } catch (const gear::error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(gear::errc{}, std::string());
  };
  CHECK(raise().first == gear::errc{});
  record({3, 17, gear::key{105, 0, 0}, 1.0f, static_cast<std::int32_t>(gear::errc::stale_key)});
  auto [code, what] = raise();
  CHECK(code == gear::errc::stale_key);
  CHECK(what ==
        "gear: stale_key: update_priorities from device memory (call 3) changed nothing: key 17 "
        "(ticket 105, slot 5) names a trajectory no longer stored");
  CHECK(raise().first == gear::errc{});  // once
  record(
      {4, 2, gear::key{70, 1, 0}, 1.0f, static_cast<std::int32_t>(gear::errc::key_out_of_range)});
  record({6, 9, gear::key{}, -2.0f, static_cast<std::int32_t>(gear::errc::invalid_priority)});
  record({7, 0, gear::key{}, 0.0f, static_cast<std::int32_t>(gear::errc::invalid_priority)});
  std::tie(code, what) = raise();
  CHECK(code == gear::errc::key_out_of_range);
  CHECK_MESSAGE(
      what.find(
          "(call 4) changed nothing: key 2 (shard 1, incarnation 0, ticket 70) is not in this "
          "shard (and 2 later updates from device memory failed") != std::string::npos,
      what);
  CHECK(raise().first == gear::errc{});
  for (int i = 0; i < 70; ++i)  // more than the log holds before any is raised
    record({std::uint64_t(10 + i), 1, gear::key{}, -1.0f,
            static_cast<std::int32_t>(gear::errc::invalid_priority)});
  std::tie(code, what) = raise();
  CHECK(code == gear::errc::invalid_priority);
  CHECK(what.find("70 updates from device memory failed") != std::string::npos);
  CHECK(what.find("(call 79)") != std::string::npos);
  CHECK(raised == report.failures);
}

TEST_CASE("prioritized: an update after newer inserts skips the evicted keys, applies the rest") {
  // The learner's loop: sample from a full buffer, let actors insert, then update the sampled keys
  // with their TD errors. Keys whose trajectories were evicted meanwhile are skipped and counted.
  const std::uint64_t seed = 8080;
  MESSAGE("stale-update host seed " << seed);
  const std::int64_t n = 1000, rows = 256;
  const double alpha = 0.6;
  per_buffer buf{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{alpha, 0.4}};
  const auto& st = buf.selection_state();
  const auto keys = insert_ids(buf, 0, n);  // full: ticket i in slot i, holding id i
  // The 8 oldest (evicted below) get a large priority, so that the batch surely holds some.
  CHECK(buf.update_priorities(std::span(keys).first(8), std::vector<float>(8, 40.0f)) ==
        gear::priority_update_result{8, 0});
  gear::rng g{seed};
  auto b = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
  buf.sample(b, gear::window{1}, g);
  const std::vector<gear::key> sampled(b.keys_data(), b.keys_data() + rows);
  for (std::int64_t r = 0; r < rows; ++r)  // the rows hold the trajectories their keys name
    REQUIRE(reinterpret_cast<const std::int32_t*>(b.column_data(0))[r] ==
            static_cast<std::int32_t>(sampled[static_cast<std::size_t>(r)].ticket));
  insert_ids(buf, static_cast<std::int32_t>(n), 8);  // tickets 1000..1007 evict tickets 0..7
  std::int64_t evicted = 0;                          // counted from the insertion order alone
  for (const auto& k : sampled) evicted += k.ticket < 8;
  MESSAGE(evicted << " of " << rows << " sampled rows name evicted trajectories");
  REQUIRE(evicted > 0);
  REQUIRE(evicted < rows);
  std::vector<float> td(static_cast<std::size_t>(rows));
  for (std::size_t r = 0; r < td.size(); ++r) td[r] = 0.25f + 0.5f * static_cast<float>(r);
  float live_max = 0;
  std::map<std::uint64_t, float> last;  // ticket -> its last priority in the update (live only)
  for (std::size_t r = 0; r < td.size(); ++r)
    if (sampled[r].ticket >= 8) {
      last[sampled[r].ticket] = td[r];
      live_max = std::max(live_max, td[r]);
    }
  gear::priority_update_result result;
  CHECK_NOTHROW(result = buf.update_priorities(sampled, td));
  CHECK(result.stale == evicted);
  CHECK(result.applied == rows - evicted);
  for (const auto& [ticket, p] : last) CHECK(st.priority(static_cast<std::int64_t>(ticket)) == p);
  // The evicted slots hold the new trajectories, at the priority they entered with (the largest
  // so far, 40): the stale pairs did not reach them.
  for (std::int64_t s = 0; s < 8; ++s) {
    CHECK(buf.ticket(s) == static_cast<std::uint64_t>(n + s));
    CHECK(st.priority(s) == 40.0f);
  }
  CHECK(st.max_priority() == std::max(40.0f, live_max));
  long double fresh = 0;
  for (std::int64_t i = 0; i < n; ++i)
    fresh += std::pow(static_cast<long double>(st.priority(i)), static_cast<long double>(alpha));
  CHECK(std::abs(static_cast<double>((st.total() - fresh) / fresh)) < 1e-9);

  // With every sampled trajectory removed after one return, the batch just sampled is all stale.
  buf.set_max_times_sampled(1);
  buf.sample(b, gear::window{1}, g);
  const std::vector<gear::key> consumed(b.keys_data(), b.keys_data() + rows);
  std::set<std::uint64_t> distinct;
  for (const auto& k : consumed) distinct.insert(k.ticket);
  CHECK(buf.size() == n - static_cast<std::int64_t>(distinct.size()));
  for (const auto& k : consumed) REQUIRE(!buf.contains(k));
  const auto nodes = st.nodes();
  const float max_before = st.max_priority();
  gear::priority_update_result all_stale;
  CHECK_NOTHROW(all_stale = buf.update_priorities(consumed, td));
  CHECK(all_stale.stale == rows);
  CHECK(all_stale.applied == 0);
  CHECK(st.nodes() == nodes);
  CHECK(st.max_priority() == max_before);
  for (const auto t : distinct) CHECK(st.priority(static_cast<std::int64_t>(t % n)) < 0);
}

TEST_CASE("selection() reports the policy's settings as the state holds them now") {
  static_assert(std::is_same_v<decltype(std::declval<const per_buffer&>().selection()),
                               gear::select::prioritized>);
  per_buffer buf{gear::capacity{8}, gear::max_length{1},
                 gear::select::prioritized{.alpha = 0.6, .beta = 0.4, .stratified = true}};
  CHECK(buf.selection().alpha == 0.6);
  CHECK(buf.selection().beta == 0.4);
  CHECK(buf.selection().stratified);
  buf.selection_state().set_exponents(0.9, 1.0);
  const gear::select::prioritized now = buf.selection();
  CHECK(now.alpha == 0.9);
  CHECK(now.beta == 1.0);
  CHECK(now.stratified);
  recent_buffer rb{gear::capacity{8}, gear::max_length{1}, gear::select::recency{5, 2.0}};
  CHECK(rb.selection().newest == 5);
  rb.selection_state().set_newest(3);
  CHECK(rb.selection().newest == 3);
  CHECK(rb.selection().half_life == 2.0);
}

TEST_CASE("prioritized: storage::host takes priorities from host memory only") {
  per_buffer buf{gear::capacity{8}, gear::max_length{1}, gear::select::prioritized{0.5, 0.5}};
  const auto k = insert_ids(buf, 0, 8);
  const std::vector<float> p{2.0f, 3.0f};
  const std::vector<gear::key> ks{k[1], k[2]};
  const auto nodes = buf.selection_state().nodes();
  CHECK(gear_test::code_of([&] {
          buf.update_priorities_async(ks, p, gear::memory_kind::device, gear::detail::no_stream());
        }) == gear::errc::wrong_memory);
  CHECK(buf.selection_state().nodes() == nodes);
  buf.update_priorities(ks, p, gear::memory_kind::host, gear::detail::no_stream());
  CHECK(buf.selection_state().priority(2) == 3.0f);
  CHECK(buf.selection_state().max_priority(gear::detail::no_stream()) == 3.0f);
  CHECK_NOTHROW(buf.check_priority_updates(gear::detail::no_stream()));
}

TEST_CASE("prioritized: all-zero priorities fall back to uniform; alpha 0 is uniform") {
  per_buffer buf{gear::capacity{10}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
  const auto k = insert_ids(buf, 0, 10);
  buf.update_priorities(k, std::vector<float>(10, 0.0f));
  gear::rng g{5};
  auto b = buf.make_batch(gear::batch_size{64}, gear::window_length{1});
  buf.sample(b, gear::window{1}, g);
  for (int r = 0; r < 64; ++r) {
    CHECK(b.probabilities_data()[r] == doctest::Approx(0.1));
    CHECK(b.weights_data()[r] == 1.0f);
  }
  std::vector<float> p(10, 1.0f);
  p[3] = 1000.0f;
  buf.update_priorities(k, p);
  buf.selection_state().set_exponents(0.0, 0.4);
  buf.sample(b, gear::window{1}, g);
  for (int r = 0; r < 64; ++r) CHECK(b.probabilities_data()[r] == doctest::Approx(0.1));
  buf.selection_state().set_exponents(1.0, 0.4);
  CHECK(buf.selection_state().total() == doctest::Approx(1009.0));
}

TEST_CASE("prioritized: stratified draws keep the marginal distribution (chi-square, 0.001)") {
  const std::uint64_t seed = 31337;
  MESSAGE("stratified host seed " << seed);
  const std::int64_t n = 200;
  per_buffer buf{gear::capacity{n}, gear::max_length{1},
                 gear::select::prioritized{.alpha = 1.0, .beta = 0.4, .stratified = true}};
  const auto keys = insert_ids(buf, 0, n);
  const auto p = random_priorities(seed, static_cast<std::size_t>(n));
  buf.update_priorities(keys, p);
  const auto want = exact_probabilities(p, 1.0);
  gear::rng g{seed};
  double worst = 0;
  const auto counts = draw_counts(buf, g, 1000, 1000, want, &worst);
  const auto fit = chi2_test(counts, want, 1e6);
  MESSAGE("stratified chi2 " << fit.statistic << " critical " << fit.critical);
  CHECK_FALSE(fit.rejects());
  CHECK(chi2_test(counts, exact_probabilities(p, 0.95), 1e6).rejects());
}

TEST_CASE(
    "prioritized: 10^7 updates leave the root equal to a fresh fp64 sum (1e-9) and the tree "
    "equal to one rebuilt from its leaves") {
  const std::uint64_t seed = 424242;
  INFO("seed " << seed);
  const std::int64_t n = 1 << 16;
  gear::select::prioritized policy{0.6, 0.4};
  gear::select::prioritized::state<gear::exec::host> st(policy, n);
  gear::slot_table t;
  t.capacity = n;
  st.on_commit(t, 0, n, gear::detail::no_stream());
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> lg(std::log(1e-4), std::log(1e4));
  std::vector<gear::key> ks(1024);
  std::vector<float> ps(1024);
  for (int round = 0; round < 10'000'000 / 1024 + 1; ++round) {
    for (std::size_t i = 0; i < ks.size(); ++i) {
      ks[i].ticket = gen() % (std::uint64_t{n} << 20);  // slot = ticket % n
      ps[i] = static_cast<float>(std::exp(lg(gen)));
    }
    st.update(t, ks, ps, gear::detail::no_stream());
  }
  long double fresh = 0;
  for (std::int64_t i = 0; i < n; ++i)
    fresh += std::pow(static_cast<long double>(st.priority(i)), 0.6L);
  const double rel = std::abs(static_cast<double>((st.total() - fresh) / fresh));
  MESSAGE("root " << st.total() << " fresh " << static_cast<double>(fresh) << " relative " << rel);
  CHECK(rel < 1e-9);
  auto rebuilt = st.nodes();
  gear::detail::sum_tree_rebuild(rebuilt.data(), st.shape());
  CHECK(rebuilt == st.nodes());
}

// ---- uniform -----------------------------------------------------------------------------------

// Review finding: uniform drew among occupied slots and redrew on holes, so 2^20 slots with 1000
// live cost 28 ms per sample instead of 0.14 ms. It draws from the dense index of committed slots
// now: one draw per row whatever the occupancy.
TEST_CASE(
    "uniform: 1000 live among 2^20 slots cost what a full buffer does; draws stay uniform "
    "(chi-square, 0.001); power check") {
  using uniform_buffer = gear::replay_buffer<spec, gear::storage::host>;
  const std::int64_t n = std::int64_t{1} << 20, live = 1000;
  uniform_buffer sparse{gear::capacity{n}, gear::max_length{1}};
  uniform_buffer full{gear::capacity{n}, gear::max_length{1}};
  const auto keys = insert_ids(sparse, 0, n);
  (void)insert_ids(full, 0, n);
  sparse.erase(std::span<const gear::key>(keys.data() + live, keys.size() - live));
  REQUIRE(sparse.size() == live);
  auto batch = sparse.make_batch(gear::batch_size{256}, gear::window_length{1});
  auto seconds = [&](uniform_buffer& buf) {
    gear::rng g{3};
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) buf.sample(batch, gear::window{.length = 1}, g);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double t_full = seconds(full), t_sparse = seconds(sparse);
  MESSAGE("200 samples of 256 rows: full " << t_full << " s, 1000 live of 2^20 " << t_sparse
                                           << " s");
  CHECK(t_sparse < 3 * t_full + 0.05);

  const std::uint64_t seed = 99;
  INFO("seed " << seed);
  gear::rng g{seed};
  auto big = sparse.make_batch(gear::batch_size{2500}, gear::window_length{1});
  std::vector<double> counts(static_cast<std::size_t>(live), 0);
  for (int call = 0; call < 400; ++call) {  // 10^6 draws
    sparse.sample(big, gear::window{.length = 1}, g);
    for (const gear::key& k : big.keys()) {
      REQUIRE(k.ticket < static_cast<std::uint64_t>(live));  // only live trajectories
      counts[static_cast<std::size_t>(k.ticket)] += 1;
    }
  }
  const std::vector<double> want(static_cast<std::size_t>(live), 1.0 / live);
  const auto fit = chi2_test(counts, want, 1e6);
  MESSAGE("chi2 " << fit.statistic << " df " << fit.df << " critical(0.001) " << fit.critical);
  CHECK_FALSE(fit.rejects());
  // Power: the same counts against a distribution 10% heavier on the first tenth.
  std::vector<double> planted(static_cast<std::size_t>(live), 1.0);
  for (std::size_t i = 0; i < 100; ++i) planted[i] = 1.1;
  const double sum = 1000 + 10;
  for (double& x : planted) x /= sum;
  CHECK(chi2_test(counts, planted, 1e6).rejects());
}

// ---- recency ----------------------------------------------------------------------------------

TEST_CASE("recency: uniform over the newest K committed (chi-square, 0.001); power check") {
  const std::uint64_t seed = 555;
  MESSAGE("recency host chi-square seed " << seed);
  const std::int64_t cap = 100, K = 37;
  recent_buffer buf{gear::capacity{cap}, gear::max_length{1}, gear::select::recency{K}};
  for (std::int32_t first : {0, 100, 200}) insert_ids(buf, first, first == 200 ? 50 : 100);
  // tickets 0..249; the newest 37 are 213..249
  std::vector<double> want(static_cast<std::size_t>(cap), 0.0), planted = want;
  for (std::uint64_t t = 250 - K; t < 250; ++t) want[t % cap] = 1.0 / K;
  for (std::uint64_t t = 250 - K - 1; t < 250; ++t) planted[t % cap] = 1.0 / (K + 1);
  gear::rng g{seed};
  double worst = 0;
  const auto counts = draw_counts(buf, g, 4096, 245, want, &worst);
  CHECK(worst < 1e-6);
  double outside = 0;
  for (std::size_t s = 0; s < want.size(); ++s)
    if (want[s] == 0) outside += counts[s];
  CHECK(outside == 0);
  std::vector<double> c, w, pl;
  for (std::size_t s = 0; s < want.size(); ++s)
    if (planted[s] > 0) c.push_back(counts[s]), w.push_back(want[s]), pl.push_back(planted[s]);
  const auto fit = chi2_test(c, w, 4096.0 * 245);
  MESSAGE("chi2 " << fit.statistic << " df " << fit.df << " critical " << fit.critical);
  CHECK_FALSE(fit.rejects());
  CHECK(chi2_test(c, pl, 4096.0 * 245).rejects());
}

// The candidates' counts and weights were Fenwick trees adjusted by deltas; they are sum trees
// recomputed from their children now: after 2 * 10^5 random inserts, erases and writers, every
// inner node equals the tree rebuilt from its leaves, the count of every window equals a scan,
// and the weight of the newest window equals a fresh fp64 sum (to 1e-12).
TEST_CASE(
    "recency: counts and weights are recomputed trees, equal to a fresh sum after 2*10^5 "
    "changes") {
  const std::int64_t cap = 1000;
  const double h = 37.5;
  recent_buffer buf{gear::capacity{cap}, gear::max_length{1}, gear::select::recency{300, h}};
  std::mt19937_64 gen(4242);
  std::vector<gear::key> keys;
  for (int step = 0; step < 200000; ++step) {
    if (gen() % 4 != 0 || keys.empty()) {
      const auto k = insert_ids(buf, 0, 1 + static_cast<std::int64_t>(gen() % 3));
      keys.insert(keys.end(), k.begin(), k.end());
    } else {
      const std::size_t i = gen() % keys.size();
      if (buf.contains(keys[i])) buf.erase(std::span<const gear::key>(&keys[i], 1));
      keys[i] = keys.back();
      keys.pop_back();
    }
    if (keys.size() > 4000) keys.erase(keys.begin(), keys.begin() + 2000);
  }
  const auto& c = buf.selection_state().committed();
  CHECK(c.counts().nodes() == c.counts().rebuilt());
  CHECK(c.weights().nodes() == c.weights().rebuilt());
  const std::uint64_t next = buf.tickets_issued();
  REQUIRE(!keys.empty());  // (their incarnation names the probes' buffer)
  for (std::uint64_t k :
       {std::uint64_t{1}, std::uint64_t{17}, std::uint64_t{300}, std::uint64_t{1000}}) {
    std::int64_t scan = 0;
    long double fresh = 0;
    for (std::uint64_t t = next - k; t < next; ++t) {
      const gear::key probe{t, 0, keys.back().incarnation};
      if (!buf.contains(probe)) continue;
      ++scan;
      fresh += std::exp2(
          static_cast<long double>(static_cast<double>(t) - static_cast<double>(c.base())) / h);
    }
    CHECK(c.count(next - k, next) == scan);
    const double rel =
        std::abs(static_cast<double>((c.weight_sum(next - k, next) - fresh) / fresh));
    INFO("window " << k << ": tree " << c.weight_sum(next - k, next) << " fresh "
                   << static_cast<double>(fresh));
    CHECK(rel < 1e-12);
  }
}

TEST_CASE("recency: pending slots are skipped and counted out; K beyond the size is all") {
  recent_buffer buf{gear::capacity{20}, gear::max_length{1}, gear::select::recency{5}};
  insert_ids(buf, 0, 12);
  auto w = buf.make_writer();  // ticket 12 pending: candidates are tickets 8..11
  gear::rng g{9};
  auto b = buf.make_batch(gear::batch_size{1000}, gear::window_length{1});
  buf.sample(b, gear::window{1}, g);
  for (int r = 0; r < 1000; ++r) {
    REQUIRE(b.slots_data()[r] >= 8);
    REQUIRE(b.slots_data()[r] <= 11);
    REQUIRE(b.probabilities_data()[r] == doctest::Approx(0.25));
  }
  std::int32_t v = 7;
  w.append(&v);
  w.commit();
  buf.selection_state().set_newest(1000);
  buf.sample(b, gear::window{1}, g);
  for (int r = 0; r < 1000; ++r) REQUIRE(b.probabilities_data()[r] == doctest::Approx(1.0 / 13));
  CHECK(gear_test::code_of([&] { buf.selection_state().set_newest(0); }) ==
        gear::errc::invalid_argument);
}

// Issue "Core v2", row 3: 300 committed, then 300 newer reservations left open (writers), with a
// half-life of 4: a draw from the whole window hits a committed slot with probability about
// 2^-75, so the landed core spun 2^30 times and returned no row. Now each row falls back to an
// exact scan after 64 misses: every row is a committed candidate, drawn with P(t) proportional
// to 2^(t / 4) (chi-square at 0.001; the same test rejects a planted uniform distribution).
TEST_CASE("recency: open writers on the newest tickets neither hang a draw nor bias it") {
  recent_buffer buf{gear::capacity{1000}, gear::max_length{1},
                    gear::select::recency{.newest = 1000, .half_life = 4}};
  const auto keys = insert_ids(buf, 0, 300);
  const gear::reservation open = buf.reserve(300);
  (void)open;
  auto batch = buf.make_batch(gear::batch_size{1000}, gear::window_length{1});
  gear::rng g{31};
  std::vector<double> counts(300, 0.0);
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 20; ++round) {
    buf.sample(batch, gear::window{.length = 1}, g);
    for (const gear::key& k : batch.keys()) {
      REQUIRE(k.ticket < 300);
      REQUIRE(buf.contains(k));
      counts[k.ticket] += 1;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("20000 rows in " << seconds << " s");
  CHECK(seconds < 10);
  std::vector<double> p(300), uniform(300, 1.0 / 300);
  double total = 0;
  for (int t = 0; t < 300; ++t) total += p[t] = std::exp2((t - 299) / 4.0);
  for (double& x : p) x /= total;
  const auto fit = chi2_test(counts, p, 20000);
  CHECK_FALSE(fit.rejects());
  std::vector<double> planted(300, 20000.0 / 300);
  CHECK(chi2_test(planted, p, 20000).rejects());
  CHECK(chi2_test(counts, uniform, 20000).rejects());
}

TEST_CASE("recency: the host's scan table picks what recency_scan picks, for every draw") {
  // A GPU buffer's sample under max_times_sampled draws recency rows on the host; rows whose
  // draws all miss take the exact scan, there from one table per sample (binary search) where
  // recency_scan walks the window per row. Windows with pending and stale slots, four half-lives.
  std::mt19937_64 gen(17);
  const std::int64_t capacity = 64;
  std::int64_t compared = 0, mismatches = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<std::int64_t> lengths(capacity);
    std::vector<std::uint64_t> tickets(capacity);
    const std::uint64_t next = 64 + gen() % 200;
    for (std::int64_t s = 0; s < capacity; ++s) {
      // The slot's newest ticket below next; committed with probability 1/4, or (rarely) an
      // older ticket's leftover, which is no candidate.
      std::uint64_t t = next - 1 - (next - 1 - static_cast<std::uint64_t>(s)) % 64;
      if (gen() % 16 == 0 && t >= 64) t -= 64;
      tickets[static_cast<std::size_t>(s)] = t;
      lengths[static_cast<std::size_t>(s)] = gen() % 4 == 0 ? 1 : 0;
    }
    gear::slot_table t{};
    t.capacity = capacity;
    t.lengths = lengths.data();
    t.tickets = tickets.data();
    gear::detail::recency_window w;
    w.size = 1 + gen() % 64;
    w.first = next - w.size;
    const double half_lives[] = {0, 1.0 / 1024, 3, 40};
    w.half_life = half_lives[trial % 4];
    gear::detail::recency_scan_table table;
    table.build(t, w);
    for (int i = 0; i < 200; ++i) {
      const double u = i == 0 ? 0.0 : i == 1 ? 1.0 - 0x1p-53 : gear::detail::unit_interval(gen());
      ++compared;
      mismatches += table.pick(u) != gear::detail::recency_scan(t, w, u);
    }
  }
  MESSAGE(compared << " draws compared");
  CHECK(mismatches == 0);
}

// Review finding E10: p^alpha overflowing to infinity made every row take one leaf; underflowing
// to 0 made a positive priority undrawable. Both are refused, and nothing changes.
TEST_CASE("prioritized: priorities whose p^alpha leaves the double range are refused") {
  per_buffer buf{gear::capacity{4}, gear::max_length{1}, gear::select::prioritized{10.0, 0.4}};
  const auto keys = insert_ids(buf, 0, 4);
  const std::vector<float> huge{1e38f}, tiny{1e-35f};
  const double total = buf.selection_state().total();
  CHECK(gear_test::code_of([&] { buf.update_priorities(std::vector<gear::key>{keys[0]}, huge); }) ==
        gear::errc::invalid_priority);
  CHECK(gear_test::code_of([&] { buf.update_priorities(std::vector<gear::key>{keys[1]}, tiny); }) ==
        gear::errc::invalid_priority);
  CHECK(buf.selection_state().total() == total);
  CHECK(buf.selection_state().priority(0) == 1.0f);
  const auto r = buf.update_priorities(std::vector<gear::key>{keys[2]}, std::vector<float>{2.0f});
  CHECK(r.applied == 1);
  // Among several pairs the error names the first bad one, whichever way it is bad (only the
  // extremes are raised to alpha, then the pairs are searched from the first).
  const auto first_bad = [&](std::vector<float> p) -> std::string {
    try {
      buf.update_priorities(std::vector<gear::key>(keys.begin(), keys.end()), p);
    } catch (const gear::error& e) {
      return e.code() == gear::errc::invalid_priority ? e.what() : "another code";
    }
    return "accepted";
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const double before = buf.selection_state().total();
  CHECK(first_bad({2.0f, 1e-35f, 1e38f, 3.0f}).find("priority 1 is") != std::string::npos);
  CHECK(first_bad({2.0f, 1e38f, 1e-35f, 3.0f}).find("priority 1 is") != std::string::npos);
  CHECK(first_bad({2.0f, 3.0f, nan, 1e38f}).find("priority 2 is") != std::string::npos);
  CHECK(first_bad({2.0f, 3.0f, 1e38f, -1.0f}).find("priority 2 is") != std::string::npos);
  CHECK(buf.selection_state().total() == before);  // refused whole: nothing changed
  for (std::int64_t slot = 0; slot < 4; ++slot)
    CHECK(buf.selection_state().priority(slot) == (slot == 2 ? 2.0f : 1.0f));
  CHECK(first_bad({0.0f, 3.0f, 4.0f, -0.0f}) == "accepted");
  CHECK(buf.selection_state().priority(0) == 0.0f);
}

namespace {

/// Samples `samples` one-row batches from a consuming buffer, committing the open writer `w`
/// (one step) after sample `commit_after`; checks the tickets returned are `want`, the buffer is
/// empty after, and the whole drain took under 3 s (linear; quadratic took far longer).
template <class Buffer, class Writer>
void drain_one_by_one(Buffer& buf, Writer& w, std::uint64_t samples, std::uint64_t commit_after,
                      const std::vector<std::uint64_t>& want) {
  auto batch = buf.make_batch(gear::batch_size{1}, gear::window_length{1});
  gear::rng g{1};
  std::vector<std::uint64_t> got;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < samples; ++i) {
    buf.sample(batch, gear::window{.length = 1}, g);
    got.push_back(batch.keys()[0].ticket);
    if (i == commit_after) {
      const std::int32_t v = -1;
      w.append(&v);
      (void)w.commit();
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MESSAGE("drained " << samples << " one by one in " << seconds << " s");
  CHECK(got == want);
  CHECK(buf.size() == 0);
  CHECK(seconds < 3.0);
}

}  // namespace

// Review finding E9: fifo rescanned every consumed ticket on each sample, so draining N
// trajectories one by one cost O(N^2) (32768: 3.5 s on a CI machine). Its cursor makes a drain
// O(N): 65536 one-row samples, in insertion order, with removed tickets and an open writer (which
// holds the cursor until it commits) on the way.
TEST_CASE("fifo: a drain of one row per sample is linear and keeps insertion order") {
  using fifo_buffer = gear::replay_buffer<spec, gear::storage::host, gear::select::fifo>;
  constexpr std::uint64_t n = 65536, half = n / 2;
  fifo_buffer buf{gear::capacity{static_cast<std::int64_t>(n) + 1}, gear::max_length{1}};
  (void)insert_ids(buf, 0, static_cast<std::int64_t>(half));
  auto w = buf.make_writer();  // ticket `half`, pending: the cursor stops there
  (void)insert_ids(buf, static_cast<std::int32_t>(half), static_cast<std::int64_t>(half));
  // The oldest committed first: 0 .. half - 1, then half + 1 (the writer's ticket is pending);
  // the writer commits then, so it is the oldest: half, then half + 2 .. n.
  std::vector<std::uint64_t> want;
  for (std::uint64_t t = 0; t < half; ++t) want.push_back(t);
  want.push_back(half + 1);
  want.push_back(half);
  for (std::uint64_t t = half + 2; t <= n; ++t) want.push_back(t);
  drain_one_by_one(buf, w, n + 1, half, want);
}

// lifo scanned down past every removed ticket above the newest live one on each sample, so a
// one-by-one drain of N cost O(N^2). Its skip links make it O(N): 65537 one-row samples, newest
// first, with an open writer (pending, skipped until it commits) in the middle.
TEST_CASE("lifo: a drain of one row per sample is linear and returns the newest first") {
  using lifo_buffer = gear::replay_buffer<spec, gear::storage::host, gear::select::lifo>;
  constexpr std::uint64_t n = 65536, half = n / 2;
  lifo_buffer buf{gear::capacity{static_cast<std::int64_t>(n) + 1}, gear::max_length{1}};
  (void)insert_ids(buf, 0, static_cast<std::int64_t>(half));
  auto w = buf.make_writer();  // ticket `half`, pending
  (void)insert_ids(buf, static_cast<std::int32_t>(half), static_cast<std::int64_t>(half));
  // n .. half + 1; then, the writer still pending, half - 1 .. half - 11; it commits and is the
  // newest: half; then half - 12 .. 0.
  std::vector<std::uint64_t> want;
  for (std::uint64_t t = n; t > half; --t) want.push_back(t);
  for (std::uint64_t t = half - 1; t >= half - 11; --t) want.push_back(t);
  want.push_back(half);
  for (std::uint64_t t = half - 11; t-- > 0;) want.push_back(t);
  drain_one_by_one(buf, w, n + 1, half + 10, want);
}

// fifo's cursor and lifo's skip links (both moved on by on_consumed after a sample's removal)
// against a model: random inserts, erases, open and committed writers and samples of 1 to 6 rows;
// every sample must return the oldest (newest) live tickets, oldest (newest) first.
TEST_CASE_TEMPLATE(
    "fifo and lifo: the cursor and the skip links agree with a model under random "
    "inserts, erases, writers and samples",
    Policy, gear::select::fifo, gear::select::lifo) {
  constexpr bool oldest_first = std::is_same_v<Policy, gear::select::fifo>;
  gear::replay_buffer<spec, gear::storage::host, Policy> buf{gear::capacity{64},
                                                             gear::max_length{1}};
  select_test::queue_world<decltype(buf)> world{buf, {}, {}};
  std::mt19937_64 gen(17);
  gear::rng g{2};
  int samples = 0;
  for (int step = 0; step < 20000; ++step) {
    if (gen() % 6 != 5) {
      world.change(gen);
    } else {
      const auto rows = static_cast<std::int64_t>(1 + gen() % 6);
      if (static_cast<std::int64_t>(world.live.size()) < rows) continue;
      auto batch = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
      buf.sample(batch, gear::window{.length = 1}, g);
      for (std::int64_t r = 0; r < rows; ++r) {
        CHECK(batch.keys()[static_cast<std::size_t>(r)].ticket == world.next(oldest_first));
        world.live.erase(world.next(oldest_first));
      }
      ++samples;
    }
    REQUIRE(buf.size() == static_cast<std::int64_t>(world.live.size()));
  }
  CHECK(samples > 1000);
}

// A new alpha recomputes every leaf from the stored priorities: one whose p^alpha would leave
// the range (infinite, or 0 for p > 0) is refused before anything changes, as an update would be.
TEST_CASE("prioritized: set_exponents refuses an alpha that takes a stored priority out of range") {
  per_buffer buf{gear::capacity{8}, gear::max_length{1}, gear::select::prioritized{1.0, 0.4}};
  const auto keys = insert_ids(buf, 0, 4);
  buf.update_priorities(std::vector<gear::key>{keys[0], keys[1]},
                        std::vector<float>{1e30f, 1e-30f});
  auto& st = buf.selection_state();
  const double total = st.total();
  const auto nodes = st.nodes();
  auto refused = [&](double alpha) {
    const auto code = gear_test::code_of([&] { st.set_exponents(alpha, 0.5); });
    CHECK(code == gear::errc::invalid_argument);
    CHECK(st.alpha() == 1.0);
    CHECK(st.beta() == doctest::Approx(0.4));
    CHECK(st.total() == total);
    CHECK(st.nodes() == nodes);
  };
  refused(20.0);               // (1e30)^20 = 1e600: infinite
  refused(12.0);               // (1e-30)^12 = 1e-360: underflows to 0 for a positive priority
  st.set_exponents(2.0, 0.5);  // (1e30)^2 and (1e-30)^2 are in range: accepted
  CHECK(st.alpha() == 2.0);
  CHECK(st.total() == doctest::Approx(1e60 + 1e-60 + 2.0));  // two entered at priority 1 (1^2)
  auto batch = buf.make_batch(gear::batch_size{16}, gear::window_length{1});
  gear::rng g{8};
  buf.sample(batch, gear::window{.length = 1}, g);
  for (const gear::key& k : batch.keys()) CHECK(k == keys[0]);  // the 1e60 leaf takes every draw
}

// Bad input is refused before anything is enqueued: it never makes the buffer unusable (only a
// failure to enqueue after a change does).
TEST_CASE("prioritized: refused updates leave the buffer usable and unchanged") {
  per_buffer buf{gear::capacity{8}, gear::max_length{1}, gear::select::prioritized{1.0, 0.4}};
  const auto keys = insert_ids(buf, 0, 8);
  const double total = buf.selection_state().total();
  gear::key other = keys[0];
  other.shard = 3;
  CHECK(gear_test::code_of([&] {
          buf.update_priorities(std::vector<gear::key>{keys[1]}, std::vector<float>{std::nanf("")});
        }) == gear::errc::invalid_priority);
  CHECK(gear_test::code_of([&] {
          buf.update_priorities(std::vector<gear::key>{other}, std::vector<float>{1.0f});
        }) == gear::errc::key_out_of_range);
  CHECK(gear_test::code_of([&] {
          buf.update_priorities(std::vector<gear::key>{keys[1], keys[2]}, std::vector<float>{1.0f});
        }) == gear::errc::invalid_argument);
  CHECK(buf.selection_state().total() == total);
  auto batch = buf.make_batch(gear::batch_size{4}, gear::window_length{1});
  gear::rng g{3};
  CHECK_NOTHROW(buf.sample(batch, gear::window{.length = 1}, g));
  const auto r = buf.update_priorities(std::vector<gear::key>{keys[1]}, std::vector<float>{5.0f});
  CHECK(r.applied == 1);
  CHECK(buf.selection_state().priority(keys[1].slot(8)) == 5.0f);
}

TEST_CASE(
    "recency weights: rebases that visit only the slots weighted since and the newest tickets "
    "leave every leaf equal to a full recomputation's, through evictions, removals, late "
    "commits and half-life changes") {
  using gear::detail::committed_slots;
  constexpr std::int64_t capacity = 2000;
  std::mt19937_64 gen(91);
  committed_slots c(capacity);
  // The reference: every weight recomputed over every slot at each rebase.
  std::vector<int> flag(capacity, 0);
  std::vector<std::uint64_t> ticket_of(capacity, 0);
  std::vector<double> want(capacity, 0.0);
  double h = 0;
  std::uint64_t base = 0, next = 0, seen = 0;
  auto weight = [&](std::uint64_t t) {
    return std::exp2((static_cast<double>(t) - static_cast<double>(base)) / h);
  };
  auto rebase = [&](std::uint64_t at) {
    base = at;
    const auto span = static_cast<std::uint64_t>(std::min(1100.0 * h, 1e18));
    for (std::int64_t s = 0; s < capacity; ++s)
      want[std::size_t(s)] =
          h > 0 && flag[std::size_t(s)] != 0 && ticket_of[std::size_t(s)] + span >= at
              ? weight(ticket_of[std::size_t(s)])
              : 0.0;
  };
  auto set = [&](std::uint64_t t, bool committed) {
    c.set(t, 1, committed);
    const auto s = static_cast<std::size_t>(t % capacity);
    seen = std::max(seen, t + 1);
    if (flag[s] == int(committed)) return;
    flag[s] = committed;
    if (committed) ticket_of[s] = t;
    if (h > 0) want[s] = committed ? weight(t) : 0.0;
  };
  std::vector<std::uint64_t> pending;
  std::int64_t rebases = 0, mismatches = 0, checks = 0;
  // 1.75: more slots weighted between two rebases than the capacity (the whole tree cleared).
  // 1/1024: a span of one ticket, whose weight (2^-1024) is still above 0.
  for (const double half_life : {0.01, 0.7, 1.75, 3.0, 0.0, 0.3, 500.0, 0.05, 1.0 / 1024}) {
    h = half_life;
    c.set_half_life(h);
    rebase(seen);
    for (int op = 0; op < 4000; ++op) {
      const unsigned kind = static_cast<unsigned>(gen() % 10);
      if (kind < 6) {  // a reservation: evicts the slot's occupant, commits now or later
        const std::uint64_t t = next++;
        const auto s = static_cast<std::size_t>(t % capacity);
        if (flag[s] != 0) set(ticket_of[s], false);
        if (gen() % 4 == 0)
          pending.push_back(t);
        else
          set(t, true);
      } else if (kind < 8 && !pending.empty()) {  // a late commit (a writer's), if still its slot
        const std::size_t i = gen() % pending.size();
        const std::uint64_t t = pending[i];
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        if (t + capacity >= next) set(t, true);
      } else if (next > 0) {  // a removal of one of the newest tickets, if committed
        const std::uint64_t t = next - 1 - gen() % std::min<std::uint64_t>(next, capacity);
        if (flag[std::size_t(t % capacity)] != 0 && ticket_of[std::size_t(t % capacity)] == t)
          set(t, false);
      }
      const std::uint64_t before = c.base();
      c.keep_in_range(next);
      if (c.base() != before) {
        ++rebases;
        rebase(next);
      }
      for (std::int64_t s = 0; s < capacity && h > 0; ++s, ++checks)
        mismatches += c.weights().at(std::size_t(s)) != want[std::size_t(s)];
      if (h > 0) REQUIRE(c.weights().nodes() == c.weights().rebuilt());
    }
  }
  MESSAGE(rebases << " rebases, " << checks << " leaves compared");
  CHECK(rebases > 400);
  CHECK(mismatches == 0);
}

// ---- the dense index, kept only for policies that read it ---------------------------------------

namespace {

template <bool WithoutIndex>
struct dense_declaration {};
template <>
struct dense_declaration<true> {
  static constexpr bool reads_dense = false;
};

/// Takes the committed slots in slot order, cyclically (found from the lengths), and records the
/// table's dense index as each select sees it. `WithoutIndex` declares `reads_dense = false`.
template <bool WithoutIndex>
struct dense_probe : dense_declaration<WithoutIndex> {
  template <class Space>
  class state {
   public:
    state(const dense_probe&, std::int64_t) {}
    void validate(const gear::slot_table&, std::int64_t) const {}
    void select(const gear::slot_table& t, const gear::selection_request& r, cuda::stream_ref) {
      seen_dense = t.dense;
      listed = t.dense != nullptr ? std::vector<std::int64_t>(t.dense, t.dense + t.live)
                                  : std::vector<std::int64_t>{};
      committed.clear();
      for (std::int64_t s = 0; s < t.occupied; ++s)
        if (t.lengths[s] > 0) committed.push_back(s);
      for (std::int64_t row = 0; row < r.batch; ++row) {
        r.slots[row] = committed[static_cast<std::size_t>(row) % committed.size()];
        r.probabilities[row] = 1.0f / static_cast<float>(committed.size());
        r.weights[row] = 1.0f;
      }
    }
    const std::int64_t* seen_dense = nullptr;
    std::vector<std::int64_t> listed, committed;
  };
};

}  // namespace

// prioritized reads the index where every priority is 0 (its uniform fallback).
static_assert(gear::dense_reading<gear::select::uniform> &&
              gear::dense_reading<gear::select::prioritized> &&
              gear::dense_reading<dense_probe<false>>);  // undeclared: the index is kept
static_assert(!gear::dense_reading<gear::select::recency> &&
              !gear::dense_reading<gear::select::fifo> &&
              !gear::dense_reading<gear::select::lifo> && !gear::dense_reading<dense_probe<true>>);
// The queue and the stack move past what they returned once it is removed (the model test above
// checks what they return then).
static_assert(gear::consumed_hook<gear::select::fifo::state<gear::exec::host>> &&
              gear::consumed_hook<gear::select::lifo::state<gear::exec::host>>);

TEST_CASE_TEMPLATE(
    "the dense index: kept for a policy that may read it, null for one that reads "
    "none, samples the same either way",
    Probe, dense_probe<false>, dense_probe<true>) {
  constexpr bool indexed = gear::dense_reading<Probe>;
  gear::replay_buffer<spec, gear::storage::host, Probe> buf{gear::capacity{8}, gear::max_length{1}};
  const auto keys = insert_ids(buf, 0, 8);
  (void)insert_ids(buf, 8, 2);               // ids 0 and 1 evicted
  buf.erase(std::span(keys).subspan(4, 2));  // ids 4 and 5: slots 4 and 5
  auto b = buf.make_batch(gear::batch_size{12}, gear::window_length{1});
  gear::rng g{3};
  buf.sample(b, gear::window{1}, g);
  const auto& st = buf.selection_state();
  CHECK(st.committed == std::vector<std::int64_t>{0, 1, 2, 3, 6, 7});
  if constexpr (indexed) {
    REQUIRE(st.seen_dense != nullptr);
    auto listed = st.listed;
    std::sort(listed.begin(), listed.end());
    CHECK(listed == st.committed);
  } else {
    CHECK(st.seen_dense == nullptr);
  }
  // Slot s holds id s + 8 for s < 2 (the second lap), id s otherwise.
  for (std::int64_t r = 0; r < 12; ++r) {
    const std::int64_t slot = b.slots_data()[r];
    CHECK(slot == st.committed[static_cast<std::size_t>(r % 6)]);
    CHECK(reinterpret_cast<const std::int32_t*>(b.column_data(0))[r] ==
          (slot < 2 ? slot + 8 : slot));
  }
}

// A consuming policy derived from fifo whose select sometimes picks its own row, not through
// fifo's choice: the buffer must remove the row it returned, not the runs fifo chose before
// (gear::host_chosen_runs are taken only where they match the rows).
struct fifo_with_own_pick {
  static constexpr bool consumes = true;
  static constexpr bool reads_dense = false;
  template <class Space>
  struct state : gear::select::fifo::template state<Space> {
    bool own = false;
    state(const fifo_with_own_pick&, std::int64_t capacity)
        : gear::select::fifo::template state<Space>(gear::select::fifo{}, capacity) {}
    void select(const gear::slot_table& t, const gear::selection_request& r, cuda::stream_ref s) {
      if (!own) return gear::select::fifo::template state<Space>::select(t, r, s);
      for (std::uint64_t k = t.next_ticket; k-- > 0;) {  // the newest committed slot
        const auto slot = static_cast<std::int64_t>(k % static_cast<std::uint64_t>(t.capacity));
        if (t.host_lengths[slot] > 0) {
          r.slots[0] = slot;
          break;
        }
      }
      r.probabilities[0] = r.weights[0] = 1.0f;
    }
  };
};

TEST_CASE("a consuming policy whose select picks its own rows removes those rows") {
  gear::replay_buffer<spec, gear::storage::host, fifo_with_own_pick> buf{gear::capacity{8},
                                                                         gear::max_length{1}};
  insert_ids(buf, 0, 6);
  auto b = buf.make_batch(gear::batch_size{1}, gear::window_length{1});
  gear::rng g{1};
  buf.sample(b, gear::window{.length = 1}, g);  // through fifo: ticket 0, removed
  CHECK(b.keys()[0].ticket == 0);
  CHECK(buf.size() == 5);
  buf.selection_state().own = true;
  buf.sample(b, gear::window{.length = 1}, g);  // its own pick: ticket 5
  const gear::key picked = b.keys()[0];
  CHECK(picked.ticket == 5);
  CHECK(buf.size() == 4);
  CHECK(!buf.contains(picked));
}
