// Host suite, second part: removal (erase, max_times_sampled, queues), age-weighted recency, and
// every error, each leaving the buffer as it was.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <type_traits>
#include <utility>

#include <gear/rank_sampler.hpp>

#include "host_common.hpp"

using namespace host_test;

// ---- removal: erase, max_times_sampled, queues ------------------------------------------------

TEST_CASE("erase removes trajectories: stale keys, never sampled, errors change nothing") {
  host_buffer buf{gear::capacity{8}, gear::max_length{3}};
  model m;
  const auto keys = insert(buf, m, {1, 2, 3, 1, 2});
  const std::vector<gear::key> gone{keys[1], keys[3]};
  buf.erase(gone);
  CHECK(buf.size() == 3);
  CHECK(!buf.contains(keys[1]));
  CHECK(!buf.contains(keys[3]));
  CHECK(buf.length(keys[1].slot(8)) == 0);
  CHECK(buf.ticket(keys[1].slot(8)) == keys[1].ticket);  // emptied, not reserved again
  auto out = buf.make_batch(gear::batch_size{1000}, gear::window_length{1});
  gear::rng g{3};
  buf.sample(out, gear::window{}, g);
  for (auto k : out.keys()) CHECK((k == keys[0] || k == keys[2] || k == keys[4]));
  expect_error(buf, gear::errc::stale_key, [&] { buf.erase(gone); });
  const std::vector<gear::key> twice{keys[0], keys[4], keys[0]};
  const std::string what = expect_error(buf, gear::errc::stale_key, [&] { buf.erase(twice); });
  CHECK_MESSAGE(what.find("key (ticket 0) is named twice") != std::string::npos, what);
  const std::vector<gear::key> unissued{keys[0], {99, 0, keys[0].incarnation}};  // not issued
  expect_error(buf, gear::errc::stale_key, [&] { buf.erase(unissued); });
  const std::vector<gear::key> mixed{keys[0], {keys[2].ticket, 1, keys[0].incarnation}};
  expect_error(buf, gear::errc::key_out_of_range, [&] { buf.erase(mixed); });
  const std::vector<gear::key> reborn{keys[0], {keys[2].ticket, 0, keys[0].incarnation + 1}};
  expect_error(buf, gear::errc::key_out_of_range, [&] { buf.erase(reborn); });
  // The ring reuses erased slots when it reaches them: tickets 5..9 take slots 5, 6, 7, 0, 1,
  // evicting keys[0] (slot 0) and refilling erased slot 1.
  insert(buf, m, {1, 1, 1, 1, 1});
  CHECK(buf.size() == 7);
  CHECK(!buf.contains(keys[0]));
  CHECK(buf.contains(keys[2]));
  CHECK(!buf.contains(keys[1]));  // its slot holds ticket 9 now; the key stays stale
  CHECK(buf.ticket(1) == 9);
  CHECK(buf.length(1) == 1);
}

/// Drains `buf` (samples of `rows` rows, at most `calls`) and checks that it ends empty with each
/// of its `count` trajectories returned exactly `k` times.
template <class Buffer>
void check_drained(Buffer& buf, const model& m, std::int64_t rows, int calls, std::size_t count,
                   std::int64_t k) {
  const auto seen = drain(buf, m, rows, calls);
  CHECK(buf.size() == 0);
  CHECK(seen.size() == count);
  for (auto [id, n] : seen) CHECK(n == k);
}

TEST_CASE("max_times_sampled: each trajectory returned exactly k times, then removed") {
  SUBCASE("k = 1 without replacement drains every trajectory once") {
    host_buffer buf{gear::capacity{64}, gear::max_length{1}, gear::select::uniform{false}};
    model m;
    insert(buf, m, std::vector<std::int64_t>(50, 1));
    buf.set_max_times_sampled(1);
    check_drained(buf, m, 10, 100, 50, 1);
  }
  SUBCASE("k = 3 with replacement, one row at a time") {
    host_buffer buf{gear::capacity{32}, gear::max_length{1}};
    model m;
    insert(buf, m, std::vector<std::int64_t>(20, 1));
    buf.set_max_times_sampled(3);
    check_drained(buf, m, 1, 1000, 20, 3);
  }
  SUBCASE("with prioritized selection: removed trajectories lose their priority") {
    gear::replay_buffer<spec, gear::storage::host, gear::select::prioritized> buf{
        gear::capacity{32}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
    model m;
    packed p(1, std::vector<std::int64_t>(20, 1));
    std::vector<gear::key> keys(20);
    buf.insert(p.input(), keys);
    for (std::size_t i = 0; i < 20; ++i) m.record(keys[i], p.ids[i], 1);
    std::vector<float> priorities(20);
    for (std::size_t i = 0; i < 20; ++i) priorities[i] = 0.5f + static_cast<float>(i);
    CHECK(buf.update_priorities(keys, priorities) == gear::priority_update_result{20, 0});
    buf.set_max_times_sampled(2);
    check_drained(buf, m, 1, 1000, 20, 2);
  }
  SUBCASE("with recency selection") {
    gear::replay_buffer<spec, gear::storage::host, gear::select::recency> buf{
        gear::capacity{32}, gear::max_length{1}, gear::select::recency{8}};
    model m;
    insert(buf, m, std::vector<std::int64_t>(8, 1));
    buf.set_max_times_sampled(1);
    const auto seen = drain(buf, m, 1, 1000);
    CHECK(buf.size() == 0);
    CHECK(seen.size() == 8);
  }
  SUBCASE("a negative limit is refused") {
    host_buffer buf{gear::capacity{4}, gear::max_length{1}};
    CHECK(code_of([&] { buf.set_max_times_sampled(-1); }) == gear::errc::invalid_argument);
    CHECK(buf.max_times_sampled() == 0);
  }
}

TEST_CASE("max_times_sampled: a slot reserved again starts counting from zero") {
  host_buffer buf{gear::capacity{1}, gear::max_length{1}};
  model m;
  insert(buf, m, {1});
  buf.set_max_times_sampled(3);
  auto out = buf.make_batch(gear::batch_size{1}, gear::window_length{1});
  gear::rng g{4};
  buf.sample(out, gear::window{}, g);
  buf.sample(out, gear::window{}, g);
  REQUIRE(buf.times_sampled(0) == 2);
  std::vector<gear::key> fresh(1);
  SUBCASE("by a reservation, then its commit") {
    const gear::reservation r = buf.reserve(1);  // evicts the trajectory returned twice
    CHECK(buf.times_sampled(0) == 0);
    buf.commit(r, std::vector<std::int64_t>{1}, fresh);
  }
  SUBCASE("by an insert") {
    fresh = insert(buf, m, {1});  // evicts the trajectory returned twice
    CHECK(buf.times_sampled(0) == 0);
  }
  buf.sample(out, gear::window{}, g);
  CHECK(buf.times_sampled(0) == 1);
  CHECK(buf.contains(fresh[0]));  // returned once of three times: still stored
  CHECK(buf.size() == 1);
}

TEST_CASE("max_times_sampled: a trajectory removed at its limit keeps its count") {
  host_buffer buf{gear::capacity{2}, gear::max_length{1}};
  model m;
  const std::vector<gear::key> keys = insert(buf, m, {1});
  buf.set_max_times_sampled(3);
  auto out = buf.make_batch(gear::batch_size{2}, gear::window_length{1});
  gear::rng g{5};
  buf.sample(out, gear::window{}, g);  // two rows of the one trajectory
  CHECK(buf.times_sampled(0) == 2);
  CHECK(buf.contains(keys[0]));
  buf.sample(out, gear::window{}, g);  // returned four times: removed by this batch
  CHECK(buf.times_sampled(0) == 4);
  CHECK_FALSE(buf.contains(keys[0]));
  CHECK(buf.size() == 0);
}

TEST_CASE("max_times_sampled: counts are kept when the limit changes; none made without one") {
  host_buffer buf{gear::capacity{2}, gear::max_length{1}};
  model m;
  gear::rng g{6};
  auto one = buf.make_batch(gear::batch_size{1}, gear::window_length{1});
  auto two = buf.make_batch(gear::batch_size{2}, gear::window_length{1});
  const gear::key a = insert(buf, m, {1})[0];  // the only trajectory: every row returns it
  buf.set_max_times_sampled(5);
  buf.sample(two, gear::window{}, g);
  CHECK(buf.times_sampled(0) == 2);
  buf.set_max_times_sampled(0);  // no limit: returns are not counted
  buf.sample(one, gear::window{}, g);
  CHECK(buf.times_sampled(0) == 2);
  buf.set_max_times_sampled(3);  // the count made under the old limit stands
  buf.sample(one, gear::window{}, g);
  CHECK(buf.times_sampled(0) == 3);
  CHECK_FALSE(buf.contains(a));
  // A limit lowered below a count: the trajectory goes at its next return, not before.
  const gear::key b = insert(buf, m, {1})[0];
  buf.set_max_times_sampled(5);
  buf.sample(two, gear::window{}, g);
  buf.sample(one, gear::window{}, g);
  CHECK(buf.times_sampled(b.slot(2)) == 3);
  buf.set_max_times_sampled(2);
  CHECK(buf.contains(b));
  buf.sample(one, gear::window{}, g);
  CHECK(buf.times_sampled(b.slot(2)) == 4);
  CHECK_FALSE(buf.contains(b));
}

TEST_CASE_TEMPLATE("fifo and lifo return each trajectory once, in order", Policy,
                   gear::select::fifo, gear::select::lifo) {
  constexpr bool oldest_first = std::is_same_v<Policy, gear::select::fifo>;
  gear::replay_buffer<spec, gear::storage::host, Policy> buf{gear::capacity{16},
                                                             gear::max_length{6}};
  model m;
  std::mt19937_64 gen(8);
  std::vector<std::uint64_t> order;  // ids in the order the policy must return them
  std::vector<std::uint64_t> stored;
  auto add = [&](std::size_t n) {
    const auto first = m.next_id;
    packed p(first, random_lengths(gen, n, 6));
    m.next_id += n;
    std::vector<gear::key> keys(n);
    buf.insert(p.input(), keys);
    for (std::size_t i = 0; i < n; ++i) {
      m.record(keys[i], p.ids[i], p.lengths[i]);
      stored.push_back(p.ids[i]);
    }
  };
  auto take = [&](std::int64_t rows) {
    auto out = buf.make_batch(gear::batch_size{rows}, gear::window_length{6});
    gear::rng g{1};
    const gear::window w{6};
    buf.sample(out, w, g);
    const host_batch h = copy_host_batch(out);
    REQUIRE(m.check(h, w).empty());
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::uint64_t want = oldest_first ? stored.front() : stored.back();
      CHECK(m.id(h.keys[r]) == want);
      CHECK(h.probabilities[r] == 1.0f);
      if (oldest_first)
        stored.erase(stored.begin());
      else
        stored.pop_back();
    }
  };
  add(5);
  take(2);
  add(3);
  take(4);
  CHECK(buf.size() == 2);
  auto out = buf.make_batch(gear::batch_size{3}, gear::window_length{6});
  gear::rng g{1};
  expect_error(buf, gear::errc::not_enough_items, [&] { buf.sample(out, gear::window{6}, g); });
  take(2);
  CHECK(buf.size() == 0);
}

// ---- age-weighted recency --------------------------------------------------------------------

namespace {
/// Counts over 10^6 rows of an age-weighted recency buffer against the exact distribution
/// (weights 2^(-age / h) over the committed among the newest K); returns {chi2, df, critical}.
/// wrong_h != 0 tests the same counts against a planted wrong half-life instead.
template <class Buffer, class Sample>
std::tuple<double, double, double> decay_chi2(Buffer& buf, const model& m, std::int64_t K, double h,
                                              double wrong_h, Sample&& sample) {
  std::map<std::uint64_t, double> counts;  // by ticket-ordered id
  double rows = 0;
  for (int call = 0; call < 100; ++call) {
    const host_batch out = sample();
    for (const auto& k : out.keys) {
      counts[m.id(k)] += 1;
      rows += 1;
    }
  }
  // Ids were inserted in ticket order, one per ticket: age = newest id - id.
  const std::uint64_t newest = m.next_id - 1;
  std::vector<double> observed, expected, weights;
  double total = 0;
  for (std::uint64_t id = newest + 1 - static_cast<std::uint64_t>(K); id <= newest; ++id) {
    const bool live =
        m.by_key.end() != std::find_if(m.by_key.begin(), m.by_key.end(), [&](auto& kv) {
          return kv.second.first == id && buf.contains(m.key_of(kv.first));
        });
    const double w =
        live ? std::exp2(-static_cast<double>(newest - id) / (wrong_h ? wrong_h : h)) : 0;
    if (!live) {
      REQUIRE(counts[id] == 0);
      continue;
    }
    observed.push_back(counts[id]);
    weights.push_back(w);
    total += w;
  }
  for (double w : weights) expected.push_back(rows * w / total);
  const auto [stat, df] = pooled_chi2(observed, expected);
  return {stat, df, chi2_critical_0001(df)};
}
}  // namespace

TEST_CASE("recency weighted by age: chi-square at 0.001 over 10^6 draws, power, probabilities") {
  using buffer = gear::replay_buffer<spec, gear::storage::host, gear::select::recency>;
  for (double h : {40.0, 0.75}) {  // 0.75: the weights are rebased every 384 insertions
    CAPTURE(h);
    const std::int64_t K = 250;
    buffer buf{gear::capacity{400}, gear::max_length{1}, gear::select::recency{K, h}};
    model m;
    for (int i = 0; i < 1000; ++i) insert(buf, m, {1});  // one ticket per id; ring wraps twice
    std::vector<gear::key> holes;
    for (auto& [ticket, v] : m.by_key)
      if (v.first % 7 == 3 && buf.contains(m.key_of(ticket)))
        holes.push_back(m.key_of(ticket));
    buf.erase(holes);
    auto out = buf.make_batch(gear::batch_size{10000}, gear::window_length{1});
    const std::uint64_t seed = 4711;
    INFO("seed " << seed);
    gear::rng g{seed};
    auto sample = [&] {
      buf.sample(out, gear::window{}, g);
      return copy_host_batch(out);
    };
    const auto [stat, df, crit] = decay_chi2(buf, m, K, h, 0, sample);
    MESSAGE("age-weighted recency h = " << h << ": chi2 = " << stat << ", df " << df
                                        << ", critical " << crit);
    CHECK(stat < crit);
    if (h > 1) {  // power: the same test rejects a half-life 10% off
      gear::rng g2{seed};
      auto sample2 = [&] {
        buf.sample(out, gear::window{}, g2);
        return copy_host_batch(out);
      };
      const auto [bad, bad_df, bad_crit] = decay_chi2(buf, m, K, h, 1.1 * h, sample2);
      CHECK(bad > bad_crit);
    }
    // Reported probabilities equal w_i / sum of the candidates' weights.
    const host_batch h1 = sample();
    double total = 0;
    const std::uint64_t newest = m.next_id - 1;
    for (auto& [ticket, v] : m.by_key)
      if (buf.contains(m.key_of(ticket)) && newest - v.first < std::uint64_t(K))
        total += std::exp2(-static_cast<double>(newest - v.first) / h);
    for (std::size_t r = 0; r < 100; ++r) {
      const double w = std::exp2(-static_cast<double>(newest - m.id(h1.keys[r])) / h);
      CHECK(h1.probabilities[r] == doctest::Approx(w / total).epsilon(1e-5));
    }
  }
  CHECK(code_of([] {
          buffer b{gear::capacity{4}, gear::max_length{1}, gear::select::recency{4, -1.0}};
        }) == gear::errc::invalid_argument);
}

TEST_CASE(
    "recency with the newest tickets pending far past the candidates: finite probabilities, "
    "draws by the exact law (weights relative to the newest candidate)") {
  // 300 committed, ticket 300 reserved and committed last, 600 reserved after it and pending:
  // the weights' base moves past ticket 900 while every candidate lies 600 and more below it,
  // 1200 half-lives: relative to the base they all underflow.
  using buffer = gear::replay_buffer<spec, gear::storage::host, gear::select::recency>;
  const double h = 0.5;
  buffer buf{gear::capacity{1000}, gear::max_length{1}, gear::select::recency{1000, h}};
  model m;
  for (int i = 0; i < 300; ++i) insert(buf, m, {1});
  const gear::reservation late = buf.reserve(1);
  const gear::reservation pending = buf.reserve(600);
  const std::int64_t one[] = {1};
  gear::key k{};
  buf.commit(late, one, std::span<gear::key>(&k, 1));
  auto out = buf.make_batch(gear::batch_size{4000}, gear::window_length{1});
  gear::rng g{99};
  buf.sample(out, gear::window{}, g);
  const host_batch b = copy_host_batch(out);
  // The law: ticket 300 - a weighs 2^(-a / h) = 4^-a, so P(300) = 3/4 / (1 - 4^-301) ~ 3/4.
  std::int64_t newest = 0, next = 0, older = 0;
  for (std::size_t r = 0; r < 4000; ++r) {
    const double want = 0.75 * std::pow(0.25, double(300 - b.keys[r].ticket));
    REQUIRE(std::isfinite(b.probabilities[r]));
    CHECK(b.probabilities[r] == doctest::Approx(want).epsilon(1e-5));
    (b.keys[r].ticket == 300 ? newest : b.keys[r].ticket == 299 ? next : older) += 1;
  }
  // Counts against 3000 / 750 / 250 expected (4000 rows): chi-square, 2 degrees of freedom, at
  // significance 0.001 (critical 13.82); the newest alone every time (the old limit) gives 1333.
  const double chi2 = std::pow(newest - 3000.0, 2) / 3000 + std::pow(next - 750.0, 2) / 750 +
                      std::pow(older - 250.0, 2) / 250;
  MESSAGE("newest " << newest << ", next " << next << ", older " << older << ": chi2 " << chi2);
  CHECK(chi2 < 13.82);
  (void)pending;
}

// ---- errors: each one named, each leaves the buffer as it was
// ------------------------------------

TEST_CASE("bad input: a gear::error with its code, and the buffer unchanged") {
  host_buffer buf{gear::capacity{8}, gear::max_length{6}};
  model m;
  auto out1 = buf.make_batch(gear::batch_size{4}, gear::window_length{3});
  gear::rng g{1};

  SUBCASE("sampling an empty buffer") {
    expect_error(buf, gear::errc::empty_buffer, [&] { buf.sample(out1, gear::window{3}, g); });
    CHECK(g.calls() == 0);
  }

  const auto keys = insert(buf, m, {6, 5, 4});
  packed good(500, {2});

  SUBCASE("more rows without replacement than trajectories") {
    host_buffer nr{gear::capacity{8}, gear::max_length{6}, gear::select::uniform{false}};
    model m2;
    insert(nr, m2, {2, 2});
    auto out = nr.make_batch(gear::batch_size{3}, gear::window_length{1});
    expect_error(nr, gear::errc::not_enough_items, [&] { nr.sample(out, gear::window{}, g); });
    CHECK(g.calls() == 0);
  }
  SUBCASE("stale key") {
    insert(buf, m, {1, 1, 1, 1, 1, 1});  // evicts keys[0]
    const std::string what =
        expect_error(buf, gear::errc::stale_key, [&] { buf.check_key(keys[0]); });
    CHECK_MESSAGE(what.find("key (ticket 0, slot 0) names a trajectory no longer stored") !=
                      std::string::npos,
                  what);
  }
  const std::uint32_t ours = keys[0].incarnation;  // the buffer's own (each buffer has one)
  SUBCASE("key of a ticket not issued yet, or of no trajectory") {
    expect_error(buf, gear::errc::stale_key, [&] { buf.check_key({8, 0, ours}); });
    expect_error(buf, gear::errc::stale_key, [&] { buf.check_key({3, 0, ours}); });
    expect_error(buf, gear::errc::stale_key, [&] { buf.check_key({gear::no_ticket, 0, ours}); });
  }
  SUBCASE("key out of range: shard") {
    expect_error(buf, gear::errc::key_out_of_range, [&] { buf.check_key({0, 3, ours}); });
  }
  SUBCASE("key out of range: incarnation") {
    expect_error(buf, gear::errc::key_out_of_range, [&] { buf.check_key({0, 0, ours + 1}); });
  }
  SUBCASE("a key of another buffer: refused by every call, never taken for this buffer's") {
    host_buffer other{gear::capacity{8}, gear::max_length{6}};
    model mo;
    const auto theirs = insert(other, mo, {2, 2, 2});  // the same tickets as keys[0..2]
    CHECK(theirs[0].ticket == keys[0].ticket);
    CHECK(theirs[0].incarnation != ours);
    CHECK(!buf.contains(theirs[0]));
    expect_error(buf, gear::errc::key_out_of_range, [&] { buf.check_key(theirs[0]); });
    expect_error(buf, gear::errc::key_out_of_range,
                 [&] { buf.erase(std::span<const gear::key>(theirs.data(), 1)); });
    CHECK(other.size() == 3);
  }
  SUBCASE("key of a pending slot") {
    const auto r = buf.reserve(1);
    expect_error(buf, gear::errc::stale_key,
                 [&] { buf.check_key({r.first_ticket, 0, ours}); });
  }
  SUBCASE("slot out of range") {
    expect_error(buf, gear::errc::key_out_of_range, [&] { (void)buf.length(-1); });
  }
  SUBCASE("empty trajectory") {
    packed p(600, {2, 0});
    std::vector<gear::key> k(2);
    expect_error(buf, gear::errc::empty_trajectory, [&] { buf.insert(p.input(), k); });
  }
  SUBCASE("trajectory longer than max_length") {
    packed p(600, {2, 7});
    std::vector<gear::key> k(2);
    expect_error(buf, gear::errc::trajectory_too_long, [&] { buf.insert(p.input(), k); });
  }
  SUBCASE("wrong element type") {
    auto in = good.input();
    in.columns[1] = gear::input(reinterpret_cast<const float*>(good.columns[1].data()));
    std::vector<gear::key> k(1);
    expect_error(buf, gear::errc::wrong_type, [&] { buf.insert(in, k); });
  }
  SUBCASE("wrong per-step shape") {
    auto in = good.input();
    in.columns[0] = gear::input(reinterpret_cast<const float*>(good.columns[0].data()), {3, 2});
    std::vector<gear::key> k(1);
    expect_error(buf, gear::errc::wrong_shape, [&] { buf.insert(in, k); });
  }
  SUBCASE("wrong rank") {
    auto in = good.input();
    in.columns[3] = gear::input(reinterpret_cast<const std::uint8_t*>(good.columns[3].data()));
    std::vector<gear::key> k(1);
    expect_error(buf, gear::errc::wrong_shape, [&] { buf.insert(in, k); });
  }
  SUBCASE("null column pointer") {
    auto in = good.input();
    in.columns[2].data = nullptr;
    std::vector<gear::key> k(1);
    expect_error(buf, gear::errc::null_pointer, [&] { buf.insert(in, k); });
  }
  SUBCASE("misaligned column pointer") {
    auto in = good.input();
    in.columns[0].data = good.columns[0].data() + 2;
    std::vector<gear::key> k(1);
    expect_error(buf, gear::errc::misaligned_pointer, [&] { buf.insert(in, k); });
  }
  SUBCASE("device source into host storage") {
    auto in = good.input();
    in.source = gear::memory_kind::device;
    std::vector<gear::key> k(1);
    expect_error(buf, gear::errc::wrong_memory, [&] { buf.insert(in, k); });
  }
  SUBCASE("too many trajectories for the capacity") {
    packed p(600, std::vector<std::int64_t>(9, 1));
    std::vector<gear::key> k(9);
    expect_error(buf, gear::errc::invalid_argument, [&] { buf.insert(p.input(), k); });
  }
  SUBCASE("a column's rank outside [0, max_rank]") {
    for (const int rank : {-1, 7, 1000}) {
      auto bad = good.input();
      bad.columns[0].rank = rank;
      std::vector<gear::key> k(good.lengths.size());
      const std::string what =
          expect_error(buf, gear::errc::wrong_shape, [&] { buf.insert(bad, k); });
      CHECK(what.find("rank " + std::to_string(rank)) != std::string::npos);
    }
  }
  SUBCASE("spans whose data is null but whose size is not 0") {
    std::vector<gear::key> k(good.lengths.size());
    const std::span<gear::key> no_keys(static_cast<gear::key*>(nullptr), k.size());
    expect_error(buf, gear::errc::null_pointer, [&] { buf.insert(good.input(), no_keys); });
    const std::span<const gear::key> erased(static_cast<const gear::key*>(nullptr), 1);
    expect_error(buf, gear::errc::null_pointer, [&] { buf.erase(erased); });
    const auto r = buf.reserve(1);
    const std::span<const std::int64_t> no_lengths(static_cast<const std::int64_t*>(nullptr), 1);
    std::vector<gear::key> one(1);
    expect_error(buf, gear::errc::null_pointer, [&] { buf.commit(r, no_lengths, one); });
  }
  SUBCASE("keys_out too small") {
    std::vector<gear::key> k;
    expect_error(buf, gear::errc::invalid_argument, [&] { buf.insert(good.input(), k); });
  }
  SUBCASE("empty window") {
    auto out0 = buf.make_batch(gear::batch_size{4}, gear::window_length{3});
    expect_error(buf, gear::errc::empty_window, [&] { buf.sample(out0, gear::window{0}, g); });
  }
  SUBCASE("window offset beyond max_length") {
    expect_error(buf, gear::errc::window_out_of_range, [&] {
      buf.sample(out1, gear::window{3, 6}, g);
    });
  }
  SUBCASE("negative window offset") {
    expect_error(buf, gear::errc::window_out_of_range, [&] {
      buf.sample(out1, gear::window{3, -1}, g);
    });
  }
  SUBCASE("batch made for another window length") {
    expect_error(buf, gear::errc::batch_mismatch, [&] { buf.sample(out1, gear::window{4}, g); });
    CHECK(g.calls() == 0);
  }
  SUBCASE("batch moved from") {
    auto taken = std::move(out1);
    expect_error(buf, gear::errc::batch_mismatch, [&] { buf.sample(out1, gear::window{3}, g); });
    CHECK(g.calls() == 0);
  }
  SUBCASE("writer past max_length") {
    auto w = buf.make_writer();
    const float obs[6] = {};
    const std::int32_t a = 0;
    const bool d = false;
    const std::uint8_t img[64] = {};
    for (int t = 0; t < 6; ++t) w.append(obs, &a, &d, img);
    const fingerprint before = take_fingerprint(buf);
    try {
      w.append(obs, &a, &d, img);
      FAIL("expected writer_full");
    } catch (const gear::error& e) {
      CHECK(e.code() == gear::errc::writer_full);
    }
    CHECK(take_fingerprint(buf) == before);
    CHECK(w.steps() == 6);
  }
  SUBCASE("writer committed with no steps") {
    auto w = buf.make_writer();
    const fingerprint before = take_fingerprint(buf);
    try {
      (void)w.commit();
      FAIL("expected empty_trajectory");
    } catch (const gear::error& e) {
      CHECK(e.code() == gear::errc::empty_trajectory);
    }
    CHECK(take_fingerprint(buf) == before);
  }
  SUBCASE("commit of an overwritten reservation") {
    const auto r = buf.reserve(2);
    insert(buf, m, {1, 1, 1, 1, 1, 1, 1, 1});  // a full lap takes both slots over
    std::vector<gear::key> k(2);
    const std::vector<std::int64_t> lens{1, 1};
    expect_error(buf, gear::errc::invalid_reservation, [&] { buf.commit(r, lens, k); });
  }
  SUBCASE("commit of a reservation partly taken over") {
    const auto r = buf.reserve(2);          // tickets 3, 4 in slots 3, 4
    insert(buf, m, {1, 1, 1, 1, 1, 1, 1});  // ticket 11 takes slot 3 over, slot 4 stays pending
    CHECK(buf.ticket(3) == 11);
    CHECK(buf.ticket(4) == 4);
    std::vector<gear::key> k(2);
    const std::vector<std::int64_t> lens{1, 1};
    expect_error(buf, gear::errc::invalid_reservation, [&] { buf.commit(r, lens, k); });
    CHECK(buf.length(4) == 0);
    CHECK(k == std::vector<gear::key>(2));
  }
  SUBCASE("commit of another buffer's reservation") {
    // Both buffers have tickets 3 and 4 pending in slots 3 and 4: only the buffer id tells the
    // reservations apart.
    host_buffer other{gear::capacity{8}, gear::max_length{6}};
    model mo;
    insert(other, mo, {1, 1, 1});
    const auto theirs = other.reserve(2);
    const auto ours = buf.reserve(2);
    CHECK(theirs.first_ticket == ours.first_ticket);
    CHECK(theirs.count == ours.count);
    CHECK(theirs.capacity == ours.capacity);
    CHECK(theirs.buffer != ours.buffer);
    const std::vector<std::int64_t> lens{2, 3};
    std::vector<gear::key> k(2, gear::key{77, 7, 7});
    const std::string what =
        expect_error(buf, gear::errc::invalid_reservation, [&] { buf.commit(theirs, lens, k); });
    CHECK_MESSAGE(what.find("another buffer") != std::string::npos, what);
    CHECK(k == std::vector<gear::key>(2, gear::key{77, 7, 7}));  // keys_out not written
    CHECK(buf.size() == 3);
    for (const auto& key : keys) CHECK(buf.contains(key));
    CHECK(buf.length(3) == 0);
    CHECK(buf.length(4) == 0);
    // The other buffer is untouched too, and each reservation still commits where it was made.
    CHECK(other.size() == 3);
    other.commit(theirs, lens, k);
    CHECK(other.size() == 5);
    CHECK(other.length(4) == 3);
    CHECK(buf.size() == 3);
    buf.commit(ours, lens, k);
    CHECK(buf.size() == 5);
    CHECK(k[1].ticket == 4);
  }
  SUBCASE("commit twice") {
    const auto r = buf.reserve(1);
    std::vector<gear::key> k(1);
    const std::vector<std::int64_t> lens{1};
    buf.commit(r, lens, k);
    expect_error(buf, gear::errc::invalid_reservation, [&] { buf.commit(r, lens, k); });
  }
  SUBCASE("commit with the wrong number of lengths") {
    const auto r = buf.reserve(2);
    std::vector<gear::key> k(2);
    const std::vector<std::int64_t> lens{1};
    expect_error(buf, gear::errc::invalid_argument, [&] { buf.commit(r, lens, k); });
  }
  SUBCASE("reserve more than capacity") {
    expect_error(buf, gear::errc::invalid_argument, [&] { (void)buf.reserve(9); });
  }
}

TEST_CASE("bad construction arguments") {
  CHECK(code_of([] {
          host_buffer b{gear::capacity{0}, gear::max_length{4}};
        }) == gear::errc::invalid_argument);
  CHECK(code_of([] {
          host_buffer b{gear::capacity{4}, gear::max_length{0}};
        }) == gear::errc::invalid_argument);
  CHECK(code_of([] {
          host_buffer::batch_type b(gear::memory_kind::host, gear::batch_size{0},
                                    gear::window_length{1});
        }) == gear::errc::invalid_argument);
  // Sizes whose bytes would wrap (a slot's max_length x step bytes, a batch's rows x length x
  // step bytes): refused, not made too small.
  const std::int64_t most = std::numeric_limits<std::int64_t>::max();
  for (const std::int64_t huge :
       {(std::int64_t{1} << 62) + 1, std::int64_t{1} << 62, std::int64_t{1} << 58, most}) {
    CAPTURE(huge);
    CHECK(code_of([&] {
            host_buffer b{gear::capacity{2}, gear::max_length{huge}};
          }) == gear::errc::out_of_memory);
    CHECK(code_of([&] {
            host_buffer::batch_type b(gear::memory_kind::host, gear::batch_size{4},
                                      gear::window_length{huge});
          }) == gear::errc::out_of_memory);
    CHECK(code_of([&] {
            host_buffer::batch_type b(gear::memory_kind::host, gear::batch_size{huge},
                                      gear::window_length{1});
          }) == gear::errc::out_of_memory);
  }
  CHECK(code_of([] {
          (void)gear::input(static_cast<const float*>(nullptr), {1, 1, 1, 1, 1, 1, 1});
        }) == gear::errc::wrong_shape);
}

TEST_CASE("a buffer moved from: every call throws errc::invalid_argument; the one moved into "
          "holds everything, a rank_sampler of the old one refuses") {
  host_buffer a{gear::capacity{8}, gear::max_length{4}};
  model m;
  (void)insert(a, m, {2, 2, 2, 2});
  gear::rank_sampler<host_buffer> ranks(a, gear::rank_count{1}, gear::batch_size{2},
                                        gear::window{1}, gear::rng{1});
  auto w = a.make_writer();  // writers hold the buffer's state, not the buffer
  host_buffer b{std::move(a)};
  auto out = b.make_batch(gear::batch_size{2}, gear::window_length{1});
  gear::rng g{1};
  const auto moved = [](auto&& call) {
    const std::string what = [&] {
      try {
        call();
      } catch (const gear::error& e) {
        CHECK(e.code() == gear::errc::invalid_argument);
        return std::string(e.what());
      }
      return std::string("no error");
    }();
    CHECK_MESSAGE(what.find("moved from") != std::string::npos, what);
  };
  moved([&] { (void)a.size(); });
  moved([&] { (void)a.capacity(); });
  moved([&] { (void)a.contains(gear::key{}); });
  moved([&] { a.sample(out, gear::window{}, g); });
  moved([&] { (void)a.make_writer(); });
  moved([&] { a.set_max_times_sampled(2); });
  moved([&] { (void)insert(a, m, {2}); });
  moved([&] {
    auto r = ranks.make_batch();
    ranks.sample(0, r);
  });
  CHECK(g.calls() == 0);
  // The buffer moved into holds the four trajectories and takes the writer's commit.
  CHECK(b.size() == 4);
  b.sample(out, gear::window{}, g);
  const std::int32_t a0 = 1;
  const float obs[6] = {};
  const bool d = false;
  const std::uint8_t img[64] = {};
  w.append(obs, &a0, &d, img);
  (void)w.commit();
  CHECK(b.size() == 5);
}
