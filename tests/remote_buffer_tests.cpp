// The distributed buffer through replay_buffer itself (<gear/distributed.hpp>): shards
// (replay_buffer<..., transport::libfabric> with host storage) and a client (storage::none) in one
// process, each on its own endpoint, over loopback (tcp;ofi_rxm, shm). What is checked:
//   - keys: a shard's keys, local or remote, name its id and its incarnation (never 0), and the
//     other side accepts them (a local sample's key updated remotely, a remote insert's key erased
//     locally);
//   - insert, writer: every trajectory is stored once, at the shard the routing says (round robin,
//     by hash: the same bytes, the same shard), with its bytes;
//   - sample: every row holds the bytes of the trajectory its key names;
//   - update_priorities and erase land on the shard each key names; stale keys are counted;
//   - bad input is refused before anything moves, the shards unchanged (sizes, tickets);
//   - a shard that is gone makes the client's next call throw errc::peer_lost, naming it, within
//     its deadline.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <gear/distributed.hpp>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "process_common.hpp"
#include "remote_common.hpp"

namespace {

using remote_test::spec;
using selection = gear::select::prioritized;
using shard_t =
    gear::replay_buffer<spec, gear::storage::host, selection, gear::transport::libfabric>;
using client_t =
    gear::replay_buffer<spec, gear::storage::none, selection, gear::transport::libfabric>;
constexpr std::int64_t max_length = 6;
using clock_type = std::chrono::steady_clock;

using remote_test::obs_of;
/// Trajectories of ids `ids` (trajectory i of length 1 + i % max_length).
struct packed : remote_test::packed {
  explicit packed(const std::vector<std::int64_t>& ids) : remote_test::packed(ids, max_length) {}
};

gear::transport::libfabric shard_transport(const std::string& provider, std::uint32_t id) {
  gear::transport::libfabric t;
  t.fabric.provider = provider;
  t.shard = id;
  t.token = "remote-buffer-test";
  t.block_bytes = 4096;
  t.max_ring_blocks = 16;
  return t;
}

gear::transport::libfabric client_transport(const std::string& provider,
                                            const std::vector<const shard_t*>& shards) {
  gear::transport::libfabric t;
  t.fabric.provider = provider;
  t.token = "remote-buffer-test";
  t.deadline = std::chrono::milliseconds(5000);
  t.ring_blocks = 16;
  t.max_batch = 64;
  t.max_window = max_length;
  for (const shard_t* s : shards) t.shards.push_back(s->address());
  return t;
}

/// What a shard shows from outside: its size and next ticket.
std::pair<std::int64_t, std::uint64_t> observe(const shard_t& s) {
  return {s.size(), s.tickets_issued()};
}

void check_rows(const client_t::batch_type& b, const std::map<std::uint64_t, std::int64_t>& ids,
                const std::vector<const shard_t*>& shards) {
  for (std::int64_t r = 0; r < b.batch_size(); ++r) {
    const gear::key k = b.keys_data()[r];
    REQUIRE(k.shard < shards.size());
    CHECK(k.incarnation == shards[k.shard]->incarnation());
    const std::uint64_t tag = (std::uint64_t{k.shard} << 56) ^ k.ticket;
    REQUIRE(ids.count(tag) == 1);
    const std::int64_t id = ids.at(tag);
    CHECK(b.column<0>()(r, 0) == id);
    CHECK(b.column<1>()(r, 0, 2) == obs_of(id, 0, 2));
  }
}

void round_trip(const std::string& provider) {
  const auto start = clock_type::now();
  shard_t s0(gear::capacity{32}, gear::max_length{max_length}, selection{},
             shard_transport(provider, 0));
  shard_t s1(gear::capacity{32}, gear::max_length{max_length}, selection{},
             shard_transport(provider, 1));
  const std::vector<const shard_t*> shards{&s0, &s1};
  CHECK(s0.incarnation() != 0);
  CHECK(s1.incarnation() != 0);
  client_t client(client_transport(provider, shards));
  CHECK(client.capacity() == 64);
  CHECK(client.max_length() == max_length);
  CHECK(client.shard_count() == 2);

  std::map<std::uint64_t, std::int64_t> ids;  // (shard, ticket) -> the trajectory's id
  auto remember = [&](const gear::key& k, std::int64_t id) {
    ids[(std::uint64_t{k.shard} << 56) ^ k.ticket] = id;
  };

  // Remote inserts, round robin: 4 to each shard, keys naming shard and incarnation.
  const packed first({0, 1, 2, 3, 4, 5, 6, 7});
  std::vector<gear::key> keys(8);
  client.insert(first.view(), keys);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CHECK(keys[i].shard == i % 2);
    CHECK(keys[i].incarnation == shards[i % 2]->incarnation());
    CHECK(shards[i % 2]->contains(keys[i]));
    remember(keys[i], static_cast<std::int64_t>(i));
  }
  CHECK(s0.size() == 4);
  CHECK(s1.size() == 4);

  // A local insert on a shard: its key names the shard too, and the client samples it.
  const packed local({40});
  gear::key local_key;
  s1.insert(local.view(), std::span<gear::key>(&local_key, 1));
  CHECK(local_key.shard == 1);
  CHECK(local_key.incarnation == s1.incarnation());
  remember(local_key, 40);

  // A writer: steps gather at the client, the trajectory lands at commit.
  auto w = client.make_writer();
  for (std::int64_t s = 0; s < 3; ++s) {
    const std::int64_t id = 50;
    float obs[4];
    for (int k = 0; k < 4; ++k) obs[k] = obs_of(50, s, k);
    w.append(&id, obs);
  }
  const gear::key written = w.commit();
  CHECK(shards[written.shard]->contains(written));
  CHECK(shards[written.shard]->length(written.slot(32)) == 3);
  remember(written, 50);
  CHECK(client.size() == 10);

  // Samples: every row holds the bytes of the trajectory its key names.
  auto b = client.make_batch(gear::batch_size{32}, gear::window_length{1});
  gear::rng g{7};
  for (int i = 0; i < 10; ++i) {
    client.sample(b, gear::window{1, 0}, g);
    check_rows(b, ids, shards);
  }
  client.sample_begin(b, gear::window{1, 0}, g);
  client.sample_end(b);
  check_rows(b, ids, shards);
  CHECK(client.stats().samples == 11);
  CHECK(client.stats().sampled_rows == 11 * 32);
  // As many in flight as allowed, ended out of order (the middle ones first, reply areas
  // reused while others are in flight); one more, or a second into the same batch, is refused.
  constexpr std::size_t most = gear::transport::max_samples_in_flight;
  std::vector<decltype(b)> many;
  for (std::size_t i = 0; i <= most; ++i)
    many.push_back(
        client.make_batch(gear::batch_size{std::int64_t(8 + 8 * i)}, gear::window_length{1}));
  for (std::size_t i = 0; i < most; ++i) client.sample_begin(many[i], gear::window{1, 0}, g);
  for (int round = 0; round < 5; ++round) {
    CHECK_THROWS_AS(client.sample_begin(many[most], gear::window{1, 0}, g), gear::error);
    CHECK_THROWS_AS(client.sample_end(many[most]), gear::error);
    CHECK_THROWS_AS(client.sample_begin(many[0], gear::window{1, 0}, g), gear::error);
    for (std::size_t i = 1; i < most; ++i) {  // the later ones, then the first: out of order
      client.sample_end(many[i]);
      check_rows(many[i], ids, shards);
      client.sample_begin(many[i], gear::window{1, 0}, g);
    }
    client.sample_end(many[0]);
    check_rows(many[0], ids, shards);
    client.sample_begin(many[0], gear::window{1, 0}, g);
  }
  for (std::size_t i = 0; i < most; ++i) {
    client.sample_end(many[i]);
    check_rows(many[i], ids, shards);
  }

  // Priorities, remotely, for keys of both shards and the local one; then a key a shard's own
  // sample returned, updated by the client.
  const std::vector<gear::key> to_update{keys[0], keys[1], local_key};
  const std::vector<float> priorities{3.0f, 5.0f, 7.0f};
  const auto applied = client.update_priorities(to_update, priorities);
  CHECK(applied.applied == 3);
  CHECK(applied.stale == 0);
  auto lb = s0.make_batch(gear::batch_size{4}, gear::window_length{1});
  s0.sample(lb, gear::window{1, 0}, g);
  CHECK(lb.keys_data()[0].incarnation == s0.incarnation());
  const float p9 = 9.0f;
  CHECK(client
            .update_priorities(std::span<const gear::key>(lb.keys_data(), 1),
                               std::span<const float>(&p9, 1))
            .applied == 1);

  // Erase, remotely: removed at its shard; again, stale; a key of the shard's earlier
  // incarnation, stale.
  gear::key old = keys[2];
  old.incarnation ^= 1;
  const auto erased = client.erase(std::vector<gear::key>{keys[2], keys[3]});
  CHECK(erased.applied == 2);
  CHECK_FALSE(s0.contains(keys[2]));
  CHECK_FALSE(s1.contains(keys[3]));
  const auto again = client.erase(std::vector<gear::key>{keys[2], old});
  CHECK(again.applied == 0);
  CHECK(again.stale == 2);
  // A key named twice is removed once and stale the second time.
  const auto doubled = client.erase(std::vector<gear::key>{keys[5], keys[5]});
  CHECK(doubled.applied == 1);
  CHECK(doubled.stale == 1);
  CHECK_FALSE(s1.contains(keys[5]));
  CHECK(client.stats().erased == 3);
  // And a remote insert's key erased locally, at its shard.
  s0.erase(std::span<const gear::key>(&keys[4], 1));
  CHECK_FALSE(s0.contains(keys[4]));
  CHECK(client.size() == 6);

  // Routing by hash: the same trajectory goes to the same shard, from any client.
  auto th = client_transport(provider, shards);
  th.route = gear::transport::routing::by_hash;
  client_t hashed(th);
  const packed twice({21});
  gear::key h1, h2;
  hashed.insert(twice.view(), std::span<gear::key>(&h1, 1));
  hashed.insert(twice.view(), std::span<gear::key>(&h2, 1));
  CHECK(h1.shard == h2.shard);
  CHECK(h1.ticket != h2.ticket);

  // Routing local first: to the shards on this host, in turn; to every shard in turn when none is
  // (a blob names its shard's host: here shard 1's, then both, say another).
  const auto elsewhere = [](const std::vector<std::byte>& blob) {
    auto b = gear::detail::remote::parse_blob(blob).value;
    b.hostname = "elsewhere";
    return gear::detail::remote::encode(b);
  };
  auto tl = client_transport(provider, shards);
  tl.route = gear::transport::routing::local_first;
  tl.shards[1] = elsewhere(tl.shards[1]);
  const packed four({31, 32, 33, 34});
  std::vector<gear::key> routed(4);
  {
    client_t local(tl);
    local.insert(four.view(), routed);
    for (const gear::key& k : routed) CHECK(k.shard == 0);
    tl.shards[0] = elsewhere(tl.shards[0]);
  }
  client_t nowhere_local(tl);
  nowhere_local.insert(four.view(), routed);
  CHECK(routed[0].shard != routed[1].shard);
  CHECK(routed[0].shard == routed[2].shard);
  CHECK(routed[1].shard == routed[3].shard);
  CHECK(clock_type::now() - start < std::chrono::seconds(60));
}

void bad_input(const std::string& provider) {
  shard_t s0(gear::capacity{16}, gear::max_length{max_length}, selection{},
             shard_transport(provider, 0));
  const std::vector<const shard_t*> shards{&s0};
  client_t client(client_transport(provider, shards));
  const packed some({1, 2, 3});
  std::vector<gear::key> keys(3);
  client.insert(some.view(), keys);
  const auto before = observe(s0);

  // Construction: no shards, a blob that does not parse, a bad block size, a shard id past 4095.
  auto none = client_transport(provider, {});
  CHECK_THROWS_WITH_AS((client_t{none}), doctest::Contains("at least one shard"), gear::error);
  auto garbled = client_transport(provider, shards);
  garbled.shards[0].resize(5);
  CHECK_THROWS_AS((client_t{garbled}), gear::error);
  // Exponents that would weigh every row wrong (the client computes the weights).
  for (const double bad : {std::nan(""), -1.0, std::numeric_limits<double>::infinity()}) {
    CHECK_THROWS_WITH_AS((client_t{client_transport(provider, shards), selection{0.6, bad}}),
                         doctest::Contains("beta"), gear::error);
    CHECK_THROWS_WITH_AS((client_t{client_transport(provider, shards), selection{bad, 0.4}}),
                         doctest::Contains("alpha"), gear::error);
  }
  auto block = shard_transport(provider, 3);
  block.block_bytes = 5000;
  try {
    shard_t bad(gear::capacity{4}, gear::max_length{2}, selection{}, block);
    FAIL("a block size that is not a power of two was taken");
  } catch (const gear::error& e) {
    CHECK(e.code() == gear::errc::invalid_argument);
    CHECK(std::string(e.what()).find("block_bytes") != std::string::npos);
  }

  auto expect = [&](gear::errc code, auto&& call) {
    try {
      call();
      FAIL("no error");
    } catch (const gear::error& e) {
      CHECK(e.code() == code);
    }
    CHECK(observe(s0) == before);
  };
  // Inserts: keys_out too small, an empty or too long trajectory.
  std::vector<gear::key> two(2);
  expect(gear::errc::invalid_argument, [&] { client.insert(some.view(), two); });
  std::int64_t lengths[] = {0};
  expect(gear::errc::empty_trajectory, [&] {
    gear::trajectories<spec> t{lengths,
                               {gear::input(some.id.data()), gear::input(some.obs.data(), {4})}};
    client.insert(t, two);
  });
  const packed long_one({max_length - 1});
  std::vector<std::int64_t> too_long{max_length + 1};
  std::vector<std::int64_t> id(max_length + 1, 0);
  std::vector<float> obs(4 * (max_length + 1), 0);
  expect(gear::errc::trajectory_too_long, [&] {
    gear::trajectories<spec> t{too_long, {gear::input(id.data()), gear::input(obs.data(), {4})}};
    client.insert(t, two);
  });
  // Columns: null, wrong type, wrong shape; device memory; by hash too (it reads the bytes).
  for (auto route : {gear::transport::routing::round_robin, gear::transport::routing::by_hash}) {
    auto rt = client_transport(provider, shards);
    rt.route = route;
    client_t routed(rt);
    std::vector<gear::key> three(3);
    gear::trajectories<spec> t = some.view();
    t.columns[1].data = nullptr;
    expect(gear::errc::null_pointer, [&] { routed.insert(t, three); });
    t = some.view();
    t.columns[1].type = gear::dtype::f64;
    expect(gear::errc::wrong_type, [&] { routed.insert(t, three); });
    t = some.view();
    t.columns[1].shape[0] = 5;
    expect(gear::errc::wrong_shape, [&] { routed.insert(t, three); });
    t = some.view();
    t.source = gear::memory_kind::device;
    expect(gear::errc::wrong_memory, [&] { routed.insert(t, three); });
    const std::int64_t bad_lengths[] = {1, -3, 1};
    t = some.view();
    t.lengths = bad_lengths;
    expect(gear::errc::empty_trajectory, [&] { routed.insert(t, three); });
  }
  // Writers: nothing to commit, past max_length.
  auto w = client.make_writer();
  expect(gear::errc::empty_trajectory, [&] { (void)w.commit(); });
  float step[4] = {};
  std::int64_t one = 1;
  for (std::int64_t s = 0; s < max_length; ++s) w.append(&one, step);
  expect(gear::errc::writer_full, [&] { w.append(&one, step); });
  // Samples: more rows than max_batch, a window longer than the batch's.
  auto big = client.make_batch(gear::batch_size{65}, gear::window_length{1});
  gear::rng g{3};
  expect(gear::errc::invalid_argument, [&] { client.sample(big, gear::window{1, 0}, g); });
  auto b = client.make_batch(gear::batch_size{4}, gear::window_length{1});
  expect(gear::errc::batch_mismatch, [&] { client.sample(b, gear::window{2, 0}, g); });
  // Windows the shards refuse are refused here, sending nothing (they waited for the deadline,
  // threw peer_lost and left the batch unusable).
  expect(gear::errc::window_out_of_range,
         [&] { client.sample(b, gear::window{1, max_length}, g); });
  expect(gear::errc::window_out_of_range,
         [&] { client.sample(b, gear::window{1, 0, static_cast<gear::anchor>(9)}, g); });
  auto longer = client.make_batch(gear::batch_size{4}, gear::window_length{max_length + 1});
  const auto asked = clock_type::now();
  expect(gear::errc::window_out_of_range,
         [&] { client.sample(longer, gear::window{max_length + 1, 0}, g); });
  CHECK(clock_type::now() - asked < std::chrono::milliseconds(500));
  client.sample(b, gear::window{1, 0}, g);  // the batch still takes a good window
  expect(gear::errc::null_pointer, [&] {
    (void)client.erase(std::span<const gear::key>(static_cast<const gear::key*>(nullptr), 1));
  });
  auto wide = client_transport(provider, shards);  // slices whose bytes would not fit in 2^62
  wide.max_window = std::int64_t{1} << 60;
  expect(gear::errc::invalid_argument, [&] {
    client_t huge{wide};
    huge.sample(b, gear::window{1, 0}, g);  // (the learner is made at the first sample)
  });
  auto moved = client.make_batch(gear::batch_size{4}, gear::window_length{1});
  auto taken = std::move(moved);  // holds no memory
  expect(gear::errc::batch_mismatch, [&] { client.sample(moved, gear::window{1, 0}, g); });
  // Updates and erases: a key of a shard the client does not know, a NaN priority, sizes.
  gear::key elsewhere = keys[0];
  elsewhere.shard = 9;
  const float p[] = {1.0f, 1.0f};
  expect(gear::errc::key_out_of_range, [&] {
    (void)client.update_priorities(std::vector<gear::key>{keys[0], elsewhere}, p);
  });
  const float nan[] = {std::nanf("")};
  expect(gear::errc::invalid_priority,
         [&] { (void)client.update_priorities(std::span<const gear::key>(keys.data(), 1), nan); });
  expect(gear::errc::invalid_argument,
         [&] { (void)client.update_priorities(std::span<const gear::key>(keys.data(), 1), p); });
  expect(gear::errc::key_out_of_range, [&] {
    (void)client.erase(std::vector<gear::key>{keys[0], elsewhere});
  });
  CHECK(s0.contains(keys[0]));
  // The shard itself: a key of another incarnation is not its own.
  gear::key other = keys[1];
  other.incarnation ^= 1;
  expect(gear::errc::key_out_of_range, [&] { s0.erase(std::span<const gear::key>(&other, 1)); });
  CHECK(s0.contains(keys[1]));
}

void shard_lost(const std::string& provider) {
  auto s0 = std::make_unique<shard_t>(gear::capacity{16}, gear::max_length{max_length}, selection{},
                                      shard_transport(provider, 0));
  shard_t s1(gear::capacity{16}, gear::max_length{max_length}, selection{},
             shard_transport(provider, 1));
  auto t = client_transport(provider, {s0.get(), &s1});
  t.deadline = std::chrono::milliseconds(1500);
  client_t client(t);
  const packed some({1, 2});
  std::vector<gear::key> keys(2);
  client.insert(some.view(), keys);
  auto b = client.make_batch(gear::batch_size{8}, gear::window_length{1});
  gear::rng g{5};
  client.sample(b, gear::window{1, 0}, g);
  s0.reset();  // shard 0 is gone
  const auto start = clock_type::now();
  try {
    for (int i = 0; i < 4; ++i) client.sample(b, gear::window{1, 0}, g);
    FAIL("sampling went on with shard 0 gone");
  } catch (const gear::error& e) {
    CHECK(e.code() == gear::errc::peer_lost);
    CHECK(std::string(e.what()).find("shard 0") != std::string::npos);
  }
  CHECK(clock_type::now() - start < std::chrono::milliseconds(4 * 1500 + 2000));
}

}  // namespace

/// A shard serving max_peers = 2: one client's actor and learner are welcomed; a second
/// client's actor is not (no welcome: errc::peer_lost by its deadline, the shard unchanged), and
/// the first goes on.
void peers_bounded(const std::string& provider) {
  auto st = shard_transport(provider, 0);
  st.max_peers = 2;
  shard_t s0(gear::capacity{8}, gear::max_length{max_length}, selection{}, st);
  const std::vector<const shard_t*> shards{&s0};
  client_t first(client_transport(provider, shards));
  const packed some({1, 2});
  std::vector<gear::key> keys(2);
  first.insert(some.view(), keys);  // its actor
  auto b = first.make_batch(gear::batch_size{4}, gear::window_length{1});
  gear::rng g{3};
  first.sample(b, gear::window{1, 0}, g);  // its learner
  const auto before = observe(s0);
  auto late = client_transport(provider, shards);
  late.deadline = std::chrono::milliseconds(500);
  client_t second(late);
  try {
    second.insert(some.view(), keys);
    FAIL("a third peer was welcomed");
  } catch (const gear::error& e) {
    CHECK(e.code() == gear::errc::peer_lost);
  }
  CHECK(observe(s0) == before);
  first.insert(some.view(), keys);
  CHECK(s0.size() == 4);
}

TEST_CASE("tcp;ofi_rxm: shards and a client, through replay_buffer") { round_trip("tcp;ofi_rxm"); }
TEST_CASE("shm: shards and a client, through replay_buffer") {
  round_trip("shm");
  CHECK(process_test::shm_leftovers(getpid()) == 0);
}
TEST_CASE("tcp;ofi_rxm: bad input is refused, the shard unchanged") { bad_input("tcp;ofi_rxm"); }
TEST_CASE("shm: bad input is refused, the shard unchanged") { bad_input("shm"); }
TEST_CASE("tcp;ofi_rxm: a lost shard is errc::peer_lost, named, within the deadline") {
  shard_lost("tcp;ofi_rxm");
}
TEST_CASE("tcp;ofi_rxm: two samples in flight each keep the masses they were split by") {
  // The split snapshot says {2, 2}; shard 0 then holds 8 when both samples select. Shard 0's rows
  // have P = (2 / 4) (1 / 8) in both samples: the first one's replies (mass 8) must not leak into
  // the second's probabilities, which would make them (8 / 4) (1 / 8).
  shard_t s0(gear::capacity{32}, gear::max_length{max_length}, selection{},
             shard_transport("tcp;ofi_rxm", 0));
  shard_t s1(gear::capacity{32}, gear::max_length{max_length}, selection{},
             shard_transport("tcp;ofi_rxm", 1));
  client_t client(client_transport("tcp;ofi_rxm", {&s0, &s1}));
  const packed four({1, 2, 3, 4});
  std::vector<gear::key> keys(4);
  client.insert(four.view(), keys);
  auto a = client.make_batch(gear::batch_size{32}, gear::window_length{1});
  auto b = client.make_batch(gear::batch_size{32}, gear::window_length{1});
  gear::rng g{21};
  client.sample(a, gear::window{1, 0}, g);  // the snapshot: {2, 2}
  const packed six({5, 6, 7, 8, 9, 10});
  std::vector<gear::key> more(6);
  s0.insert(six.view(), more);
  client.sample_begin(a, gear::window{1, 0}, g);
  client.sample_begin(b, gear::window{1, 0}, g);
  client.sample_end(a);
  client.sample_end(b);
  int from_shard0 = 0;
  for (const auto* batch : {&a, &b})
    for (std::int64_t r = 0; r < 32; ++r) {
      const bool zero = batch->keys_data()[r].shard == 0;
      from_shard0 += zero;
      CHECK(batch->probabilities_data()[r] == doctest::Approx(zero ? 1.0 / 16 : 1.0 / 4));
    }
  CHECK(from_shard0 > 0);
}
/// Two shards over tcp, two trajectories each, and a client with skip_lost_shards (1.5 s
/// deadline): the skip_lost_shards tests reset s0 to lose it.
struct losing_pair {
  std::unique_ptr<shard_t> s0 =
      std::make_unique<shard_t>(gear::capacity{16}, gear::max_length{max_length}, selection{},
                                shard_transport("tcp;ofi_rxm", 0));
  shard_t s1{gear::capacity{16}, gear::max_length{max_length}, selection{},
             shard_transport("tcp;ofi_rxm", 1)};
  client_t client{[&] {
    auto t = client_transport("tcp;ofi_rxm", {s0.get(), &s1});
    t.deadline = std::chrono::milliseconds(1500);
    t.skip_lost_shards = true;
    return t;
  }()};
  std::vector<gear::key> keys = std::vector<gear::key>(4);
  losing_pair() { client.insert(packed({1, 2, 3, 4}).view(), keys); }  // two at each shard
};

TEST_CASE("tcp;ofi_rxm: with skip_lost_shards, sampling goes on over the other shards") {
  losing_pair pair;
  auto& [s0, s1, client, keys] = pair;
  auto b = client.make_batch(gear::batch_size{16}, gear::window_length{1});
  gear::rng g{9};
  client.sample(b, gear::window{1, 0}, g);
  s0.reset();
  // The sample that finds shard 0 gone cannot be completed: errc::peer_lost, naming it.
  const auto start = clock_type::now();
  bool thrown = false;
  try {
    for (int i = 0; i < 3 && !thrown; ++i) client.sample(b, gear::window{1, 0}, g);
  } catch (const gear::error& e) {
    thrown = true;
    CHECK(e.code() == gear::errc::peer_lost);
    CHECK(std::string(e.what()).find("shard 0") != std::string::npos);
  }
  CHECK(thrown);
  CHECK(clock_type::now() - start < std::chrono::milliseconds(3 * 1500 + 2000));
  // Shard 0's reply was cut off: it might still land in b, which the client samples into no more.
  try {
    client.sample(b, gear::window{1, 0}, g);
    CHECK(false);
  } catch (const gear::error& e) {
    CHECK(e.code() == gear::errc::invalid_argument);
  }
  // From then on, into another batch: shard 1 alone, each row at probability 1/2 (its two
  // trajectories, priorities equal), not the 1/4 of the union it was.
  auto b2 = client.make_batch(gear::batch_size{16}, gear::window_length{1});
  for (int i = 0; i < 5; ++i) {
    client.sample(b2, gear::window{1, 0}, g);
    for (std::int64_t r = 0; r < 16; ++r) {
      CHECK(b2.keys_data()[r].shard == 1);
      CHECK(b2.probabilities_data()[r] == doctest::Approx(0.5));
    }
  }
  // Updates and erases of shard 0's keys are stale; shard 1's land.
  const float p[] = {2.0f, 2.0f};
  const auto u = client.update_priorities(std::vector<gear::key>{keys[0], keys[1]}, p);
  CHECK(u.applied == 1);
  CHECK(u.stale == 1);
  const auto e = client.erase(std::vector<gear::key>{keys[2], keys[3]});
  CHECK(e.applied == 1);
  CHECK(e.stale == 1);
  CHECK(s1.size() == 1);
}
TEST_CASE("tcp;ofi_rxm: a shard whose priorities all fell to 0, or that was emptied, is asked "
          "again: sampling goes on over the others") {
  shard_t s0(gear::capacity{16}, gear::max_length{max_length}, selection{},
             shard_transport("tcp;ofi_rxm", 0));
  shard_t s1(gear::capacity{16}, gear::max_length{max_length}, selection{},
             shard_transport("tcp;ofi_rxm", 1));
  client_t client(client_transport("tcp;ofi_rxm", {&s0, &s1}));
  packed p({0, 1, 2, 3, 4, 5, 6, 7});
  std::vector<gear::key> keys(8);
  client.insert(p.view(), keys);  // round robin: 4 to each shard
  std::vector<gear::key> of0;
  for (const gear::key& k : keys)
    if (k.shard == 0) of0.push_back(k);
  REQUIRE(of0.size() == 4);
  auto b = client.make_batch(gear::batch_size{16}, gear::window_length{1});
  gear::rng g{3};
  client.sample(b, gear::window{1, 0}, g);  // the snapshot: both masses 4
  // Shard 0's priorities all 0: its mass is 0, a state a local buffer samples (uniformly). The
  // sample split by the old snapshot gets rows of it, drawn uniformly there and reported as drawn
  // (its reply says mass 0); from then on shard 1 alone, each row at probability 1/4.
  const std::vector<float> zeros(4, 0.0f);
  CHECK(client.update_priorities(of0, zeros).applied == 4);
  int shard0_rows_after = 0;
  for (int i = 0; i < 6; ++i) {
    client.sample(b, gear::window{1, 0}, g);  // threw transport_error ("mass") every time
    for (std::int64_t r = 0; r < 16; ++r) {
      if (i == 0) continue;
      shard0_rows_after += b.keys_data()[r].shard == 0;
      CHECK(b.probabilities_data()[r] == doctest::Approx(0.25));
    }
  }
  CHECK(shard0_rows_after == 0);
  // Shard 0's priorities back, then every trajectory of it erased at the shard: a sample split by
  // the snapshot may ask it for rows it cannot give (errc::empty_buffer, once); the next ones
  // ask its status again and draw from shard 1.
  const std::vector<float> ones(4, 1.0f);
  CHECK(client.update_priorities(of0, ones).applied == 4);
  client.sample(b, gear::window{1, 0}, g);
  client.sample(b, gear::window{1, 0}, g);  // both masses known again
  s0.erase(of0);
  CHECK(s0.size() == 0);
  int refused = 0;
  for (int i = 0; i < 6; ++i) try {
      client.sample(b, gear::window{1, 0}, g);
      for (std::int64_t r = 0; r < 16; ++r) CHECK(b.keys_data()[r].shard == 1);
    } catch (const gear::error& e) {
      CHECK(e.code() == gear::errc::empty_buffer);
      ++refused;
    }
  CHECK(refused <= 1);
}
TEST_CASE("tcp;ofi_rxm: routing by hash spreads distinct trajectories over the shards") {
  // Trajectories of two identical steps (every byte twice: an unmixed FNV-1a taken mod 2 sent
  // all 64 to one shard). Binomial(64, 1/2) gives a shard fewer than 10 with probability below
  // 1e-8.
  shard_t s0(gear::capacity{64}, gear::max_length{max_length}, selection{},
             shard_transport("tcp;ofi_rxm", 0));
  shard_t s1(gear::capacity{64}, gear::max_length{max_length}, selection{},
             shard_transport("tcp;ofi_rxm", 1));
  auto t = client_transport("tcp;ofi_rxm", {&s0, &s1});
  t.route = gear::transport::routing::by_hash;
  client_t hashed(t);
  std::vector<std::int64_t> lengths(64, 2), ids;
  std::vector<float> obs;
  for (std::int64_t i = 0; i < 64; ++i)
    for (int step = 0; step < 2; ++step) {
      ids.push_back(500 + i);
      for (int k = 0; k < 4; ++k) obs.push_back(obs_of(500 + i, 0, k));
    }
  std::vector<gear::key> spread(64);
  hashed.insert({lengths, {gear::input(ids.data()), gear::input(obs.data(), {4})}}, spread);
  std::size_t to0 = 0;
  for (const gear::key& k : spread) to0 += k.shard == 0;
  MESSAGE(to0 << " of 64 to shard 0");
  CHECK(to0 >= 10);
  CHECK(to0 <= 54);
  CHECK(s0.size() + s1.size() == 64);
}
TEST_CASE("tcp;ofi_rxm: a shard welcomes max_peers peers and no more") {
  peers_bounded("tcp;ofi_rxm");
}

TEST_CASE("tcp;ofi_rxm: with skip_lost_shards and 8 ahead, held samples end and sampling goes on") {
  losing_pair pair;
  auto& [s0, s1, client, keys] = pair;
  constexpr std::size_t ahead = gear::transport::max_samples_in_flight;
  std::vector<client_t::batch_type> b, fresh;
  for (std::size_t i = 0; i < ahead; ++i) {
    b.push_back(client.make_batch(gear::batch_size{16}, gear::window_length{1}));
    fresh.push_back(client.make_batch(gear::batch_size{16}, gear::window_length{1}));
  }
  gear::rng g{11};
  // Eight begun (the last four's requests held, then bundled), and shard 0 gone: each ends, in
  // bounded time, whole or with errc::peer_lost naming shard 0.
  for (auto& x : b) client.sample_begin(x, gear::window{1, 0}, g);
  s0.reset();
  const auto start = clock_type::now();
  int lost = 0;
  for (auto& x : b) {
    try {
      client.sample_end(x);
    } catch (const gear::error& e) {
      ++lost;
      CHECK(e.code() == gear::errc::peer_lost);
      CHECK(std::string(e.what()).find("shard 0") != std::string::npos);
    }
  }
  MESSAGE(lost << " of 8 samples in flight lost with shard 0");
  CHECK(clock_type::now() - start < std::chrono::milliseconds(ahead * 2500));
  // Then eight ahead again, into fresh batches: shard 1 alone, each row at probability 1/2.
  for (int round = 0; round < 3; ++round) {
    for (auto& x : fresh) client.sample_begin(x, gear::window{1, 0}, g);
    for (auto& x : fresh) {
      client.sample_end(x);
      for (std::int64_t r = 0; r < 16; ++r) {
        CHECK(x.keys_data()[r].shard == 1);
        CHECK(x.probabilities_data()[r] == doctest::Approx(0.5));
      }
    }
  }
}

TEST_CASE("tcp;ofi_rxm: a priority the shard cannot weigh is skipped there; the others apply") {
  // alpha 10: 1e38^10 is past float's range, which only the shard (whose alpha it is) can tell.
  const selection steep{.alpha = 10.0, .beta = 0.4};
  shard_t s0(gear::capacity{8}, gear::max_length{max_length}, steep,
             shard_transport("tcp;ofi_rxm", 0));
  client_t client(client_transport("tcp;ofi_rxm", {&s0}), steep);
  const packed two({1, 2});
  std::vector<gear::key> keys(2);
  client.insert(two.view(), keys);
  REQUIRE(s0.selection_state().total() == doctest::Approx(2.0));  // both enter at priority 1
  // Key 0 named twice (its last priority, 3, wins), key 1 with a priority the tree refuses.
  const std::vector<gear::key> named{keys[0], keys[1], keys[0]};
  const std::vector<float> priorities{2.0f, 1e38f, 3.0f};
  const gear::priority_update_result r = client.update_priorities(named, priorities);
  CHECK(r.applied == 2);
  CHECK(r.stale == 1);
  // Key 0 at 3 (3^10), key 1 unchanged at 1: before, the whole message was counted stale and
  // the shard's mass stayed 2.
  CHECK(s0.selection_state().total() == doctest::Approx(std::pow(3.0, 10) + 1.0));
  CHECK(s0.contains(keys[0]));
  CHECK(s0.contains(keys[1]));
}
