// Decentralised sampling between processes over loopback (tcp;ofi_rxm, shm, shm without CMA): 2
// shards of unequal size (8 and 16 trajectories, uniform selection, host storage) and 1 learner
// (remote_learner). Over 320 batches of 64 rows (half of them with 8 samples in flight, whose
// requests go to the shards in bundles), every row holds its trajectory's bytes (its id
// in every step, a pattern of (id, step), its mask) and a key naming its shard, incarnation and
// ticket; every probability is the union's, 1/24; and the rows follow the union's law: chi-square
// at significance 0.001 over the 24 trajectories, with power shown on the same counts against a
// planted wrong law (the mixture that picks each shard with probability 1/2, which per-shard
// sampling without global weights would give). Deadlines everywhere; no process or /dev/shm file
// left behind.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <gear/gear.hpp>
#include <gear/transport/remote_learner.hpp>
#include <gear/transport/shard_server.hpp>
#include <new>
#include <thread>
#include <type_traits>
#include <vector>

#include "common.hpp"
#include "process_common.hpp"

using namespace process_test;

// (The replacement operators below pair malloc and free by construction; g++ sees the free of
// what a new-expression returned once inlined and warns.)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

// Allocations through operator new on a thread while it counts them: a learner's sample, once its
// sizes were seen, makes none (libfabric's own mallocs are not counted).
namespace {
thread_local bool counting_allocations = false;
thread_local long allocations = 0;
}  // namespace
void* operator new(std::size_t bytes) {
  if (counting_allocations) ++allocations;
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using spec = gear::spec<gear::column<"id", std::int64_t>, gear::column<"obs", float, 4>>;
template <class Selection>
using buffer = gear::replay_buffer<spec, gear::storage::host, Selection>;
constexpr double alpha = 0.6;  // select::prioritized's default
constexpr std::int64_t max_length = 8, batches = 320, rows = 64;
constexpr std::int64_t sizes[] = {8, 16};
constexpr auto deadline = std::chrono::seconds(40);

std::int64_t length_of(std::int64_t id) { return 1 + id % max_length; }
float obs_of(std::int64_t id, std::int64_t step, int k) {
  return static_cast<float>(id * 1000 + step * 10 + k);
}
std::int64_t id_of(std::uint32_t shard, std::int64_t i) { return shard * 100 + i; }

/// The priority the learner gives trajectory `id` (prioritized runs).
float priority_of(std::int64_t id) { return static_cast<float>(1 + id % 7); }

/// A shard: fills its buffer locally, serves until the parent says done.
template <class Selection>
int run_shard(int fd, const gear::transport::libfabric_config& fabric, std::uint32_t shard) {
  buffer<Selection> buf{gear::capacity{32}, gear::max_length{max_length}};
  std::vector<std::int64_t> lengths, ids;
  std::vector<float> obs;
  for (std::int64_t i = 0; i < sizes[shard]; ++i) {
    const std::int64_t id = id_of(shard, i);
    lengths.push_back(length_of(id));
    for (std::int64_t s = 0; s < length_of(id); ++s) {
      ids.push_back(id);
      for (int k = 0; k < 4; ++k) obs.push_back(obs_of(id, s, k));
    }
  }
  std::vector<gear::key> keys(lengths.size());
  buf.insert({lengths, {gear::input(ids.data()), gear::input(obs.data(), {4})}}, keys);
  typename gear::transport::shard_server<buffer<Selection>>::options o;
  o.fabric = fabric;
  o.shard = shard;
  gear::transport::shard_server<buffer<Selection>> server(buf, o);
  if (!send_frame(fd, server.address())) return 10;
  char byte = 0;
  if (read(fd, &byte, 1) != 1) return 11;
  server.stop();
  if (server.stats().bundles == 0) return 13;  // the learner's held requests came bundled
  return server.stats().refused.total() == 0 ? 0 : 12;
}

/// The learner: samples, checks every row, tests the law; writes the counts' verdict. Prioritized:
/// first sets every trajectory's priority at its shard (and two stale pairs), then tests
/// against the union's p^alpha law.
template <class Selection>
int run_learner(int fd, const gear::transport::libfabric_config& fabric) {
  constexpr bool prioritized = std::is_same_v<Selection, gear::select::prioritized>;
  std::vector<std::vector<std::byte>> blobs;
  for (int s = 0; s < 2; ++s) blobs.push_back(receive_frame(fd));
  typename gear::transport::remote_learner<spec, Selection>::options o;
  o.fabric = fabric;
  o.max_batch = rows;
  o.max_window = max_length;
  o.deadline = std::chrono::duration_cast<std::chrono::milliseconds>(deadline);
  gear::transport::remote_learner<spec, Selection> learner(blobs, o);
  gear::batch<spec> out(gear::memory_kind::host, gear::batch_size{rows},
                        gear::window_length{max_length});
  // Refused before anything moves: a window that does not fit the batch.
  try {
    gear::rng bad{1};
    learner.sample(out, gear::window{.length = max_length - 1}, bad);
    return 20;
  } catch (const gear::error& e) {
    if (e.code() != gear::errc::batch_mismatch) return 21;
  }
  std::uint32_t incarnation[2];
  for (std::uint32_t s = 0; s < 2; ++s) incarnation[s] = learner.shard(s).incarnation;
  std::vector<double> counts(24, 0.0), law(24);
  gear::rng g{2026};
  const auto ids = out.column<"id">();
  double mass = 0;
  for (std::size_t c = 0; c < 24; ++c) {
    const std::int64_t id = c < 8 ? id_of(0, c) : id_of(1, c - 8);
    law[c] = prioritized ? std::pow(double(priority_of(id)), alpha) : 1.0;
    mass += law[c];
  }
  for (double& p : law) p /= mass;
  if constexpr (prioritized) {
    // Every key, from samples; then every priority, at its shard, with two stale pairs.
    std::vector<gear::key> keys(24);
    std::vector<bool> seen(24);
    for (int b = 0; b < 50 && std::count(seen.begin(), seen.end(), true) < 24; ++b) {
      learner.sample(out, gear::window{.length = max_length}, g);
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t id = ids(r, 0);
        const std::size_t c = id < 100 ? std::size_t(id) : std::size_t(8 + id - 100);
        keys[c] = out.keys()[std::size_t(r)];
        seen[c] = true;
      }
    }
    if (std::count(seen.begin(), seen.end(), true) < 24) return 31;
    std::vector<float> p(24);
    for (std::size_t c = 0; c < 24; ++c) p[c] = priority_of(c < 8 ? id_of(0, c) : id_of(1, c - 8));
    gear::key gone = keys[0], old = keys[9];
    gone.ticket += 1000;   // never issued: stale
    old.incarnation ^= 1;  // another incarnation's: stale
    keys.push_back(gone);
    keys.push_back(old);
    p.push_back(5.0f);
    p.push_back(5.0f);
    const gear::priority_update_result r = learner.update_priorities(keys, p);
    if (r.applied != 24 || r.stale != 2) return 32;
    const float bad[] = {std::nanf("")};
    try {
      (void)learner.update_priorities(std::span(keys).first(1), bad);
      return 33;
    } catch (const gear::error& e) {
      if (e.code() != gear::errc::invalid_priority) return 34;
    }
    learner.sample(out, gear::window{.length = max_length}, g);  // refreshes the masses
  }
  // Split phase: one sample in flight at a time, ended on the batch it was begun on.
  learner.sample_begin(out, gear::window{.length = max_length}, g);
  try {
    learner.sample_begin(out, gear::window{.length = max_length}, g);
    return 35;
  } catch (const gear::error& e) {
    if (e.code() != gear::errc::invalid_argument) return 36;
  }
  learner.sample_end(out);
  try {
    learner.sample_end(out);
    return 37;
  } catch (const gear::error& e) {
    if (e.code() != gear::errc::invalid_argument) return 38;
  }
  // Every row of a finished batch: its trajectory's bytes, mask and key; the union's
  // probability; counted for the law.
  const auto check = [&](gear::batch<spec>& done) {
    const auto ids = done.column<"id">();
    const auto obs = done.column<"obs">();
    const auto mask = done.mask();
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t id = ids(r, 0);
      const auto shard = static_cast<std::uint32_t>(id / 100);
      const std::int64_t i = id % 100;
      if (shard > 1 || i >= sizes[shard]) return 22;
      const gear::key k = done.keys()[static_cast<std::size_t>(r)];
      if (k.shard != shard || k.incarnation != incarnation[shard] ||
          k.ticket != static_cast<std::uint64_t>(i))
        return 23;
      for (std::int64_t s = 0; s < max_length; ++s) {
        const bool valid = s < length_of(id);
        if (mask(r, s) != (valid ? 1 : 0)) return 24;
        if (!valid) continue;
        if (ids(r, s) != id) return 25;
        for (int q = 0; q < 4; ++q)
          if (obs(r, s, q) != obs_of(id, s, q)) return 26;
      }
      const std::size_t cell = shard * 8 + std::size_t(i);
      if (std::fabs(done.probabilities()[static_cast<std::size_t>(r)] - law[cell]) >
          1e-5 * law[cell] + 1e-7)
        return 27;
      if (done.weights()[static_cast<std::size_t>(r)] != 1.0f) return 28;
      counts[cell] += 1;
    }
    return 0;
  };
  for (std::int64_t b = 0; b < batches / 2; ++b) {
    if (b % 2 == 0) {
      learner.sample(out, gear::window{.length = max_length}, g);
    } else {  // the shards work while this thread does something else
      learner.sample_begin(out, gear::window{.length = max_length}, g);
      std::this_thread::yield();
      learner.sample_end(out);
    }
    if (const int rc = check(out); rc != 0) return rc;
  }
  // As many in flight as allowed, begun ahead as a training loop does: from the fifth on, with
  // four being served, a new sample's requests are held and go four samples' at a time in one
  // message per shard (run_shard checks that bundles came). Mostly the oldest is ended first;
  // every fifth time the newest, whose requests may still be held (its sample_end sends them).
  constexpr std::size_t most = gear::transport::max_samples_in_flight;
  std::vector<gear::batch<spec>> ahead;
  std::vector<std::size_t> order;  // the batches in flight, oldest first
  ahead.reserve(most);             // they stay put while in flight
  for (std::size_t i = 0; i < most; ++i) {
    ahead.emplace_back(gear::memory_kind::host, gear::batch_size{rows},
                       gear::window_length{max_length});
    learner.sample_begin(ahead[i], gear::window{.length = max_length}, g);
    order.push_back(i);
  }
  for (std::int64_t b = batches / 2; b < batches; ++b) {
    const bool newest = b % 5 == 0;
    const std::size_t i = newest ? order.back() : order.front();
    order.erase(newest ? order.end() - 1 : order.begin());
    learner.sample_end(ahead[i]);
    if (const int rc = check(ahead[i]); rc != 0) return rc;
    if (b + static_cast<std::int64_t>(most) < batches) {
      learner.sample_begin(ahead[i], gear::window{.length = max_length}, g);
      order.push_back(i);
    }
  }
  if (!order.empty()) return 39;  // as many ended as begun
  double n = 0;
  for (const double c : counts) n += c;
  if (n != double(batches * rows)) return 48;
  std::vector<double> union_law(24), mixture(24);
  double shard_mass[2] = {0, 0};
  for (std::size_t c = 0; c < 24; ++c) shard_mass[c < 8 ? 0 : 1] += law[c];
  for (std::size_t c = 0; c < 24; ++c) {
    union_law[c] = n * law[c];
    mixture[c] = n * 0.5 * law[c] / shard_mass[c < 8 ? 0 : 1];  // each shard half the rows
  }
  const double stat = gear_test::chi2(counts, union_law), wrong = gear_test::chi2(counts, mixture);
  const double critical = 49.728;  // chi-square, 23 degrees of freedom, upper 0.001
  std::fprintf(stderr,
               "learner: chi-square %.2f against the union (critical %.2f), %.1f against "
               "the per-shard mixture\n",
               stat, critical, wrong);
  if (stat > critical) return 29;
  if (wrong <= critical) return 30;
  return 0;
}

template <class Selection>
void cluster(const char* provider, bool disable_cma) {
  gear::transport::libfabric_config fabric;
  fabric.provider = provider;
  const auto start = clock_type::now();
  const auto until = start + deadline + std::chrono::seconds(10);
  int shard_fd[2][2], learner_fd[2];
  pid_t shard_pid[2];
  for (std::uint32_t s = 0; s < 2; ++s) {
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, shard_fd[s]) == 0);
    shard_pid[s] = spawn([&](int fd) { return run_shard<Selection>(fd, fabric, s); },
                         shard_fd[s][0], shard_fd[s][1], disable_cma);
    close(shard_fd[s][0]);
  }
  std::vector<std::vector<std::byte>> blobs;
  for (std::uint32_t s = 0; s < 2; ++s) blobs.push_back(receive_frame(shard_fd[s][1]));
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, learner_fd) == 0);
  const pid_t learner = spawn([&](int fd) { return run_learner<Selection>(fd, fabric); },
                              learner_fd[0], learner_fd[1], disable_cma);
  close(learner_fd[0]);
  for (const auto& b : blobs) (void)send_frame(learner_fd[1], b);
  close(learner_fd[1]);
  const int learner_rc = reap(learner, until);
  int shard_rc[2];
  for (std::uint32_t s = 0; s < 2; ++s) {
    const char done = 1;
    (void)write(shard_fd[s][1], &done, 1);
    shard_rc[s] = reap(shard_pid[s], until);
    close(shard_fd[s][1]);
  }
  const std::string name = std::string(provider) + (disable_cma ? " (no CMA)" : "");
  MESSAGE(name << ": shards exit " << shard_rc[0] << " " << shard_rc[1] << ", learner exit "
               << learner_rc << ", "
               << std::chrono::duration<double>(clock_type::now() - start).count() << " s");
  for (std::uint32_t s = 0; s < 2; ++s) CHECK(shm_leftovers(shard_pid[s]) == 0);
  CHECK(shm_leftovers(learner) == 0);
  if (shard_rc[0] == 77) {
    MESSAGE("provider " << name << " is not available here: not tested");
    return;
  }
  for (std::uint32_t s = 0; s < 2; ++s) CHECK(shard_rc[s] == 0);
  CHECK(learner_rc == 0);
}

// A spec of 6 columns: a reply goes as a write of 4 columns alone, then one of the other 2 and
// the meta part (tcp and shm carry 4 segments a write), or 7 writes where a write carries one.
using wide_spec = gear::spec<gear::column<"id", std::int64_t>, gear::column<"a", std::uint8_t, 3>,
                             gear::column<"b", float, 2>, gear::column<"c", std::int16_t>,
                             gear::column<"d", std::uint8_t, 17>, gear::column<"e", double>>;
using wide_buffer = gear::replay_buffer<wide_spec, gear::storage::host>;
constexpr std::int64_t wide_count = 12;
std::uint8_t wide_byte(std::int64_t id, std::int64_t step, int k) {
  return static_cast<std::uint8_t>(id * 31 + step * 7 + k * 11);
}

/// A learner's options for the one-process tests: rows of up to max_length steps.
template <class Spec>
typename gear::transport::remote_learner<Spec>::options one_process(
    const gear::transport::libfabric_config& fabric, std::int64_t max_batch) {
  typename gear::transport::remote_learner<Spec>::options o;
  o.fabric = fabric;
  o.max_batch = max_batch;
  o.max_window = max_length;
  o.deadline = std::chrono::seconds(20);
  return o;
}

/// One process: a shard on a buffer of wide_spec (its own threads) and a learner that samples
/// it, 200 batches of 16 rows, split phase with 2 in flight; 0 when every row holds its
/// trajectory's bytes in every column and its key names it, and the shard's threads and the
/// learner report busy and waiting time within their wall time.
int run_wide(const gear::transport::libfabric_config& fabric) {
  wide_buffer buf{gear::capacity{16}, gear::max_length{max_length}};
  std::vector<std::int64_t> lengths, ids;
  std::vector<std::uint8_t> a, d;
  std::vector<float> b;
  std::vector<std::int16_t> c;
  std::vector<double> e;
  for (std::int64_t id = 0; id < wide_count; ++id) {
    lengths.push_back(length_of(id));
    for (std::int64_t t = 0; t < length_of(id); ++t) {
      ids.push_back(id);
      for (int k = 0; k < 3; ++k) a.push_back(wide_byte(id, t, k));
      for (int k = 0; k < 2; ++k) b.push_back(static_cast<float>(id * 100 + t * 10 + k));
      c.push_back(static_cast<std::int16_t>(id * 1000 + t));
      for (int k = 0; k < 17; ++k) d.push_back(wide_byte(id, t, k + 3));
      e.push_back(static_cast<double>(id) + static_cast<double>(t) / 8);
    }
  }
  std::vector<gear::key> keys(lengths.size());
  buf.insert({lengths,
              {gear::input(ids.data()), gear::input(a.data(), {3}), gear::input(b.data(), {2}),
               gear::input(c.data()), gear::input(d.data(), {17}), gear::input(e.data())}},
             keys);
  gear::transport::shard_server<wide_buffer>::options so;
  so.fabric = fabric;
  const auto started = clock_type::now();
  gear::transport::shard_server<wide_buffer> server(buf, so);
  const std::vector<std::vector<std::byte>> blobs{server.address()};
  gear::transport::remote_learner<wide_spec> learner(blobs, one_process<wide_spec>(fabric, 16));
  std::vector<gear::batch<wide_spec>> out;
  for (int i = 0; i < 2; ++i)
    out.emplace_back(gear::memory_kind::host, gear::batch_size{16},
                     gear::window_length{max_length});
  gear::rng g{7};
  const gear::window w{.length = max_length};
  learner.sample_begin(out[0], w, g);
  for (int n = 0; n < 200; ++n) {
    auto& done = out[std::size_t(n % 2)];
    counting_allocations = n >= 4;  // after the first samples sized the learner's storage
    learner.sample_begin(out[std::size_t((n + 1) % 2)], w, g);
    learner.sample_end(done);
    counting_allocations = false;
    if (allocations != 0) return 47;
    for (std::int64_t r = 0; r < 16; ++r) {
      const std::int64_t id = done.column<"id">()(r, 0);
      if (id < 0 || id >= wide_count) return 40;
      if (done.keys()[std::size_t(r)].ticket != std::uint64_t(id)) return 41;
      for (std::int64_t t = 0; t < max_length; ++t) {
        const bool valid = t < length_of(id);
        if (done.mask()(r, t) != (valid ? 1 : 0)) return 42;
        if (!valid) continue;
        bool ok = done.column<"id">()(r, t) == id &&
                  done.column<"c">()(r, t) == static_cast<std::int16_t>(id * 1000 + t) &&
                  done.column<"e">()(r, t) == static_cast<double>(id) + static_cast<double>(t) / 8;
        for (int k = 0; k < 3; ++k) ok = ok && done.column<"a">()(r, t, k) == wide_byte(id, t, k);
        for (int k = 0; k < 2; ++k)
          ok = ok && done.column<"b">()(r, t, k) == static_cast<float>(id * 100 + t * 10 + k);
        for (int k = 0; k < 17; ++k)
          ok = ok && done.column<"d">()(r, t, k) == wide_byte(id, t, k + 3);
        if (!ok) return 43;
      }
    }
  }
  learner.sample_end(out[0]);
  // Each of the shard's threads worked, and no longer than the shard has served.
  const auto st = server.stats();
  const double wall = std::chrono::duration<double>(clock_type::now() - started).count();
  for (const double busy : {st.progress_busy_s, st.packer_busy_s, st.writers_busy_s})
    if (!(busy > 0 && busy <= wall)) return 45;
  // The learner waited for replies at some point, and never longer than it ran.
  if (!(learner.waiting_seconds() > 0 && learner.waiting_seconds() <= wall)) return 46;
  return st.refused.total() == 0 ? 0 : 44;
}

void wide(const char* provider, bool disable_cma) {
  gear::transport::libfabric_config fabric;
  fabric.provider = provider;
  const int rc = run_alone([&] { return run_wide(fabric); }, disable_cma,
                           clock_type::now() + std::chrono::seconds(60));
  const std::string name = std::string(provider) + (disable_cma ? " (no CMA)" : "");
  MESSAGE(name << ": exit " << rc);
  if (rc == 77) {
    MESSAGE("provider " << name << " is not available here: not tested");
    return;
  }
  CHECK(rc == 0);
}

/// One process: a shard and a learner (requests_per_message 4, the default) that begins samples
/// ahead. Checks when held requests go, by the bundles the shard counts: 0 when every case holds.
int run_held(const gear::transport::libfabric_config& fabric) {
  using id_spec = gear::spec<gear::column<"id", std::int64_t>>;
  gear::replay_buffer<id_spec, gear::storage::host> buf{gear::capacity{16},
                                                        gear::max_length{max_length}};
  std::vector<std::int64_t> lengths(16, max_length), ids;
  for (std::int64_t id = 0; id < 16; ++id)
    for (std::int64_t t = 0; t < max_length; ++t) ids.push_back(id);
  std::vector<gear::key> keys(16);
  buf.insert({lengths, {gear::input(ids.data())}}, keys);
  gear::transport::shard_server<decltype(buf)>::options so;
  so.fabric = fabric;
  gear::transport::shard_server<decltype(buf)> server(buf, so);
  const auto lo = one_process<id_spec>(fabric, 4);
  const std::vector<std::vector<std::byte>> blobs{server.address()};
  gear::transport::remote_learner<id_spec> learner(blobs, lo);
  std::vector<gear::batch<id_spec>> b;
  for (int i = 0; i < 8; ++i)
    b.emplace_back(gear::memory_kind::host, gear::batch_size{4}, gear::window_length{max_length});
  gear::rng g{5};
  const gear::window w{.length = max_length};
  const auto bundles = [&] { return server.stats().bundles; };
  const auto bundles_reach = [&](std::uint64_t n) {  // the shard counts a bundle as it comes
    const auto until = clock_type::now() + std::chrono::seconds(5);
    while (bundles() < n && clock_type::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return bundles() == n;
  };
  const auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); };
  const auto end = [&](int i) {  // ends sample i; every row holds the trajectory its key names
    learner.sample_end(b[std::size_t(i)]);
    for (std::int64_t r = 0; r < 4; ++r)
      for (std::int64_t t = 0; t < max_length; ++t)
        if (b[std::size_t(i)].column<"id">()(r, t) !=
            std::int64_t(b[std::size_t(i)].keys()[std::size_t(r)].ticket))
          return false;
    return true;
  };
  // 1. Eight begun with no poll between: four go alone; the next four wait (four are being
  // served) and go in one bundle at the eighth.
  for (int i = 0; i < 7; ++i) learner.sample_begin(b[std::size_t(i)], w, g);
  settle();
  if (bundles() != 0) return 50;
  learner.sample_begin(b[7], w, g);
  if (!bundles_reach(1)) return 51;
  for (int i = 0; i < 8; ++i)
    if (!end(i)) return 52;
  // 2. Six begun, the last two held: ending the sixth first sends both, in one bundle.
  for (int i = 0; i < 6; ++i) learner.sample_begin(b[std::size_t(i)], w, g);
  settle();
  if (bundles() != 1) return 53;
  if (!end(5) || bundles() != 2) return 54;
  for (int i = 0; i < 5; ++i)
    if (!end(i)) return 55;
  // 3. Six begun, the last two held: an erase sends them first.
  for (int i = 0; i < 6; ++i) learner.sample_begin(b[std::size_t(i)], w, g);
  settle();
  gear::key stale = keys[0];
  stale.ticket += 1000;
  if (learner.erase(std::span(&stale, 1)).stale != 1 || bundles() != 3) return 56;
  for (int i = 0; i < 6; ++i)
    if (!end(i)) return 57;
  // 4. Six begun, the last two held; once the replies are in (the learner has not polled),
  // ending the first finds at most three being served and sends the held ones, before theirs.
  for (int i = 0; i < 6; ++i) learner.sample_begin(b[std::size_t(i)], w, g);
  settle();
  if (bundles() != 3) return 58;
  if (!end(0) || !bundles_reach(4)) return 59;
  for (int i = 1; i < 6; ++i)
    if (!end(i)) return 60;
  // 5. Out of range: more than half the samples in flight to a message.
  try {
    auto bad = lo;
    bad.requests_per_message = gear::transport::max_samples_in_flight / 2 + 1;
    gear::transport::remote_learner<id_spec> refused(blobs, bad);
    return 61;
  } catch (const gear::error& e) {
    if (e.code() != gear::errc::invalid_argument) return 62;
  }
  return server.stats().refused.total() == 0 ? 0 : 63;
}

void held(const char* provider) {
  gear::transport::libfabric_config fabric;
  fabric.provider = provider;
  const int rc = run_alone([&] { return run_held(fabric); }, false,
                           clock_type::now() + std::chrono::seconds(60));
  MESSAGE(std::string(provider) << ": exit " << rc);
  if (rc == 77) {
    MESSAGE("provider " << std::string(provider) << " is not available here: not tested");
    return;
  }
  CHECK(rc == 0);
}

}  // namespace

TEST_CASE("6 columns: a reply in 2 writes carries every column's bytes (tcp, shm, shm no CMA)") {
  wide("tcp;ofi_rxm", false);
  wide("shm", false);
  wide("shm", true);
}

TEST_CASE("tcp;ofi_rxm: a learner samples 2 shards as one buffer") {
  cluster<gear::select::uniform>("tcp;ofi_rxm", false);
}
TEST_CASE("shm: a learner samples 2 shards as one buffer") {
  cluster<gear::select::uniform>("shm", false);
}
TEST_CASE("shm without CMA: a learner samples 2 shards as one buffer") {
  cluster<gear::select::uniform>("shm", true);
}
TEST_CASE("tcp;ofi_rxm: prioritized: updates land on their shards; global P is the union's") {
  cluster<gear::select::prioritized>("tcp;ofi_rxm", false);
}
TEST_CASE("shm: prioritized: updates land on their shards; global P is the union's") {
  cluster<gear::select::prioritized>("shm", false);
}
TEST_CASE(
    "held requests: bundled at the fourth, sent by their sample_end, an erase, a freer shard") {
  held("tcp;ofi_rxm");
  held("shm");
}
