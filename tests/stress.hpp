#pragma once
// A stress test shared by the host suite (storage::host, run under ThreadSanitizer in CI) and the
// gpu suite (pinned_host, device, mixed): threads insert, write step by step, sample, update
// priorities and erase on one buffer at once, each on its own stream, with no lock of their own.
// Every step of every trajectory carries the trajectory's id, the step's index and a checksum, so
// a sampled row proves it is not torn (all its steps from one trajectory, in order, intact), and
// the (ticket, id) pairs samples saw are checked afterwards against what the inserts returned.
// With a consuming policy (fifo, lifo) the run also checks that no trajectory is returned twice,
// that each sample's rows come in the policy's order, and that what is left afterwards was never
// returned; with a limit of returns (set_max_times_sampled), that no trajectory is returned more
// often than the limit (with replacement, that no trajectory comes back in more samples than the
// limit: one sample may return it several times as it takes it to its limit).

#include <gear/gear.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace gear_stress {

using spec = gear::spec<gear::column<"v", std::int64_t, 3>, gear::column<"r", float>>;
inline constexpr std::int64_t max_len = 8;
inline constexpr std::int64_t window_len = 4;

inline std::int64_t checksum(std::int64_t id, std::int64_t t) noexcept {
  return (id * 0x9E3779B97F4A7C15ll) ^ (t * 0xC2B2AE3D27D4EB4Fll) ^ 0x5bd1e995;
}

/// Where a key's trajectory lives: its shard and ticket.
using where = std::pair<std::uint32_t, std::uint64_t>;
inline where where_of(const gear::key& k) noexcept { return {k.shard, k.ticket}; }

struct result {
  std::int64_t operations = 0, rows = 0, torn = 0, wrong_key = 0, unknown_key = 0;
  // With a limit of returns only: returns past a trajectory's limit (a consuming policy's is 1;
  // a trajectory still stored after the run counts as one more return), and samples whose rows
  // were out of the policy's order (a queue's) or named one trajectory twice.
  std::int64_t returned_too_often = 0, out_of_order = 0;
};

/// Whether Buffer's selection removes what it returns (fifo: oldest first, lifo: newest first).
/// (sharded_buffer names no selection_type: its runs use a policy that does not consume.)
template <class Buffer>
inline constexpr bool consuming = [] {
  if constexpr (requires { typename Buffer::selection_type; })
    return gear::consuming_policy<typename Buffer::selection_type>;
  else
    return false;
}();
template <class Buffer>
inline constexpr bool oldest_first = [] {
  if constexpr (requires { typename Buffer::selection_type; })
    return std::is_same_v<typename Buffer::selection_type, gear::select::fifo>;
  else
    return false;
}();

/// Runs `threads` threads of `ops_each` operations on `buf`. streams.get(i) gives thread i's
/// stream, streams.sync(i) waits for it; fetch(batch, stream) returns the batch's keys, mask and
/// column 0 in host memory. max_returns > 0 sets the buffer's max_times_sampled (without
/// replacement one sample returns a trajectory once; with it, the limit bounds the samples that
/// return a trajectory).
template <class Buffer, class Streams, class Fetch>
result run(Buffer& buf, int threads, std::int64_t ops_each, std::uint64_t seed, Streams& streams,
           Fetch&& fetch, std::int64_t max_returns = 0) {
  if constexpr (requires { buf.set_max_times_sampled(max_returns); })
    if (max_returns > 0) buf.set_max_times_sampled(max_returns);
  if constexpr (consuming<Buffer>) max_returns = 1;
  // Whether one sample names each trajectory once (uniform without replacement).
  const bool distinct_rows = [&] {
    if constexpr (requires { buf.selection().replacement; })
      return !buf.selection().replacement;
    else
      return false;
  }();
  std::mutex log_mutex;
  std::map<where, std::int64_t> id_of_ticket;  // from insert and commit results
  std::vector<std::pair<where, std::int64_t>> seen;  // (where, id) from samples
  std::vector<where> returns;  // one per trajectory a sample returned (once however many rows)
  std::atomic<std::int64_t> next_id{1}, rows{0}, torn{0}, out_of_order{0};
  // Rows per sample: fewer where a sample needs as many stored trajectories as rows.
  const std::int64_t rows_each = max_returns > 0 ? 4 : 16;

  auto worker = [&](int me) {
    std::mt19937_64 gen(seed * 1000 + static_cast<std::uint64_t>(me));
    auto stream = streams.get(me);
    auto batch = buf.make_batch(gear::batch_size{rows_each}, gear::window_length{window_len});
    gear::rng g{seed + static_cast<std::uint64_t>(me)};
    std::vector<gear::key> mine;
    std::vector<std::pair<where, std::int64_t>> local_seen, local_log;
    std::vector<where> local_returns;
    for (std::int64_t op = 0; op < ops_each; ++op) {
      const int kind = static_cast<int>(gen() % 10);
      if (kind < 4) {  // insert 1-3 trajectories from host memory
        const std::int64_t n = 1 + static_cast<std::int64_t>(gen() % 3);
        std::vector<std::int64_t> lens, ids;
        std::vector<std::int64_t> v;
        std::vector<float> r;
        for (std::int64_t i = 0; i < n; ++i) {
          const std::int64_t len = 1 + static_cast<std::int64_t>(gen() % max_len);
          const std::int64_t id = next_id++;
          lens.push_back(len);
          ids.push_back(id);
          for (std::int64_t t = 0; t < len; ++t) {
            v.insert(v.end(), {id, t, checksum(id, t)});
            r.push_back(static_cast<float>(id));
          }
        }
        std::vector<gear::key> keys(static_cast<std::size_t>(n));
        buf.insert_async(gear::trajectories<spec>{lens, {gear::input(v.data(), {3}), gear::input(r.data())}},
                         keys, stream);
        for (std::int64_t i = 0; i < n; ++i) {
          local_log.emplace_back(where_of(keys[i]), ids[i]);
          mine.push_back(keys[i]);
        }
      } else if (kind < 5) {  // a writer (buffers that have them: not sharded_buffer)
        if constexpr (requires { buf.make_writer(stream); }) {
          auto w = buf.make_writer(stream);
          const std::int64_t id = next_id++;
          const std::int64_t len = 1 + static_cast<std::int64_t>(gen() % max_len);
          try {
            for (std::int64_t t = 0; t < len; ++t) {
              const std::int64_t step[3] = {id, t, checksum(id, t)};
              const float rew = static_cast<float>(id);
              w.append(step, &rew);
            }
            const gear::key k = w.commit_async();
            local_log.emplace_back(where_of(k), id);
            mine.push_back(k);
          } catch (const gear::error& e) {
            // Other threads reserved capacity slots meanwhile and took the slot over.
            if (e.code() != gear::errc::invalid_reservation) throw;
          }
        }
      } else if (kind < 8) {  // sample, check every row, update priorities
        if (buf.size() == 0) continue;
        try {
          buf.sample_async(batch, gear::window{.length = window_len}, g, stream);
        } catch (const gear::error& e) {
          // Erased (or, for a queue, taken) meanwhile.
          if (e.code() != gear::errc::empty_buffer && e.code() != gear::errc::not_enough_items)
            throw;
          continue;
        }
        const auto view = fetch(batch, stream);
        if constexpr (consuming<Buffer>) {  // one shard: tickets give the insertion order
          for (std::int64_t row = 1; row < rows_each; ++row) {
            const auto before = view.keys[row - 1].ticket, at = view.keys[row].ticket;
            if (oldest_first<Buffer> ? at <= before : at >= before) {
              ++out_of_order;
              break;
            }
          }
        } else if (max_returns > 0) {
          std::set<where> distinct;
          for (std::int64_t row = 0; row < rows_each; ++row)
            distinct.insert(where_of(view.keys[row]));
          if (distinct_rows && static_cast<std::int64_t>(distinct.size()) != rows_each)
            ++out_of_order;
          local_returns.insert(local_returns.end(), distinct.begin(), distinct.end());
        }
        for (std::int64_t row = 0; row < rows_each; ++row) {
          ++rows;
          std::int64_t id = -1, steps = 0;
          bool bad = false;
          for (std::int64_t t = 0; t < window_len; ++t) {
            if (!view.mask[row * window_len + t]) continue;
            const std::int64_t* s = &view.v[(row * window_len + t) * 3];
            if (id < 0) id = s[0];
            bad |= s[0] != id || s[1] != t || s[2] != checksum(s[0], s[1]);
            ++steps;
          }
          if (bad || steps == 0) ++torn;
          else local_seen.emplace_back(where_of(view.keys[row]), id);
        }
        if constexpr (requires { buf.update_priorities_async(view.keys, std::vector<float>{}, stream); }) {
          std::vector<float> p(rows_each);
          for (auto& x : p) x = static_cast<float>(gen() % 100) / 10.0f;
          const gear::priority_update_result res = buf.update_priorities_async(view.keys, p, stream);
          if (res.applied + res.stale != rows_each) ++torn;
        }
      } else if (!mine.empty()) {  // erase one of mine, if still stored
        const gear::key k = mine[gen() % mine.size()];
        try {
          buf.erase_async(std::span<const gear::key>(&k, 1), stream);
        } catch (const gear::error& e) {
          if (e.code() != gear::errc::stale_key) throw;
        }
      }
    }
    streams.sync(me);
    const std::scoped_lock lock(log_mutex);
    for (auto& [t, id] : local_log) id_of_ticket[t] = id;
    seen.insert(seen.end(), local_seen.begin(), local_seen.end());
    returns.insert(returns.end(), local_returns.begin(), local_returns.end());
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker, i);
  for (auto& t : pool) t.join();

  result out;
  out.operations = threads * ops_each;
  out.rows = rows;
  out.torn = torn;
  out.out_of_order = out_of_order;
  for (auto& [ticket, id] : seen) {
    const auto it = id_of_ticket.find(ticket);
    if (it == id_of_ticket.end()) ++out.unknown_key;
    else if (it->second != id) ++out.wrong_key;
  }
  std::map<where, std::int64_t> returned;
  if constexpr (consuming<Buffer>) {
    for (auto& [w, id] : seen) out.returned_too_often += ++returned[w] > max_returns;
  } else if (max_returns > 0) {
    for (auto& w : returns) out.returned_too_often += ++returned[w] > max_returns;
  }
  if constexpr (consuming<Buffer>) {
    // Each trajectory is returned once: by one sample, or by none and still stored now. The
    // final sample takes everything left, on thread 0's stream.
    if (const std::int64_t left = buf.size(); left > 0) {
      auto rest = buf.make_batch(gear::batch_size{left}, gear::window_length{window_len});
      gear::rng g{seed};
      buf.sample_async(rest, gear::window{.length = window_len}, g, streams.get(0));
      const auto view = fetch(rest, streams.get(0));
      for (std::int64_t row = 0; row < left; ++row)
        out.returned_too_often += returned.count(where_of(view.keys[row]));
      out.rows += left;
    }
    if (buf.size() != 0) ++out.returned_too_often;  // the final sample left something behind
  }
  return out;
}

/// What every storage's stress run must show.
inline void check(const result& r, std::int64_t threads, std::int64_t ops_each) {
  MESSAGE(r.operations << " operations, " << r.rows << " rows sampled");
  CHECK(r.operations == threads * ops_each);
  CHECK(r.rows > 0);
  CHECK(r.torn == 0);
  CHECK(r.wrong_key == 0);
  CHECK(r.unknown_key == 0);
  CHECK(r.returned_too_often == 0);
  CHECK(r.out_of_order == 0);
}

}  // namespace gear_stress
