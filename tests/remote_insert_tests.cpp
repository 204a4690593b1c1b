// Remote inserts between processes over loopback (tcp;ofi_rxm, shm, shm without CMA): 2 shards,
// each a shard_server over its own host buffer, and 2 actors (remote_actor), each inserting 12
// trajectories round robin over both shards, in two calls (actor 1's second call without keys,
// then flush). Every key an actor gets names the shard it was routed to and that shard's
// incarnation; every shard then holds exactly the 12 trajectories routed to it, and a sample of
// its buffer returns each with its bytes intact (its id in every step, a pattern of (id, step)
// in its observations, its length in the mask). Refused input: a trajectory longer than the
// shards take (with keys and without), and a keys_out too small, throw before anything moves. A
// shard whose buffer refuses an entry inserted without keys: the actor's next flush throws it,
// once, and the other entries are stored. Deadlines on every wait; no process or /dev/shm file
// left behind.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <gear/gear.hpp>
#include <gear/distributed.hpp>
#include <gear/transport/remote_actor.hpp>
#include <gear/transport/shard_server.hpp>
#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "process_common.hpp"

using namespace process_test;

namespace {

using spec = gear::spec<gear::column<"id", std::int64_t>, gear::column<"obs", float, 4>>;
using buffer = gear::replay_buffer<spec, gear::storage::host>;
constexpr std::int64_t max_length = 16, per_actor = 12, actors = 2, shards = 2;
constexpr auto deadline = std::chrono::seconds(30);

std::int64_t length_of(std::int64_t id) { return 1 + id % max_length; }
float obs_of(std::int64_t id, std::int64_t step, int k) {
  return static_cast<float>(id * 1000 + step * 10 + k);
}

/// A shard: serves its buffer until the parent says done (a byte), then checks what it holds.
int run_shard(int fd, const gear::transport::libfabric_config& fabric, std::uint32_t id) {
  buffer buf{gear::capacity{64}, gear::max_length{max_length}};
  gear::transport::shard_server<buffer>::options o;
  o.fabric = fabric;
  o.shard = id;
  o.block_bytes = 4096;
  gear::transport::shard_server<buffer> server(buf, o);
  if (!send_frame(fd, server.address())) return 10;
  char byte = 0;
  if (read(fd, &byte, 1) != 1) return 11;
  server.stop();
  const auto stats = server.stats();
  if (stats.inserted != per_actor * actors / shards || stats.refused.total() != 0) return 12;
  if (!(stats.inserter_busy_s > 0)) return 19;  // the inserter thread inserted them
  if (buf.size() != per_actor * actors / shards) return 13;
  // Every trajectory intact: a sample of 512 rows over the 12.
  auto batch = buf.make_batch(gear::batch_size{512}, gear::window_length{max_length});
  gear::rng g{id + 1};
  buf.sample(batch, gear::window{.length = max_length}, g);
  const auto ids = batch.column<"id">();
  const auto obs = batch.column<"obs">();
  const auto mask = batch.mask();
  std::set<std::int64_t> seen;
  for (std::int64_t r = 0; r < 512; ++r) {
    const std::int64_t tid = ids(r, 0);
    // Routed here: actor a's trajectory t goes to shard t % 2; ids are a * 100 + t.
    if ((tid % 100) % shards != id) return 14;
    seen.insert(tid);
    for (std::int64_t s = 0; s < max_length; ++s) {
      const bool valid = s < length_of(tid);
      if (mask(r, s) != (valid ? 1 : 0)) return 15;
      if (!valid) continue;
      if (ids(r, s) != tid) return 16;
      for (int k = 0; k < 4; ++k)
        if (obs(r, s, k) != obs_of(tid, s, k)) return 17;
    }
  }
  return seen.size() == per_actor * actors / shards ? 0 : 18;
}

/// An actor: connects to both shards, inserts its trajectories, checks its keys.
int run_actor(int fd, const gear::transport::libfabric_config& fabric, std::int64_t actor) {
  std::vector<std::vector<std::byte>> blobs;
  for (int s = 0; s < shards; ++s) blobs.push_back(receive_frame(fd));
  gear::transport::remote_actor<spec>::options o;
  o.fabric = fabric;
  o.ring_blocks = 8;  // fewer blocks than entries: credits come back by acknowledgements
  o.deadline = std::chrono::duration_cast<std::chrono::milliseconds>(deadline);
  gear::transport::remote_actor<spec> client(blobs, o);
  std::vector<std::int64_t> lengths, ids;
  std::vector<float> obs;
  for (std::int64_t t = 0; t < per_actor; ++t) {
    const std::int64_t tid = actor * 100 + t;
    lengths.push_back(length_of(tid));
    for (std::int64_t s = 0; s < length_of(tid); ++s) {
      ids.push_back(tid);
      for (int k = 0; k < 4; ++k) obs.push_back(obs_of(tid, s, k));
    }
  }
  std::vector<gear::key> keys(per_actor);
  // Refused before anything moves: too long, too few keys.
  const std::int64_t too_long[] = {max_length + 1};
  std::vector<std::int64_t> long_ids(max_length + 1);
  std::vector<float> long_obs((max_length + 1) * 4);
  try {
    client.insert({too_long, {gear::input(long_ids.data()), gear::input(long_obs.data(), {4})}},
                  keys);
    return 20;
  } catch (const gear::error& e) {
    if (e.code() != gear::errc::trajectory_too_long) return 21;
  }
  try {
    client.insert({lengths, {gear::input(ids.data()), gear::input(obs.data(), {4})}},
                  std::span(keys).first(3));
    return 22;
  } catch (const gear::error& e) {
    if (e.code() != gear::errc::invalid_argument) return 23;
  }
  // Two calls of 6.
  const std::span<const std::int64_t> all(lengths);
  std::int64_t steps_first = 0;
  for (int t = 0; t < 6; ++t) steps_first += lengths[t];
  client.insert({all.first(6), {gear::input(ids.data()), gear::input(obs.data(), {4})}},
                std::span(keys).first(6));
  const gear::trajectories<spec> second{
      all.subspan(6),
      {gear::input(ids.data() + steps_first), gear::input(obs.data() + steps_first * 4, {4})}};
  const std::int64_t keyed = actor == 1 ? 6 : per_actor;  // actor 1: the second call without keys
  if (actor == 1) {
    client.insert(second);
    client.flush();
    if (client.in_flight() != 0) return 28;
  } else {
    client.insert(second, std::span(keys).subspan(6));
  }
  std::set<std::pair<std::uint32_t, std::uint64_t>> distinct;
  for (std::int64_t t = 0; t < keyed; ++t) {
    const auto blob = gear::detail::remote::parse_blob(blobs[t % shards]);
    if (keys[t].shard != blob.value.shard || keys[t].incarnation != blob.value.incarnation)
      return 24;
    if (keys[t].ticket == gear::no_ticket) return 25;
    distinct.insert({keys[t].shard, keys[t].ticket});
  }
  if (distinct.size() != std::size_t(keyed)) return 26;
  // Each shard's status counts at least this actor's share.
  for (std::size_t s = 0; s < shards; ++s)
    if (client.status(s).size < per_actor / shards) return 27;
  return 0;
}

/// A buffer that refuses trajectories whose id is negative, as a shard's buffer may refuse one.
struct refusing_buffer : buffer {
  using buffer::buffer;
  template <class... Rest>
  void insert(const gear::trajectories<spec>& in, std::span<gear::key> keys, Rest&&... rest) {
    if (*static_cast<const std::int64_t*>(in.columns[0].data) < 0)
      throw gear::error(gear::errc::invalid_argument, "refused by the test's buffer");
    buffer::insert(in, keys, std::forward<Rest>(rest)...);
  }
};

/// A shard over a refusing_buffer and an actor that inserts, without keys, one trajectory too
/// long (refused at once, nothing sent), then 5, the third refused by the buffer: the next flush
/// throws errc::invalid_argument naming 1 refusal, the one after throws nothing, and the shard
/// holds the 4 others; then a refusal of one thread's insert is told to that thread alone.
int run_refused(const gear::transport::libfabric_config& fabric) {
  refusing_buffer buf{gear::capacity{16}, gear::max_length{max_length}};
  gear::transport::shard_server<refusing_buffer>::options so;
  so.fabric = fabric;
  gear::transport::shard_server<refusing_buffer> server(buf, so);
  gear::transport::remote_actor<spec>::options o;
  o.fabric = fabric;
  o.deadline = std::chrono::duration_cast<std::chrono::milliseconds>(deadline);
  const std::vector<std::vector<std::byte>> blobs{server.address()};
  gear::transport::remote_actor<spec> client(blobs, o);
  // Bad input without keys is refused as with keys, before anything moves.
  const std::int64_t too_long[] = {max_length + 1};
  const std::vector<std::int64_t> long_ids(max_length + 1);
  const std::vector<float> long_obs((max_length + 1) * 4);
  try {
    client.insert({too_long, {gear::input(long_ids.data()), gear::input(long_obs.data(), {4})}});
    return 33;
  } catch (const gear::error& e) {
    if (e.code() != gear::errc::trajectory_too_long) return 34;
  }
  if (client.in_flight() != 0 || server.stats().inserted != 0 || buf.size() != 0) return 35;
  for (const std::int64_t id : {1, 2, -3, 4, 5}) {
    const std::int64_t lengths[] = {2};
    const std::int64_t ids[] = {id, id};
    const std::vector<float> obs(8, 1.0f);
    client.insert({lengths, {gear::input(ids), gear::input(obs.data(), {4})}});
  }
  try {
    client.flush();
    return 30;
  } catch (const gear::error& e) {
    if (e.code() != gear::errc::invalid_argument ||
        std::string(e.what()).find("refused 1 ") == std::string::npos)
      return 31;
  }
  client.flush();  // reported once
  // Two threads taking turns on the actor (as a client_buffer's do): B inserts without keys a
  // trajectory the buffer refuses; A then inserts with keys three times, its calls reading B's
  // refusal as it comes back. A's inserts must not hear of it (each threw it, sending nothing,
  // before); B's flush must.
  std::mutex turns;
  std::atomic<int> phase{0};
  int a_failed = 0, b_heard = 0;
  std::thread b([&] {
    {
      const std::lock_guard<std::mutex> held(turns);
      const std::int64_t lengths[] = {1};
      const std::int64_t ids[] = {-7};
      const std::vector<float> obs(4, 1.0f);
      client.insert({lengths, {gear::input(ids), gear::input(obs.data(), {4})}});
    }
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    try {
      const std::lock_guard<std::mutex> held(turns);
      client.flush();
    } catch (const gear::error& e) {
      b_heard += e.code() == gear::errc::invalid_argument &&
                 std::string(e.what()).find("refused 1 ") != std::string::npos;
    }
  });
  std::thread a([&] {
    while (phase.load() != 1) std::this_thread::yield();
    for (const std::int64_t id : {8, 9, 10}) try {
        const std::lock_guard<std::mutex> held(turns);
        const std::int64_t lengths[] = {1};
        const std::int64_t ids[] = {id};
        const std::vector<float> obs(4, 1.0f);
        gear::key k;
        client.insert({lengths, {gear::input(ids), gear::input(obs.data(), {4})}},
                      std::span<gear::key>(&k, 1));
      } catch (const gear::error&) {
        ++a_failed;
      }
    phase = 2;
  });
  a.join();
  b.join();
  if (a_failed != 0) return 36;
  if (b_heard != 1) return 37;
  // A thread that ends with a refusal untold, then a thread started after it (whose
  // std::thread::id the system may hand on from the ended one): its flush hears nothing of it.
  std::thread([&] {
    const std::int64_t lengths[] = {1};
    const std::int64_t ids[] = {-21};
    const std::vector<float> obs(4, 1.0f);
    client.insert({lengths, {gear::input(ids), gear::input(obs.data(), {4})}});
  }).join();
  bool later_heard = false;
  std::thread([&] {
    const std::int64_t lengths[] = {1};
    const std::int64_t ids[] = {22};
    const std::vector<float> obs(4, 1.0f);
    try {
      client.insert({lengths, {gear::input(ids), gear::input(obs.data(), {4})}});
      client.flush();
    } catch (const gear::error&) {
      later_heard = true;
    }
  }).join();
  if (later_heard) return 42;
  // A keyed insert through a client, its middle trajectory refused: the others stay stored, the
  // keys say which (no_ticket for the refused), and stats().inserted counts those stored.
  gear::transport::libfabric ct;
  ct.fabric = fabric;
  ct.deadline = std::chrono::duration_cast<std::chrono::milliseconds>(deadline);
  ct.shards = blobs;
  gear::replay_buffer<spec, gear::storage::none, gear::select::uniform,
                      gear::transport::libfabric>
      through(ct);
  {
    const std::int64_t lengths[] = {1, 1, 1};
    const std::int64_t ids[] = {11, -12, 13};
    const std::vector<float> obs(12, 1.0f);
    std::vector<gear::key> keys(3);
    try {
      through.insert({lengths, {gear::input(ids), gear::input(obs.data(), {4})}}, keys);
      return 38;
    } catch (const gear::error& e) {
      if (e.code() != gear::errc::invalid_argument) return 39;
    }
    if (keys[1].ticket != gear::no_ticket || keys[0].ticket == gear::no_ticket ||
        keys[2].ticket == gear::no_ticket)
      return 40;
    if (through.stats().inserted != 2) return 41;
  }
  server.stop();
  const auto stats = server.stats();
  if (stats.inserted != 10 || stats.refused_inserts != 4 || buf.size() != 10) return 32;
  return 0;
}

void cluster(const char* provider, bool disable_cma) {
  gear::transport::libfabric_config fabric;
  fabric.provider = provider;
  const auto start = clock_type::now();
  const auto until = start + deadline + std::chrono::seconds(10);
  int shard_fd[shards][2], actor_fd[actors][2];
  pid_t shard_pid[shards], actor_pid[actors];
  for (std::uint32_t s = 0; s < shards; ++s) {
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, shard_fd[s]) == 0);
    shard_pid[s] = spawn([&](int fd) { return run_shard(fd, fabric, s); }, shard_fd[s][0],
                         shard_fd[s][1], disable_cma);
    close(shard_fd[s][0]);
  }
  std::vector<std::vector<std::byte>> blobs;
  for (std::uint32_t s = 0; s < shards; ++s) blobs.push_back(receive_frame(shard_fd[s][1]));
  bool have_blobs = true;
  for (const auto& b : blobs) have_blobs = have_blobs && !b.empty();
  for (std::int64_t a = 0; a < actors; ++a) {
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, actor_fd[a]) == 0);
    actor_pid[a] = spawn([&](int fd) { return run_actor(fd, fabric, a); }, actor_fd[a][0],
                         actor_fd[a][1], disable_cma);
    close(actor_fd[a][0]);
    if (have_blobs)
      for (const auto& b : blobs) (void)send_frame(actor_fd[a][1], b);
    close(actor_fd[a][1]);
  }
  int actor_rc[actors], shard_rc[shards];
  for (std::int64_t a = 0; a < actors; ++a) actor_rc[a] = reap(actor_pid[a], until);
  for (std::uint32_t s = 0; s < shards; ++s) {
    const char done = 1;
    (void)write(shard_fd[s][1], &done, 1);
    shard_rc[s] = reap(shard_pid[s], until);
    close(shard_fd[s][1]);
  }
  const std::string name = std::string(provider) + (disable_cma ? " (no CMA)" : "");
  MESSAGE(name << ": shards exit " << shard_rc[0] << " " << shard_rc[1] << ", actors exit "
               << actor_rc[0] << " " << actor_rc[1] << ", "
               << std::chrono::duration<double>(clock_type::now() - start).count() << " s");
  for (std::uint32_t s = 0; s < shards; ++s) CHECK(shm_leftovers(shard_pid[s]) == 0);
  for (std::int64_t a = 0; a < actors; ++a) CHECK(shm_leftovers(actor_pid[a]) == 0);
  if (shard_rc[0] == 77) {
    MESSAGE("provider " << name << " is not available here: not tested");
    return;
  }
  for (std::uint32_t s = 0; s < shards; ++s) CHECK(shard_rc[s] == 0);
  for (std::int64_t a = 0; a < actors; ++a) CHECK(actor_rc[a] == 0);
}

}  // namespace

TEST_CASE("tcp;ofi_rxm: 2 actors insert into 2 shards") { cluster("tcp;ofi_rxm", false); }
TEST_CASE("a shard's refusal: without keys, thrown once by the inserting thread's next flush; "
          "with keys, the others stored") {
  for (const char* provider : {"tcp;ofi_rxm", "shm"}) {
    gear::transport::libfabric_config fabric;
    fabric.provider = provider;
    const int rc =
        run_alone([&] { return run_refused(fabric); }, false, clock_type::now() + deadline);
    MESSAGE(std::string(provider) << ": exit " << rc);
    if (rc == 77) continue;  // the provider is not available here
    CHECK(rc == 0);
  }
}
TEST_CASE("shm: 2 actors insert into 2 shards") { cluster("shm", false); }
TEST_CASE("shm without CMA: 2 actors insert into 2 shards") { cluster("shm", true); }
