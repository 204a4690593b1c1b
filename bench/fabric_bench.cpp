// The remote transport against raw libfabric, in one run, over loopback on one provider:
//
//   raw writedata   process A writes messages of a size into process B's registered memory with
//                   fi_writedata, 64 in flight; B counts the remote completions: GB/s
//   raw round trip  an 8-byte writedata and its echo: microseconds
//   sample          a learner samples B rows (256, 16, 1: replies of 16 MiB, 1 MiB, 64 KiB) of
//                   a 16-step window from one shard (host storage, steps of 4 KiB): GB/s of
//                   reply bytes, one sample at a time and with max_samples_in_flight in
//                   flight, against raw writedata of the reply's size (64 in flight, and as
//                   many as the learner has), and microseconds per sample against the raw round
//                   trip; with samples in flight, the share of the time each of the shard's
//                   threads (progress, packer, writer) and the learner's was busy: which one
//                   bounds it; and the same with every request sent alone (no bundles of
//                   requests: remote_learner's requests_per_message 1)
//   shards          the pipelined sample of B = 256 and the latency at B = 16 over 1, 2, 4 and 8
//                   shards, each against one shard in the same run (on shm: what the learner's
//                   inlet per shard costs as they grow)
//   insert          2 and 8 actor processes insert trajectories of 16 steps of 4 KiB into one
//                   shard, started together once all are connected, with keys and without:
//                   GB/s together (the sum of their rates), against raw writedata of an entry's
//                   size, and how busy the shard's progress thread (which checks and
//                   acknowledges every entry) and its inserter thread were
//
//   gear_fabric_bench [provider] [seconds per phase] [rounds] [B ...]
//                                                 (default tcp;ofi_rxm, 1, 3, and B = 256 16 1)
//   A bad argument, or a provider that cannot be opened, is refused before anything starts.
//
// Every figure is printed with the reference it is a ratio of, measured in the same run. The
// sampling figures and their raw reference are measured in `rounds` interleaved rounds (raw with
// as many in flight as the learner, one sample at a time, raw with 64 in flight, then the
// pipelined phases right after it): each is the median of its rounds, each ratio the median of
// the rounds' ratios, and the rounds' ratios are printed beside it (the raw reference alone moved
// by 25% between runs).

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <gear/gear.hpp>
#include <gear/transport/remote_actor.hpp>
#include <gear/transport/remote_learner.hpp>
#include <gear/transport/shard_server.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace remote = gear::detail::remote;
namespace fabric = gear::transport::fabric;
using clock_type = std::chrono::steady_clock;
using spec = gear::spec<gear::column<"obs", std::uint8_t, 4096>>;
using buffer = gear::replay_buffer<spec, gear::storage::host>;
constexpr std::int64_t steps = 16;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}
bool put(int fd, const void* p, std::size_t n) {
  return write(fd, p, n) == static_cast<ssize_t>(n);
}
bool get(int fd, void* p, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = read(fd, static_cast<char*>(p) + got, n - got);
    if (r <= 0) return false;
    got += static_cast<std::size_t>(r);
  }
  return true;
}
bool put_bytes(int fd, const std::vector<std::byte>& b) {
  const auto n = static_cast<std::uint32_t>(b.size());
  return put(fd, &n, 4) && put(fd, b.data(), b.size());
}
std::vector<std::byte> get_bytes(int fd) {
  std::uint32_t n = 0;
  if (!get(fd, &n, 4)) return {};
  std::vector<std::byte> b(n);
  return get(fd, b.data(), n) ? b : std::vector<std::byte>{};
}

/// Runs f in a child process; returns its pid.
template <class F>
pid_t child(F f) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  alarm(300);
  int rc = 1;
  try {
    rc = f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gear_fabric_bench child: %s\n", e.what());
  }
  _exit(rc);
}
int reap(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct raw_result {
  double gbps = 0, round_trip_us = 0;
};

/// Raw fi_writedata from a writer process into a target process: `bytes` per message, `window`
/// in flight (each into its own part of the target's memory), for `seconds`; then 1000 8-byte
/// round trips. Measured by the writer.
raw_result raw(const gear::transport::libfabric_config& config, std::size_t bytes, double seconds,
               int window = 64) {
  int fds[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
  auto target = child([&] {
    fabric::endpoint ep(config);
    fabric::host_region memory(bytes * window), echo(4096);
    const fabric::region r = ep.register_memory(memory.data(), memory.size(), FI_REMOTE_WRITE);
    const fabric::region e = ep.register_memory(echo.data(), echo.size(), FI_WRITE);
    const auto name = ep.name();
    const std::uint64_t info[] = {r.remote_address, r.key, name.size()};
    put(fds[0], info, sizeof(info));
    put(fds[0], name.data(), name.size());
    std::vector<std::uint8_t> writer(256);
    std::uint64_t n = 0;
    get(fds[0], &n, 8);
    writer.resize(n);
    get(fds[0], writer.data(), n);
    std::uint64_t peer_info[2];
    get(fds[0], peer_info, sizeof(peer_info));
    const fi_addr_t peer = ep.insert_peer(writer);
    bool done = false;
    int context = 0;
    while (!done) {  // count nothing: echo data = 1 (round trip), stop on data = 2
      ep.poll([&](const fabric::completion& c) {
        if (c.what != fabric::completion::kind::remote_write) return;
        if (c.data == 2) done = true;
        if (c.data == 1)
          while (!ep.try_writedata(e, 0, 8, peer, peer_info[0], peer_info[1], 1, &context))
            ep.poll([](const fabric::completion&) {});
      });
    }
    return 0;
  });
  fabric::endpoint ep(config);
  fabric::host_region source(bytes * window), echo(4096);
  const fabric::region s = ep.register_memory(source.data(), source.size(), FI_WRITE);
  const fabric::region e = ep.register_memory(echo.data(), echo.size(), FI_REMOTE_WRITE | FI_WRITE);
  std::uint64_t info[3];
  get(fds[1], info, sizeof(info));
  std::vector<std::uint8_t> name(info[2]);
  get(fds[1], name.data(), name.size());
  const fi_addr_t peer = ep.insert_peer(name);
  const auto mine = ep.name();
  const std::uint64_t n = mine.size();
  put(fds[1], &n, 8);
  put(fds[1], mine.data(), mine.size());
  const std::uint64_t echo_info[] = {e.remote_address, e.key};
  put(fds[1], echo_info, sizeof(echo_info));
  int in_flight = 0, context = 0;
  std::uint64_t sent = 0;
  auto drain = [&] {
    ep.poll([&](const fabric::completion& c) {
      in_flight -= c.what == fabric::completion::kind::written;
    });
  };
  // Warm-up, then timed.
  raw_result out;
  for (int phase = 0; phase < 2; ++phase) {
    const auto t = clock_type::now();
    sent = 0;
    while (seconds_since(t) < (phase == 0 ? 0.2 : seconds)) {
      if (in_flight < window &&
          ep.try_writedata(s, (sent % window) * bytes, bytes, peer,
                           info[0] + (sent % window) * bytes, info[1], 0, &context)) {
        ++in_flight;
        ++sent;
      } else {
        drain();
      }
    }
    while (in_flight > 0) drain();
    if (phase == 1) out.gbps = double(sent) * double(bytes) / seconds_since(t) / 1e9;
  }
  // Round trips: writedata(1), wait for its echo.
  const int trips = 1000;
  const auto t = clock_type::now();
  for (int i = 0; i < trips; ++i) {
    while (!ep.try_writedata(s, 0, 8, peer, info[0], info[1], 1, &context)) drain();
    bool back = false;
    while (!back)
      ep.poll([&](const fabric::completion& c) {
        back = back || c.what == fabric::completion::kind::remote_write;
      });
  }
  out.round_trip_us = seconds_since(t) / trips * 1e6;
  while (!ep.try_writedata(s, 0, 8, peer, info[0], info[1], 2, &context)) drain();
  for (int i = 0; i < 1000; ++i) drain();
  reap(target);
  close(fds[0]);
  close(fds[1]);
  return out;
}

/// Shard `id` with `count` trajectories of 16 steps (4 KiB each), serving until told; its blob
/// first. Asked 's', it answers its threads' busy seconds (progress, packer, writers, inserter).
pid_t start_shard(const gear::transport::libfabric_config& config, std::int64_t count, int fd,
                  std::uint32_t id = 0) {
  return child([&] {
    buffer buf{gear::capacity{4096}, gear::max_length{steps}};
    std::vector<std::uint8_t> data(static_cast<std::size_t>(steps) * 4096, 7);
    const std::int64_t lengths[] = {steps};
    gear::key k{};
    for (std::int64_t i = 0; i < count; ++i)
      buf.insert({lengths, {gear::input(data.data(), {4096})}}, std::span(&k, 1));
    gear::transport::shard_server<buffer>::options o;
    o.fabric = config;
    o.max_ring_blocks = 1024;
    o.shard = id;
    gear::transport::shard_server<buffer> server(buf, o);
    put_bytes(fd, server.address());
    for (char byte = 0; get(fd, &byte, 1) && byte == 's';) {
      const auto c = server.stats();
      const double busy[] = {c.progress_busy_s, c.packer_busy_s, c.writers_busy_s,
                             c.inserter_busy_s};
      if (!put(fd, busy, sizeof busy)) break;
    }
    return 0;
  });
}

}  // namespace

/// argv[a] as a number in [lo, hi], or nullopt (not a number, trailing characters, out of range).
std::optional<double> number_arg(const char* text, double lo, double hi) {
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(v >= lo && v <= hi)) return std::nullopt;
  return v;
}

constexpr const char* usage =
    "usage: gear_fabric_bench [provider] [seconds per phase, 0.01 to 3600] [rounds, 1 to 1000] "
    "[B, 1 to 1024 ...]\n       (default tcp;ofi_rxm, 1, 3, and B = 256 16 1)\n";

/// Samples into `out` one at a time for `seconds`, after 5 samples of warm-up: samples taken and
/// the seconds they took.
template <class Learner, class Batch>
std::pair<std::int64_t, double> one_at_a_time(Learner& l, Batch& out, const gear::window& w,
                                              gear::rng& g, double seconds) {
  for (int i = 0; i < 5; ++i) l.sample(out, w, g);
  std::int64_t n = 0;
  const auto t = clock_type::now();
  while (seconds_since(t) < seconds) {
    l.sample(out, w, g);
    ++n;
  }
  return {n, seconds_since(t)};
}

/// Keeps every batch of `batches` in flight for `seconds`, each taken back and begun again in
/// turn (after one such round of warm-up where `warm_up`), then takes them all back: samples
/// taken and the seconds they took. `started()` and `stopped(seconds)` run right around the
/// timed loop.
template <class Learner, class Batch, class Started, class Stopped>
std::pair<std::int64_t, double> pipelined(Learner& l, std::vector<Batch>& batches,
                                          const gear::window& w, gear::rng& g, double seconds,
                                          bool warm_up, Started&& started, Stopped&& stopped) {
  for (auto& b : batches) l.sample_begin(b, w, g);
  if (warm_up)
    for (auto& b : batches) {
      l.sample_end(b);
      l.sample_begin(b, w, g);
    }
  std::int64_t k = 0;
  started();
  const auto t = clock_type::now();
  while (seconds_since(t) < seconds) {
    Batch& b = batches[static_cast<std::size_t>(k) % batches.size()];
    l.sample_end(b);
    l.sample_begin(b, w, g);
    ++k;
  }
  const double phase = seconds_since(t);
  stopped(phase);
  for (auto& b : batches) l.sample_end(b);
  return {k, phase};
}

/// The whole run: `numbers` are the seconds per phase, the rounds and the batch sizes, as given.
int run(const gear::transport::libfabric_config& config, const std::vector<double>& numbers) {
  const double seconds = numbers.size() > 0 ? numbers[0] : 1.0;
  const int rounds = numbers.size() > 1 ? static_cast<int>(numbers[1]) : 3;
  auto progress = [](const char* what) { std::fprintf(stderr, "gear_fabric_bench: %s\n", what); };
  const std::int64_t window = steps;
  const std::size_t in_flight = gear::transport::max_samples_in_flight;
  const std::size_t entry_bytes = static_cast<std::size_t>(
      remote::layout_entry(spec::step_bytes, steps, 64 * 1024).total_bytes);
  progress("raw writedata: 64 KiB, 1 MiB, an insert entry");
  const raw_result raw64 = raw(config, 64 * 1024, seconds), raw1m = raw(config, 1 << 20, seconds);
  const raw_result raw_entry = raw(config, entry_bytes, seconds);

  int fds[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
  const pid_t shard = start_shard(config, 512, fds[0]);
  const std::vector<std::vector<std::byte>> blobs{get_bytes(fds[1])};
  // Sampling B rows of 16 steps of 4 KiB from one shard, one at a time and as many in flight as
  // a learner may have, each round against raw writedata of a reply's size measured just before.
  struct sampled {
    std::int64_t rows = 0;
    std::size_t reply_bytes = 0;
    std::vector<double> raw_reply, raw_shallow, sample_gbps, sample_us, pipelined_gbps;
    std::vector<double> alone_gbps;           // pipelined, every request sent alone (no bundles)
    std::array<std::vector<double>, 4> busy;  // pipelined: the shard's threads and the learner
  };
  // The shard's threads' busy seconds so far: progress, packer, writers.
  const auto shard_busy = [&] {
    std::array<double, 4> b{};
    if (!put(fds[1], "s", 1) || !get(fds[1], b.data(), sizeof b)) b = {};
    return b;
  };
  const auto sample_rounds = [&](std::int64_t rows) {
    sampled r;
    r.rows = rows;
    r.reply_bytes =
        static_cast<std::size_t>(remote::layout_reply(spec::step_bytes, rows, window).total_bytes);
    progress(("sample: B = " + std::to_string(rows) +
              " rows of 16 steps of 4 KiB from one shard, against raw writedata of a reply, " +
              std::to_string(rounds) + " rounds")
                 .c_str());
    for (int round = 0; round < rounds; ++round) {
      r.raw_shallow.push_back(raw(config, r.reply_bytes, seconds, int(in_flight)).gbps);
      gear::transport::remote_learner<spec>::options o;
      o.fabric = config;
      o.max_batch = rows;
      o.max_window = window;
      gear::transport::remote_learner<spec> learner(blobs, o);
      gear::batch<spec> out(gear::memory_kind::host, gear::batch_size{rows},
                            gear::window_length{window});
      gear::rng g{1};
      const auto [n, s] = one_at_a_time(learner, out, gear::window{.length = window}, g, seconds);
      r.sample_gbps.push_back(double(n) * double(r.reply_bytes) / s / 1e9);
      r.sample_us.push_back(s / double(n) * 1e6);
      // As many in flight as a learner may have (a training loop keeps the next batches
      // begun while it trains on one): the shard gathers a share while others are on the wire.
      // Then the same with every request sent alone (requests_per_message 1): what bundling
      // the requests gives.
      std::vector<gear::batch<spec>> batches;
      for (std::size_t i = 0; i < in_flight; ++i)
        batches.emplace_back(gear::memory_kind::host, gear::batch_size{rows},
                             gear::window_length{window});
      const auto rate = [&](gear::transport::remote_learner<spec>& l, bool busy) {
        std::array<double, 4> busy_before{};
        double waited_before = 0;
        const auto [k, phase] = pipelined(
            l, batches, gear::window{.length = window}, g, seconds, /*warm_up=*/false,
            [&] {
              busy_before = shard_busy();
              waited_before = l.waiting_seconds();
            },
            [&](double took) {
              const auto busy_after = shard_busy();
              if (!busy) return;
              for (std::size_t j = 0; j < 3; ++j)
                r.busy[j].push_back(100 * (busy_after[j] - busy_before[j]) / took);
              r.busy[3].push_back(100 * (1 - (l.waiting_seconds() - waited_before) / took));
            });
        return double(k) * double(r.reply_bytes) / phase / 1e9;
      };
      // The reference the pipelined phases are ratios of, measured just before them (the raw
      // rate drifts over a run: the closer in time, the less of that is in the ratio).
      r.raw_reply.push_back(raw(config, r.reply_bytes, seconds).gbps);
      r.pipelined_gbps.push_back(rate(learner, true));
      o.requests_per_message = 1;
      gear::transport::remote_learner<spec> alone(blobs, o);
      r.alone_gbps.push_back(rate(alone, false));
    }
    return r;
  };
  std::vector<sampled> samples;
  std::vector<std::int64_t> batch_sizes{256, 16, 1};  // or those named after the rounds
  if (numbers.size() > 2) batch_sizes.assign(numbers.begin() + 2, numbers.end());
  for (const std::int64_t rows : batch_sizes) samples.push_back(sample_rounds(rows));

  // Inserting: the actors connect, then start together; each counts what it inserted in its
  // own `seconds`, and the figure is the sum of their rates (process start and greeting left
  // out). The busy shares of the shard's progress and inserter threads are printed beside.
  // With keys, each call waits for its acknowledgements; without, an actor keeps its staging
  // ring in flight and flushes at the end (inside its time).
  double insert_gbps[4] = {}, insert_busy[4][2] = {};  // busy: progress, inserter
  const int actor_counts[4] = {2, 8, 2, 8};
  for (int k = 0; k < 4; ++k) {
    const bool with_keys = k < 2;
    progress((std::string("insert: ") + std::to_string(actor_counts[k]) + " actors" +
              (with_keys ? "" : ", without keys"))
                 .c_str());
    int ready[2], go[2], result[2];
    if (pipe(ready) != 0 || pipe(go) != 0 || pipe(result) != 0) return 1;
    std::vector<pid_t> actors;
    for (int a = 0; a < actor_counts[k]; ++a)
      actors.push_back(child([&] {
        for (const int fd : {ready[0], go[1], result[0]}) close(fd);  // the parent's ends
        gear::transport::remote_actor<spec>::options o;
        o.fabric = config;
        o.ring_blocks = 64;
        gear::transport::remote_actor<spec> actor(blobs, o);
        std::vector<std::uint8_t> data(static_cast<std::size_t>(steps) * 4096, 3);
        std::vector<std::int64_t> lengths(16, steps);
        std::vector<std::uint8_t> many(lengths.size() * data.size(), 3);
        std::vector<gear::key> keys(lengths.size());
        char c = 0;
        const bool said = put(ready[1], &c, 1);
        close(ready[1]);  // the parent's read ends once every actor said or died
        if (!said || !get(go[0], &c, 1)) return 1;
        std::int64_t inserted = 0;
        const auto start = clock_type::now();
        while (seconds_since(start) < seconds) {
          const gear::trajectories<spec> in{lengths, {gear::input(many.data(), {4096})}};
          if (with_keys)
            actor.insert(in, keys);
          else
            actor.insert(in);
          inserted += static_cast<std::int64_t>(lengths.size());
        }
        actor.flush();
        const double rate = double(inserted) * double(steps * 4096) / seconds_since(start);
        return put(result[1], &rate, sizeof(rate)) ? 0 : 1;
      }));
    for (const int fd : {ready[1], go[0], result[1]})
      close(fd);  // the actors' ends: EOF if they die
    bool all_ready = true;
    for (std::size_t a = 0; a < actors.size(); ++a) {
      char c = 0;
      all_ready = all_ready && get(ready[0], &c, 1);
    }
    const auto busy_before = shard_busy();
    const auto t = clock_type::now();
    for (std::size_t a = 0; a < actors.size() && all_ready; ++a) (void)put(go[1], "g", 1);
    close(go[1]);  // an actor still waiting (one did not start) gives up
    int failed = all_ready ? 0 : 1;
    for (pid_t a : actors) {
      double rate = 0;
      if (all_ready && get(result[0], &rate, sizeof(rate))) insert_gbps[k] += rate / 1e9;
      failed += reap(a) != 0 ? 1 : 0;
    }
    if (failed != 0) {
      std::fprintf(stderr, "gear_fabric_bench: %d actors failed: no insert figure\n", failed);
      insert_gbps[k] = 0;
    }
    const auto busy_after = shard_busy();
    const double window = seconds_since(t);
    insert_busy[k][0] = 100 * (busy_after[0] - busy_before[0]) / window;
    insert_busy[k][1] = 100 * (busy_after[3] - busy_before[3]) / window;
    close(ready[0]);
    close(result[0]);
  }
  // Sampling over several shards: the same learner loop (B = 256, as many in flight as it may
  // have) over the first S of 8 shards, and one sample of B = 16 at a time, each against S = 1
  // in the same run. On shm a learner registers each batch on every shard's inlet and polls an
  // inlet per shard: what that costs shows as S grows.
  const std::array<std::size_t, 4> shard_counts{1, 2, 4, 8};
  std::vector<std::vector<std::byte>> many_blobs{blobs[0]};
  std::vector<std::array<int, 2>> more_fds;
  std::vector<pid_t> more_shards;
  for (std::size_t i = 1; i < shard_counts.back(); ++i) {
    std::array<int, 2> f{};
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, f.data()) != 0) return 1;
    more_fds.push_back(f);
    more_shards.push_back(start_shard(config, 512, f[0], static_cast<std::uint32_t>(i)));
    many_blobs.push_back(get_bytes(f[1]));
  }
  std::array<std::vector<double>, 4> over_gbps, over_us;  // by shard count, the rounds
  for (int round = 0; round < rounds; ++round)
    for (std::size_t k = 0; k < shard_counts.size(); ++k) {
      progress(("sample over " + std::to_string(shard_counts[k]) + " shards").c_str());
      const std::span<const std::vector<std::byte>> some(many_blobs.data(), shard_counts[k]);
      gear::transport::remote_learner<spec>::options o;
      o.fabric = config;
      o.max_batch = 256;
      o.max_window = window;
      gear::transport::remote_learner<spec> learner(some, o);
      std::vector<gear::batch<spec>> batches;
      for (std::size_t i = 0; i < in_flight; ++i)
        batches.emplace_back(gear::memory_kind::host, gear::batch_size{256},
                             gear::window_length{window});
      gear::rng g{2};
      const gear::window w{.length = window};
      // Warm-up: every batch registered and answered once.
      const auto [n, phase] = pipelined(
          learner, batches, w, g, seconds, /*warm_up=*/true, [] {}, [](double) {});
      const std::size_t bytes = static_cast<std::size_t>(256 * window * 4096);
      over_gbps[k].push_back(double(n) * double(bytes) / phase / 1e9);
      gear::batch<spec> small(gear::memory_kind::host, gear::batch_size{16},
                              gear::window_length{window});
      const auto [m, took] = one_at_a_time(learner, small, w, g, seconds / 2);
      over_us[k].push_back(took / double(m) * 1e6);
    }
  for (std::size_t i = 0; i < more_shards.size(); ++i) {
    (void)put(more_fds[i][1], "q", 1);
    reap(more_shards[i]);
    close(more_fds[i][0]);
    close(more_fds[i][1]);
  }
  (void)put(fds[1], "q", 1);
  reap(shard);

  std::printf("provider %s, %.1f s per phase\n", config.provider.c_str(), seconds);
  std::printf("%-52s %12s %16s %8s\n", "operation", "figure", "reference", "ratio");
  std::printf("%-52s %7.2f GB/s %16s\n", "raw fi_writedata 64 KiB, 64 in flight", raw64.gbps, "");
  std::printf("%-52s %7.2f GB/s %16s\n", "raw fi_writedata 1 MiB, 64 in flight", raw1m.gbps, "");
  std::printf("%-52s %7.1f us %16s\n", "raw 8-byte round trip", raw64.round_trip_us, "");
  // Medians over the rounds; a ratio's is the median of the rounds' ratios, which are listed.
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  auto ratios = [&](const std::vector<double>& figure, const std::vector<double>& reference) {
    std::vector<double> r;
    for (std::size_t i = 0; i < figure.size(); ++i) r.push_back(100 * figure[i] / reference[i]);
    return r;
  };
  auto listed = [](const std::vector<double>& r) {
    std::string out;
    for (const double x : r) {
      char one[32];
      std::snprintf(one, sizeof(one), "%s%.1f%%", out.empty() ? "" : " ", x);
      out += one;
    }
    return out;
  };
  for (const sampled& m : samples) {
    const auto one_ratios = ratios(m.sample_gbps, m.raw_reply),
               two_ratios = ratios(m.pipelined_gbps, m.raw_reply);
    char what[64];
    std::snprintf(what, sizeof what, "sample B=%lld x 16 x 4 KiB (%.0f KiB replies)",
                  static_cast<long long>(m.rows), double(m.reply_bytes) / 1024);
    std::printf("%-52s %7.2f GB/s %11.2f GB/s %7.1f%%   rounds: %s\n", what, median(m.sample_gbps),
                median(m.raw_reply), median(one_ratios), listed(one_ratios).c_str());
    std::snprintf(what, sizeof what, "  %zu in flight (sample_begin ahead)", in_flight);
    std::printf("%-52s %7.2f GB/s %11.2f GB/s %7.1f%%   rounds: %s\n", what,
                median(m.pipelined_gbps), median(m.raw_reply), median(two_ratios),
                listed(two_ratios).c_str());
    const auto alone = ratios(m.alone_gbps, m.raw_reply);
    std::printf("%-52s %7.2f GB/s %11.2f GB/s %7.1f%%   rounds: %s\n",
                "  the same, every request sent alone (no bundles)", median(m.alone_gbps),
                median(m.raw_reply), median(alone), listed(alone).c_str());
    const auto same_depth = ratios(m.pipelined_gbps, m.raw_shallow);
    std::snprintf(what, sizeof what, "  the same, against raw with %zu in flight", in_flight);
    std::printf("%-52s %7.2f GB/s %11.2f GB/s %7.1f%%   rounds: %s\n", what,
                median(m.pipelined_gbps), median(m.raw_shallow), median(same_depth),
                listed(same_depth).c_str());
    std::printf("%-52s %5.0f%% / %4.0f%% / %4.0f%%; %4.0f%% busy\n",
                "  busy: shard progress / packer / writer; learner", median(m.busy[0]),
                median(m.busy[1]), median(m.busy[2]), median(m.busy[3]));
    std::snprintf(what, sizeof what, "  latency B=%lld, against the round trip",
                  static_cast<long long>(m.rows));
    std::printf("%-52s %7.0f us %13.1f us %7.1fx\n", what, median(m.sample_us), raw64.round_trip_us,
                median(m.sample_us) / raw64.round_trip_us);
  }
  for (int k = 0; k < 4; ++k)
    std::printf(
        "%-52s %7.2f GB/s %11.2f GB/s %7.1f%%   shard progress / inserter %.0f%% / "
        "%.0f%% busy\n",
        (std::to_string(actor_counts[k]) + " actors inserting 64 KiB trajectories" +
         (k < 2 ? "" : ", no keys"))
            .c_str(),
        insert_gbps[k], raw_entry.gbps, 100 * insert_gbps[k] / raw_entry.gbps, insert_busy[k][0],
        insert_busy[k][1]);
  for (std::size_t k = 0; k < shard_counts.size(); ++k) {
    const auto by_rate = ratios(over_gbps[k], over_gbps[0]);
    std::vector<double> by_time;  // one shard's time per sample over this one's: higher, faster
    for (std::size_t i = 0; i < over_us[k].size(); ++i)
      by_time.push_back(100 * over_us[0][i] / over_us[k][i]);
    char what[64];
    std::snprintf(what, sizeof what, "sample B=256 over %zu shards, %zu in flight", shard_counts[k],
                  in_flight);
    std::printf("%-52s %7.2f GB/s %11.2f GB/s %7.1f%%   rounds: %s\n", what, median(over_gbps[k]),
                median(over_gbps[0]), median(by_rate), listed(by_rate).c_str());
    std::snprintf(what, sizeof what, "  latency B=16, against one shard's");
    std::printf("%-52s %7.0f us %13.0f us %7.1f%%   rounds: %s\n", what, median(over_us[k]),
                median(over_us[0]), median(by_time), listed(by_time).c_str());
  }
  close(fds[0]);
  close(fds[1]);
  return 0;
}

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a write to a dead child fails instead of killing the bench
  gear::transport::libfabric_config config;
  if (argc > 1 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0))
    return std::printf("%s", usage), 0;
  if (argc > 1) config.provider = argv[1];
  std::vector<double> numbers;  // seconds, rounds, then the batch sizes
  for (int a = 2; a < argc; ++a) {
    const auto v =
        a == 2 ? number_arg(argv[a], 0.01, 3600) : number_arg(argv[a], 1, a == 3 ? 1000 : 1024);
    if (!v || (a >= 3 && *v != static_cast<double>(static_cast<std::int64_t>(*v)))) {
      std::fprintf(stderr, "gear_fabric_bench: argument %d ('%s') is out of range\n%s", a - 1,
                   argv[a], usage);
      return 2;
    }
    numbers.push_back(*v);
  }
  try {  // the provider, before any process is started for it
    const fabric::endpoint probe(config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gear_fabric_bench: provider '%s' cannot be opened here: %s\n%s",
                 config.provider.c_str(), e.what(), usage);
    return 2;
  }
  try {
    return run(config, numbers);
  } catch (const std::exception& e) {  // the children see their sockets close, and stop
    std::fprintf(stderr, "gear_fabric_bench: %s\n", e.what());
    return 1;
  }
}
