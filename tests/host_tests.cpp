// Host suite: the whole storage::host path, the index maths the kernels share, and every error.
// Compiled by the plain C++ compiler; needs no GPU. Removal, queues, recency and errors are in
// host_removal_tests.cpp.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <gear/detail/buffer/landing.hpp>
#include <gear/detail/buffer/landing_state.hpp>
#include <gear/detail/column_blocks.hpp>
#include <gear/detail/host_copy.hpp>
#include <gear/detail/scatter.hpp>
#include <gear/dlpack.hpp>
#include <map>
#include <optional>
#include <memory_resource>
#include <random>
#include <set>
#include <span>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include "host_common.hpp"

using namespace host_test;

// ---- index maths ------------------------------------------------------------------------------

TEST_CASE("align_up and segment sizes") {
  for (std::int64_t x = 0; x < 1000; ++x) {
    const std::int64_t a = gear::align_up(x, 128);
    CHECK(a % 128 == 0);
    CHECK(a >= x);
    CHECK(a - x < 128);
  }
  CHECK(gear::detail::segment_bytes(24, 5) == 128);
  CHECK(gear::detail::segment_bytes(1 << 20, 3) == 3 << 20);
  constexpr auto g = gear::detail::column_geometry{nullptr, 4096, 24};
  CHECK(g.at(3, 2) - static_cast<std::byte*>(nullptr) == 3 * 4096 + 48);
}

TEST_CASE("plan_window keeps every copy inside the trajectory and the row") {
  for (std::int64_t len = 1; len <= 20; ++len)
    for (std::int64_t L = 1; L <= 24; ++L)
      for (std::int64_t off = 0; off < 22; ++off)
        for (auto from : {gear::anchor::start, gear::anchor::end, gear::anchor::random})
          for (auto padding : {gear::pad::head, gear::pad::tail})
            for (std::uint64_t bits : {0ull, 0x123456789abcdefull, ~0ull}) {
              const gear::window w{L, off, from, padding};
              const auto p = gear::plan_window(w, len, bits);
              REQUIRE(p.count >= 0);
              REQUIRE(p.count <= std::min(L, len));
              REQUIRE(p.src_step >= 0);
              REQUIRE(p.src_step + p.count <= len);
              REQUIRE(p.dst_pos >= 0);
              REQUIRE(p.dst_pos + p.count <= L);
              if (padding == gear::pad::tail) REQUIRE(p.dst_pos == 0);
              if (padding == gear::pad::head) REQUIRE(p.dst_pos + p.count == L);
              if (from != gear::anchor::random) {
                // Independent reference: the positions of [first, first + L) inside [0, len).
                const auto ref = reference_row(w, len, reference_first(w, len));
                std::int64_t valid = 0;
                for (auto s : ref.steps) valid += s >= 0;
                REQUIRE(p.count == valid);
                if (valid > 0)
                  REQUIRE(ref.steps[static_cast<std::size_t>(p.dst_pos)] == p.src_step);
              } else if (len - L > off) {
                REQUIRE(p.count == L);
                REQUIRE(p.src_step >= off);
                REQUIRE(p.src_step <= len - L);
              }
            }
}

TEST_CASE("Philox-4x32-10 known-answer vectors (Random123)") {
  using gear::detail::philox;
  const auto a = philox({0, 0, 0, 0}, 0, 0);
  CHECK(a.x == 0x6627e8d5u);
  CHECK(a.y == 0xe169c58du);
  CHECK(a.z == 0xbc57ac4cu);
  CHECK(a.w == 0x9b00dbd8u);
  const auto b = philox({~0u, ~0u, ~0u, ~0u}, ~0u, ~0u);
  CHECK(b.x == 0x408f276du);
  CHECK(b.y == 0x41c83b0eu);
  CHECK(b.z == 0xa20bc7c6u);
  CHECK(b.w == 0x6d5451fdu);
  const auto c =
      philox({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u);
  CHECK(c.x == 0xd16cfe09u);
  CHECK(c.y == 0x94fdccebu);
  CHECK(c.z == 0x5001e420u);
  CHECK(c.w == 0x24126ea1u);
}

TEST_CASE("mulhi64 equals the high half of the 128-bit product") {
  std::mt19937_64 gen(7);
  for (int i = 0; i < 100000; ++i) {
    const std::uint64_t a = gen(), b = i % 3 == 0 ? gen() >> (i % 64) : gen();
    const auto want = static_cast<std::uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
    REQUIRE(gear::detail::mulhi64(a, b) == want);
  }
}

TEST_CASE("claim_slot claims each slot exactly once") {
  std::vector<std::uint64_t> table(static_cast<std::size_t>(gear::detail::claim_table_size(500)));
  CHECK(table.size() >= 1000);
  std::set<std::int64_t> seen;
  std::mt19937_64 gen(3);
  for (int i = 0; i < 2000 && seen.size() < 500; ++i) {
    const auto slot = static_cast<std::int64_t>(gen() % 700);
    const bool fresh = !seen.contains(slot);
    if (fresh && seen.size() >= 500) break;
    REQUIRE(gear::detail::claim_slot(table.data(), std::int64_t(table.size()), slot) == fresh);
    seen.insert(slot);
  }
  // The largest slots of the largest buffer (capacity 2^40), whose tags need 41 bits.
  std::fill(table.begin(), table.end(), 0);
  const std::int64_t top = (std::int64_t{1} << 40) - 1;
  for (const auto& [slot, fresh] : std::vector<std::pair<std::int64_t, bool>>{
           {top, true}, {top - 1, true}, {0, true}, {top, false}, {top - 1, false}, {0, false}})
    CHECK(gear::detail::claim_slot(table.data(), std::int64_t(table.size()), slot) == fresh);
}

TEST_CASE("packed copies split over threads write every byte once, where it belongs") {
  std::mt19937_64 gen(12);
  for (int trial = 0; trial < 20; ++trial) {
    const auto lens = random_lengths(gen, 1 + gen() % 9, 50);
    const std::int64_t step = 1 + static_cast<std::int64_t>(gen() % 40);
    std::int64_t total = 0;
    for (auto l : lens) total += l * step;
    std::vector<std::byte> src(static_cast<std::size_t>(total));
    for (auto& b : src) b = std::byte(gen());
    // Destination: trajectory i at offset 64 * 50 * step * i, the gaps must stay untouched.
    const std::int64_t stride = 50 * step + 64;
    for (unsigned parts : {1u, 2u, 3u, 7u}) {
      std::vector<std::byte> dst(static_cast<std::size_t>(stride * std::int64_t(lens.size())),
                                 std::byte{0xEE});
      auto dst_of = [&](std::size_t i) { return dst.data() + stride * std::int64_t(i); };
      gear::detail::parallel_for(parts, [&](unsigned t) {
        gear::detail::copy_packed_share(src.data(), lens, step, dst_of, t, parts);
      });
      std::int64_t at = 0;
      for (std::size_t i = 0; i < lens.size(); ++i) {
        const std::int64_t bytes = lens[i] * step;
        REQUIRE(std::memcmp(dst_of(i), src.data() + at, static_cast<std::size_t>(bytes)) == 0);
        for (std::int64_t b = bytes; b < stride; ++b) REQUIRE(dst_of(i)[b] == std::byte{0xEE});
        at += bytes;
      }
    }
  }
  CHECK(gear::detail::copy_threads_for(1) == 1);
  CHECK(gear::detail::copy_threads_for(std::int64_t{1} << 40) >= 1);
}

TEST_CASE(
    "scatter blocks, planned and on the grid: every byte of every row's segment copied once, "
    "where it belongs; the plan has a block per chunk a row has") {
  // The kernel's own mapping (scatter.hpp: scatter_locate, scatter_piece_of), run block by block
  // on the host, a byte loop for block_copy.
  using namespace gear::detail;
  std::mt19937_64 gen(31);
  const std::int64_t steps_of[] = {1, 12, 4104};  // 4104: chunks end mid-step
  for (int trial = 0; trial < 12; ++trial) {
    const bool uneven = trial % 3 != 0;
    const std::int64_t count = 1 + static_cast<std::int64_t>(gen() % 40);
    const std::int64_t max_len = 40;
    std::vector<std::int64_t> lens(static_cast<std::size_t>(count));
    for (auto& l : lens) l = uneven ? 1 + static_cast<std::int64_t>(gen() % max_len) : max_len;
    if (uneven) lens[gen() % lens.size()] = max_len;
    std::int64_t steps = 0;
    std::vector<scatter_row> rows;
    for (std::int64_t i = 0; i < count; ++i) {
      // Slots in reverse, one spare slot between rows: the gaps must stay untouched.
      rows.push_back({2 * (count - 1 - i), steps, lens[static_cast<std::size_t>(i)], 0});
      steps += lens[static_cast<std::size_t>(i)];
    }
    scatter_args a;
    a.count = count;
    a.max_count_length = *std::max_element(lens.begin(), lens.end());
    a.num_columns = 3;
    std::vector<std::vector<std::byte>> src(3), dst(3);
    std::vector<std::vector<int>> writes(3);
    for (int c = 0; c < 3; ++c) {
      src[c].resize(static_cast<std::size_t>(steps * steps_of[c]));
      for (auto& b : src[c]) b = std::byte(gen());
      const std::int64_t stride = max_len * steps_of[c];
      dst[c].assign(static_cast<std::size_t>(stride * 2 * count), std::byte{0xEE});
      writes[c].assign(dst[c].size(), 0);
      a.columns[c] = {src[c].data(), dst[c].data(), stride, steps_of[c]};
    }
    const column_blocks g = scatter_grid(a);
    const std::int64_t grid = g.first_block[3];
    const std::int64_t planned = plan_scatter_blocks(a, lens.data(), nullptr);
    REQUIRE(planned <= scatter_plan_bound(count, steps, steps_of, 3));
    if (!uneven) CHECK(planned == grid);
    std::vector<scatter_block> plan(static_cast<std::size_t>(planned));
    REQUIRE(plan_scatter_blocks(a, lens.data(), plan.data()) == planned);
    CHECK(a.first_block[3] == planned);

    // Block `block` as the kernel sees it; false if it copies nothing.
    auto copy = [&](std::int64_t block) {
      int c;
      std::int64_t row, chunk;
      scatter_locate(a, g, block, c, row, chunk);
      const scatter_piece p = scatter_piece_of(a, rows[static_cast<std::size_t>(row)], c, chunk);
      for (std::int64_t k = 0; k < p.bytes; ++k) {
        p.dst[k] = p.src[k];
        ++writes[c][static_cast<std::size_t>(p.dst + k - dst[c].data())];
      }
      return p.bytes > 0;
    };
    auto check_and_reset = [&] {
      std::int64_t wrong_count = 0, wrong_byte = 0;
      for (int c = 0; c < 3; ++c) {
        for (std::size_t b = 0; b < dst[c].size(); ++b) {
          const std::int64_t slot = static_cast<std::int64_t>(b) / a.columns[c].slot_stride;
          const std::int64_t off = static_cast<std::int64_t>(b) % a.columns[c].slot_stride;
          const std::int64_t i = slot % 2 == 0 ? count - 1 - slot / 2 : -1;
          const bool in_row = i >= 0 && off < lens[static_cast<std::size_t>(i)] * steps_of[c];
          wrong_count += writes[c][b] != (in_row ? 1 : 0);
          const std::byte want =
              in_row ? src[c][static_cast<std::size_t>(
                           rows[static_cast<std::size_t>(i)].src_step * steps_of[c] + off)]
                     : std::byte{0xEE};
          wrong_byte += dst[c][b] != want;
        }
        std::fill(dst[c].begin(), dst[c].end(), std::byte{0xEE});
        std::fill(writes[c].begin(), writes[c].end(), 0);
      }
      CHECK(wrong_count == 0);  // bytes written other than once (in a row) or never (outside)
      CHECK(wrong_byte == 0);
    };
    // Planned: every block copies bytes.
    a.blocks = plan.data();
    std::int64_t idle = 0;
    for (std::int64_t block = 0; block < planned; ++block) idle += !copy(block);
    CHECK(idle == 0);
    check_and_reset();
    // The grid: count x chunks(longest) per column, blocks past a row's end copy nothing.
    a.blocks = nullptr;
    for (std::int64_t block = 0; block < grid; ++block) idle += !copy(block);
    CHECK(idle == grid - planned);
    check_and_reset();
  }
  // When a plan pays: lengths 1 and 40 of 1, 12 and 4104 bytes a step take 1 + 1, 1 + 1 and 1 + 11
  // chunks (16 blocks) where the grid has 2 + 2 + 22 (26); equal lengths never.
  scatter_args a;
  a.num_columns = 3;
  for (int c = 0; c < 3; ++c) a.columns[c].step_bytes = steps_of[c];
  a.count = 2;
  a.max_count_length = 40;
  const std::int64_t uneven[] = {1, 40}, even[] = {40, 40};
  CHECK(scatter_grid(a).first_block[3] == 26);
  CHECK(plan_scatter_blocks(a, uneven, nullptr) == 16);
  CHECK(scatter_plan_pays(16, 26));
  CHECK(plan_scatter_blocks(a, even, nullptr) == 26);
  CHECK_FALSE(scatter_plan_pays(26, 26));
  CHECK_FALSE(scatter_plan_pays(20, 26));  // saves less than a quarter
  CHECK_FALSE(scatter_plan_pays(0, 0));
}

TEST_CASE(
    "gather blocks: small rows share a block, a group of whole warps each; every byte of every "
    "row is copied by exactly one thread") {
  using gear::detail::column_blocks;
  namespace tuning = gear::detail::tuning;
  constexpr int threads = tuning::copy_threads;
  constexpr std::int64_t chunk = tuning::copy_chunk_bytes;
  // 8-byte rows, 8 to a block: the select-cost shape of gear_bench (B = 4096).
  const std::int64_t eight[1] = {8};
  CHECK(column_blocks::make(1, 4096, eight, tuning::gather_max_rows_per_block).first_block[1] ==
        512);
  CHECK(column_blocks::make(1, 4096, eight, 1).first_block[1] == 4096);  // a block per row
  const std::int64_t bytes[] = {1,    8,         64,        2048,  4096,      8192,
                                8200, chunk / 2, chunk - 8, chunk, chunk + 1, 3 * chunk};
  std::int64_t wrong_shape = 0, wrong_group = 0, wrong_byte = 0, rows_seen = 0;
  for (const int most : {1, 2, tuning::gather_max_rows_per_block}) {
    for (const std::int64_t items : {1, 7, 8, 9, 125, 1000}) {
      for (int first = 0; first + 3 <= static_cast<int>(std::size(bytes)); first += 3) {
        const std::int64_t* item_bytes = bytes + first;  // three columns of different widths
        const column_blocks g = column_blocks::make(3, items, item_bytes, most);
        std::int64_t blocks = 0;
        for (int c = 0; c < 3; ++c) {
          const int k = g.items_per_block[c];
          wrong_shape += k < 1 || k > most || (k & (k - 1)) != 0 ||
                         (k > 1 && k * item_bytes[c] > chunk) ||  // more than a chunk together
                         (k < most && 2 * k * item_bytes[c] <= chunk) ||  // could take more
                         threads / k % 32 != 0;                           // split warps
          blocks += (items + k - 1) / k * g.chunks[c];
        }
        wrong_shape += blocks != g.first_block[3];
        // Every thread of every block as the gather kernel maps it: each byte of each row of
        // each column is written once.
        std::vector<std::vector<int>> writes(3);
        for (int c = 0; c < 3; ++c) writes[c].assign(std::size_t(items * item_bytes[c]), 0);
        for (std::int64_t block = 0; block < g.first_block[3]; ++block) {
          int c, group, lane, group_threads;
          std::int64_t item0, part;
          g.locate(block, c, item0, part);
          std::vector<int> groups_with_row;
          for (int t = 0; t < threads; ++t) {
            g.group_of(c, t, threads, group, lane, group_threads);
            wrong_group += group_threads % 32 != 0 || group * group_threads + lane != t;
            const std::int64_t row = item0 + group;
            if (row >= items) continue;
            const std::int64_t lo = part * chunk, hi = std::min(lo + chunk, item_bytes[c]);
            for (std::int64_t b = lo + lane; b < hi; b += group_threads)
              ++writes[c][std::size_t(row * item_bytes[c] + b)];
          }
        }
        for (int c = 0; c < 3; ++c) {
          wrong_byte +=
              std::count_if(writes[c].begin(), writes[c].end(), [](int w) { return w != 1; });
          rows_seen += items;
        }
      }
    }
  }
  CHECK(rows_seen > 0);
  CHECK(wrong_shape == 0);
  CHECK(wrong_group == 0);
  CHECK(wrong_byte == 0);
}

TEST_CASE("copy workers are started once and shared: every part runs once, after fork too") {
  auto& pool = gear::detail::copy_pool::instance();
  const unsigned cores = gear::detail::hardware_threads();
  CHECK(cores >= 1);
  if (std::thread::hardware_concurrency() > 0) CHECK(cores <= std::thread::hardware_concurrency());
  const auto bound =
      static_cast<std::size_t>(std::min(cores - 1, gear::detail::max_copy_threads - 1));
  // 8 callers at once, 50 copies of 7 parts each: every part of every copy runs exactly once.
  constexpr int callers = 8, copies = 50;
  constexpr unsigned parts = 7;
  const auto round = [&] {
    std::vector<std::atomic<int>> runs(callers * copies * parts);
    std::vector<std::thread> threads;
    for (int c = 0; c < callers; ++c)
      threads.emplace_back([&, c] {
        for (int k = 0; k < copies; ++k)
          gear::detail::parallel_for(parts, [&](unsigned t) {
            runs[std::size_t((c * copies + k) * int(parts) + int(t))].fetch_add(1);
          });
      });
    for (auto& t : threads) t.join();
    return std::all_of(runs.begin(), runs.end(), [](const auto& r) { return r.load() == 1; });
  };
  CHECK(round());
  const std::size_t started = pool.workers();
  CHECK(started <= bound);
  CHECK(round());
  CHECK(pool.workers() == started);  // kept, not started again

  // Parts of 1 ms: a call returns only once every part has run, and, where there are workers,
  // they take some (the caller runs one part at a time).
  std::atomic<unsigned> ran{0}, elsewhere{0};
  const auto caller = std::this_thread::get_id();
  for (int k = 0; k < 20; ++k) {
    ran = 0;
    gear::detail::parallel_for(parts, [&](unsigned) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (std::this_thread::get_id() != caller) elsewhere.fetch_add(1);
      ran.fetch_add(1);
    });
    CHECK(ran.load() == parts);
  }
  if (pool.workers() > 0) CHECK(elsewhere.load() > 0);

  // Children of fork, while another thread of the parent keeps copying (so that a worker may
  // hold the pool's mutex at the fork): a child has none of the parent's workers, copies on its
  // own thread and exits normally (static destructors and all), within its alarm.
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop) gear::detail::parallel_for(parts, [](unsigned) { std::this_thread::yield(); });
  });
  for (int k = 0; k < 20; ++k) {
    const pid_t child = fork();
    if (child == 0) {
      alarm(20);  // a hang ends the child by SIGALRM
      int sum = 0;
      gear::detail::parallel_for(parts, [&](unsigned t) { sum += int(t) + 1; });
      std::exit(sum == 28 ? 0 : 1);
    }
    REQUIRE(child > 0);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  stop = true;
  busy.join();
}

TEST_CASE("large inserts (copied on several threads) land byte for byte") {
  using big_spec = gear::spec<gear::column<"frame", std::uint8_t, 65536>, gear::column<"r", float>>;
  gear::replay_buffer<big_spec, gear::storage::host> buf{gear::capacity{48}, gear::max_length{12}};
  std::mt19937_64 gen(5);
  const auto lens = random_lengths(gen, 40, 12);
  std::int64_t steps = 0;
  for (auto l : lens) steps += l;
  REQUIRE(steps * 65536 >= 2 * gear::detail::parallel_copy_grain);  // several threads
  std::vector<std::uint8_t> frames(static_cast<std::size_t>(steps * 65536));
  for (auto& b : frames) b = static_cast<std::uint8_t>(gen());
  std::vector<float> r(static_cast<std::size_t>(steps));
  for (auto& x : r) x = static_cast<float>(gen() % 1000);
  std::vector<gear::key> keys(lens.size());
  buf.insert({lens, {gear::input(frames.data(), {65536}), gear::input(r.data())}}, keys);
  auto ref = buf.ref(gear::op::write_steps{});
  std::int64_t at = 0;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    for (std::int64_t t = 0; t < lens[i]; ++t, ++at) {
      const std::int64_t slot = keys[i].slot(buf.capacity());
      REQUIRE(std::memcmp(ref.step<0>(slot, t), frames.data() + at * 65536, 65536) == 0);
      REQUIRE(*ref.step<1>(slot, t) == r[static_cast<std::size_t>(at)]);
    }
  }
}

// ---- static properties ------------------------------------------------------------------------

TEST_CASE("refs are trivially copyable; owners are move-only") {
  using ref_t = decltype(std::declval<host_buffer&>().ref(gear::op::write_steps{},
                                                          gear::op::read_metadata{}));
  static_assert(std::is_trivially_copyable_v<ref_t>);
  static_assert(std::is_trivially_copyable_v<gear::key>);
  static_assert(std::is_trivially_copyable_v<gear::window>);
  static_assert(std::is_trivially_copyable_v<gear::rng_draw>);
  static_assert(std::is_trivially_copyable_v<gear::detail::gather_args>);
  static_assert(!std::is_copy_constructible_v<host_buffer>);
  static_assert(std::is_nothrow_move_constructible_v<host_buffer>);
  static_assert(!std::is_copy_constructible_v<host_buffer::batch_type>);
  static_assert(!host_buffer::on_device);
  static_assert(spec::step_bytes[0] == 24 && spec::step_bytes[3] == 64);
  static_assert(spec::index_of("done") == 2);
  CHECK(true);
}

// ---- insert and sample --------------------------------------------------------------------------

TEST_CASE("insert then sample: every window shape returns the right bytes") {
  const std::int64_t T = 40;
  for (std::uint64_t seed : {1ull, 2ull, 3ull}) {
    CAPTURE(seed);
    std::mt19937_64 gen(seed);
    host_buffer buf{gear::capacity{37}, gear::max_length{T}};
    model m;
    for (int round = 0; round < 4; ++round) insert(buf, m, random_lengths(gen, 13, T));
    CHECK(buf.size() == 37);
    for (std::int64_t L : {1, 7, 40, 55})
      for (std::int64_t off : {0, 3, 39})
        for (auto from : {gear::anchor::start, gear::anchor::end, gear::anchor::random})
          for (auto padding : {gear::pad::head, gear::pad::tail}) {
            host_buffer::batch_type out =
                buf.make_batch(gear::batch_size{16}, gear::window_length{L});
            // Poison the outputs so stale bytes cannot pass.
            std::memset(out.column_data(0), 0xAB, static_cast<std::size_t>(16 * L * 24));
            std::memset(out.mask_data(), 0xAB, static_cast<std::size_t>(16 * L));
            const gear::window w{L, off, from, padding};
            gear::rng g{seed * 1000 + static_cast<std::uint64_t>(L)};
            buf.sample(out, w, g);
            CHECK(g.calls() == 1);
            const host_batch h = copy_host_batch(out);
            const std::string err = m.check(h, w);
            REQUIRE_MESSAGE(err.empty(), err << " L=" << L << " off=" << off
                                             << " from=" << int(from) << " pad=" << int(padding));
            for (std::int64_t r = 0; r < 16; ++r) {
              CHECK(buf.contains(h.keys[r]));
              CHECK(h.probabilities[r] == doctest::Approx(1.0 / 37));
              CHECK(h.weights[r] == 1.0f);
            }
          }
  }
}

// ---- memory resources --------------------------------------------------------------------------

namespace {

/// A std::pmr resource that records what it hands out and takes back, from operator new.
struct recording_resource : std::pmr::memory_resource {
  struct block {
    void* p;
    std::size_t bytes, alignment;
    bool operator==(const block&) const = default;
  };
  std::vector<block> given, taken;

  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    void* p = std::pmr::new_delete_resource()->allocate(bytes, alignment);
    given.push_back({p, bytes, alignment});
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override {
    taken.push_back({p, bytes, alignment});
    std::pmr::new_delete_resource()->deallocate(p, bytes, alignment);
  }
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override {
    return this == &o;
  }
};

/// A resource of one's own (no base class) that fails the way it is told to.
struct failing_resource {
  enum class how { throws, throws_other, null, misaligned } mode;
  int allocations = 0, deallocations = 0;
  void* given = nullptr;

  void* allocate(std::size_t bytes, std::size_t) {
    ++allocations;
    if (mode == how::throws) throw std::bad_alloc();
    if (mode == how::throws_other) throw 42;  // not a std::exception
    if (mode == how::null) return nullptr;
    given = ::operator new(bytes + 512, std::align_val_t{256});
    return static_cast<std::byte*>(given) + 8;  // aligned to 8 bytes only
  }
  void deallocate(void* p, std::size_t, std::size_t) {
    ++deallocations;
    CHECK(p == static_cast<std::byte*>(given) + 8);  // what it handed out, given back
    ::operator delete(given, std::align_val_t{256});
  }
};

}  // namespace

TEST_CASE("slots from a memory resource: the buffer's bytes are the resource's, given back once") {
  static_assert(gear::memory_resource<std::pmr::memory_resource>);
  static_assert(gear::memory_resource<failing_resource>);
  static_assert(!gear::memory_resource<int>);
  struct const_resource {  // a resource whose calls are const, handed over as const
    void* allocate(std::size_t bytes, std::size_t a) const {
      return ::operator new(bytes, std::align_val_t{a});
    }
    void deallocate(void* p, std::size_t, std::size_t a) const {
      ::operator delete(p, std::align_val_t{a});
    }
  };
  const const_resource fixed;
  host_buffer{gear::capacity{2}, gear::max_length{2}, {}, {}, {.host = fixed}};
  recording_resource resource;
  model m;
  const std::int64_t capacity = 9, T = 12;
  {
    host_buffer buf{gear::capacity{capacity}, gear::max_length{T}, {}, {}, {.host = resource}};
    REQUIRE(resource.given.size() == 1);  // one region: every column is in host memory
    const auto region = resource.given[0];
    CHECK(region.alignment == 256);
    CHECK(reinterpret_cast<std::uintptr_t>(region.p) % 256 == 0);
    const auto* first = static_cast<const std::byte*>(region.p);
    CHECK(region.bytes >= static_cast<std::size_t>(capacity * T) * 24);
    std::mt19937_64 gen(5);
    for (int round = 0; round < 3; ++round) insert(buf, m, random_lengths(gen, 5, T));
    // Every step of every column lies in the resource's block.
    const auto r = buf.ref(gear::op::write_steps{});
    for (std::int64_t slot = 0; slot < capacity; ++slot)
      for (std::int64_t t = 0; t < T; ++t)
        for (const auto* p : {reinterpret_cast<const std::byte*>(r.step<0>(slot, t)),
                              reinterpret_cast<const std::byte*>(r.step<3>(slot, t))}) {
          CHECK(p >= first);
          CHECK(p < first + region.bytes);
        }
    const std::string err =
        sample_checked(buf, m, 32, gear::window{5, 0, gear::anchor::random, gear::pad::tail}, 3);
    CHECK_MESSAGE(err.empty(), err);
    CHECK(resource.taken.empty());  // still in use
    host_buffer moved = std::move(buf);
    CHECK(resource.taken.empty());  // a move hands the block on
    CHECK(moved.size() == capacity);
  }
  REQUIRE(resource.taken.size() == 1);
  CHECK(resource.taken[0] == resource.given[0]);  // the same block, size and alignment
}

TEST_CASE("a memory resource that fails: out_of_memory or misaligned_pointer, nothing kept") {
  using how = failing_resource::how;
  const auto build = [](failing_resource& r) {
    host_buffer buf{gear::capacity{4}, gear::max_length{8}, {}, {}, {.host = r}};
  };
  struct expected {
    how mode;
    gear::errc code;
    const char* words;
  };
  for (const expected e :
       {expected{how::throws, gear::errc::out_of_memory,
                 "the host memory resource could not allocate"},
        expected{how::throws_other, gear::errc::out_of_memory,
                 "could not allocate 4096 bytes: it threw an exception of a type not derived"},
        expected{how::null, gear::errc::out_of_memory, "the host memory resource returned null"},
        expected{how::misaligned, gear::errc::misaligned_pointer,
                 "the host memory resource returned memory aligned to fewer than 256 bytes"}}) {
    CAPTURE(int(e.mode));
    failing_resource r{e.mode};
    try {
      build(r);
      FAIL("no error");
    } catch (const gear::error& x) {
      CHECK(x.code() == e.code);
      CHECK_MESSAGE(std::string(x.what()).find(e.words) != std::string::npos, x.what());
      if (e.mode == how::throws)  // the resource's own message is kept
        CHECK(std::string(x.what()).find("bad_alloc") != std::string::npos);
    }
    CHECK(r.allocations == 1);
    // What it handed out (misaligned) came back; nothing else was given back.
    CHECK(r.deallocations == (e.mode == how::misaligned ? 1 : 0));
  }
}

TEST_CASE("an empty memory_resource_ref is gear's own allocation; refs compare by object") {
  recording_resource a, b;
  const gear::memory_resource_ref none, to_a = a, to_a_again = a, to_b = b;
  CHECK_FALSE(none);
  CHECK(to_a);
  CHECK(to_a == to_a_again);
  CHECK_FALSE(to_a == to_b);
  const gear::memory_resource_ref copy = to_a;  // a copy refers to the resource, not to the ref
  CHECK(copy == to_a);
  host_buffer buf{gear::capacity{4}, gear::max_length{8}, {}, {}, {.pinned = a, .device = b}};
  CHECK(a.given.empty());  // kinds the storage does not use are not touched
  CHECK(b.given.empty());
}

TEST_CASE("DLPack: a host batch's outputs as tensors that view its bytes") {
  host_buffer buf{gear::capacity{8}, gear::max_length{6}};
  model m;
  std::mt19937_64 gen(9);
  insert(buf, m, random_lengths(gen, 8, 6));
  auto out = buf.make_batch(gear::batch_size{5}, gear::window_length{3});
  struct expected {
    DLManagedTensor* tensor;
    const void* data;
    std::vector<std::int64_t> shape;
    DLDataType type;
  };
  const std::vector<expected> all = {
      {gear::to_dlpack<0>(out), out.column_data(0), {5, 3, 2, 3}, {kDLFloat, 32, 1}},
      {gear::to_dlpack<"action">(out), out.column_data(1), {5, 3}, {kDLInt, 32, 1}},
      {gear::to_dlpack<"done">(out), out.column_data(2), {5, 3}, {kDLUInt, 8, 1}},
      {gear::to_dlpack<3>(out), out.column_data(3), {5, 3, 64}, {kDLUInt, 8, 1}},
      {gear::mask_to_dlpack(out), out.mask_data(), {5, 3}, {kDLUInt, 8, 1}},
      {gear::probabilities_to_dlpack(out), out.probabilities_data(), {5}, {kDLFloat, 32, 1}},
      {gear::weights_to_dlpack(out), out.weights_data(), {5}, {kDLFloat, 32, 1}}};
  for (const expected& e : all) {
    const DLTensor& t = e.tensor->dl_tensor;
    CHECK(t.data == e.data);
    CHECK(t.device.device_type == kDLCPU);
    CHECK(t.device.device_id == 0);
    REQUIRE(t.ndim == static_cast<int>(e.shape.size()));
    CHECK(std::vector<std::int64_t>(t.shape, t.shape + t.ndim) == e.shape);
    CHECK(t.dtype.code == e.type.code);
    CHECK(t.dtype.bits == e.type.bits);
    CHECK(t.dtype.lanes == 1);
    CHECK(t.strides == nullptr);
    CHECK(t.byte_offset == 0);
    CHECK(e.tensor->manager_ctx != nullptr);
  }
  // A sample refills the bytes the tensors view: read through the tensor, element by element in
  // its row-major order, they are the batch's view.
  gear::rng g{4};
  buf.sample(out, gear::window{3, 0, gear::anchor::random, gear::pad::tail}, g);
  const auto* obs = static_cast<const float*>(all[0].tensor->dl_tensor.data);
  const auto view = out.column<"obs">();
  for (std::int64_t r = 0; r < 5; ++r)
    for (std::int64_t t = 0; t < 3; ++t)
      for (std::int64_t i = 0; i < 2; ++i)
        for (std::int64_t j = 0; j < 3; ++j)
          CHECK(obs[((r * 3 + t) * 2 + i) * 3 + j] == view(r, t, i, j));
  const auto* mask = static_cast<const std::uint8_t*>(all[4].tensor->dl_tensor.data);
  for (std::int64_t r = 0; r < 5; ++r)
    for (std::int64_t t = 0; t < 3; ++t) CHECK(mask[r * 3 + t] == out.mask()(r, t));
  for (const expected& e : all) e.tensor->deleter(e.tensor);  // frees the records, not the batch
  CHECK(out.holds_memory());
  // A batch moved from holds no memory: refused.
  auto taken = std::move(out);
  CHECK(code_of([&] { (void)gear::to_dlpack<0>(out); }) == gear::errc::batch_mismatch);
  CHECK(code_of([&] { (void)gear::mask_to_dlpack(out); }) == gear::errc::batch_mismatch);
  CHECK(code_of([&] { (void)gear::weights_to_dlpack(out); }) == gear::errc::batch_mismatch);
}

TEST_CASE("stats(): sizes, slot memory and every count, as the calls made them") {
  host_buffer buf{gear::capacity{4}, gear::max_length{6}};
  model m;
  gear::buffer_stats s = buf.stats();
  CHECK(s.capacity == 4);
  CHECK(s.size == 0);
  CHECK(s.slot_bytes[0] >= std::size_t{4} * 6 * 93);  // host memory: every column's steps
  CHECK(s.slot_bytes[1] == 0);
  CHECK(s.slot_bytes[2] == 0);
  CHECK(s.committed + s.evicted + s.removed + s.samples + s.priority_updates == 0);
  const std::vector<gear::key> first = insert(buf, m, {2, 3, 4});  // tickets 0, 1, 2
  std::optional<host_buffer::writer_type> w;
  w.emplace(buf.make_writer());  // ticket 3, slot 3
  const float obs[6] = {};
  const std::int32_t a = 0;
  const bool d = false;
  const std::uint8_t img[64] = {};
  w->append(obs, &a, &d, img);
  const gear::reservation r = buf.reserve(2);  // tickets 4, 5 take slots 0, 1: evict 0 and 1
  s = buf.stats();
  CHECK(s.committed == 3);
  CHECK(s.evicted == 2);
  CHECK(s.pending == 3);
  CHECK(s.size == 1);
  CHECK(s.tickets_issued == 6);
  std::vector<gear::key> keys(2);
  buf.commit(r, std::vector<std::int64_t>{2, 3}, keys);
  w.reset();  // abandoned
  s = buf.stats();
  CHECK(s.committed == 5);
  CHECK(s.pending == 0);
  CHECK(s.size == 3);
  buf.erase(std::span(first).subspan(2, 1));
  buf.set_max_times_sampled(1);
  auto out = buf.make_batch(gear::batch_size{1}, gear::window_length{1});
  gear::rng g{3};
  buf.sample(out, gear::window{}, g);  // returns one trajectory, which goes at its limit
  s = buf.stats();
  CHECK(s.removed == 2);
  CHECK(s.size == 1);
  CHECK(s.samples == 1);
  CHECK(s.rows_sampled == 1);
  // A call refused changes no count.
  auto wide = buf.make_batch(gear::batch_size{2}, gear::window_length{1});
  CHECK(code_of([&] { buf.sample(wide, gear::window{0}, g); }) == gear::errc::empty_window);
  const gear::buffer_stats after = buf.stats();
  CHECK(after.samples == 1);
  CHECK(after.rows_sampled == 1);
  CHECK(after.removed == 2);

  // Priority updates from host spans: calls, and pairs applied and stale.
  gear::replay_buffer<spec, gear::storage::host, gear::select::prioritized> per{
      gear::capacity{2}, gear::max_length{2}};
  model pm;
  const std::vector<gear::key> old = insert(per, pm, {1, 1});
  const std::vector<gear::key> now = insert(per, pm, {1});  // evicts old[0]
  const std::vector<gear::key> named{old[0], old[1], now[0]};
  (void)per.update_priorities(named, std::vector<float>{1.0f, 2.0f, 3.0f});
  const gear::buffer_stats ps = per.stats();
  CHECK(ps.priority_updates == 1);
  CHECK(ps.priorities_applied == 2);
  CHECK(ps.priorities_stale == 1);
  CHECK(ps.committed == 3);
  CHECK(ps.evicted == 1);
}

TEST_CASE("typed mdspan views address the gathered bytes") {
  host_buffer buf{gear::capacity{4}, gear::max_length{5}};
  model m;
  insert(buf, m, {5});
  auto out = buf.make_batch(gear::batch_size{2}, gear::window_length{5});
  gear::rng g{11};
  buf.sample(out, gear::window{.length = 5}, g);
  auto obs = out.column<"obs">();
  static_assert(decltype(obs)::rank() == 4);
  CHECK(obs.extent(0) == 2);
  CHECK(obs.extent(1) == 5);
  CHECK(obs.extent(2) == 2);
  CHECK(obs.extent(3) == 3);
  float want;
  std::uint8_t bytes[4];
  for (int b = 0; b < 4; ++b) bytes[b] = pattern(1, 3, 4 * 5 + b, 0);  // step 3, element (1, 2)
  std::memcpy(&want, bytes, 4);
  CHECK(std::memcmp(&obs(1, 3, 1, 2), &want, 4) == 0);
  CHECK(out.column<1>().extent(1) == 5);
  CHECK(out.mask()(0, 4) == 1);
  CHECK(out.keys()[0] == out.keys()[1]);
}

TEST_CASE("FIFO eviction advances tickets and makes old keys stale") {
  host_buffer buf{gear::capacity{5}, gear::max_length{8}};
  model m;
  const auto first = insert(buf, m, {3, 4, 5});
  CHECK(buf.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(first[i].ticket == i);
    CHECK(first[i].shard == 0);
    CHECK(first[i].incarnation == first[0].incarnation);  // the buffer's own, not 0
    CHECK(first[i].incarnation != 0);
  }
  const auto second = insert(buf, m, {2, 2, 2, 2});  // wraps: evicts the first two
  CHECK(buf.size() == 5);
  CHECK(buf.tickets_issued() == 7);
  CHECK(!buf.contains(first[0]));
  CHECK(!buf.contains(first[1]));
  CHECK(buf.contains(first[2]));
  CHECK(second[2].ticket == 5);
  CHECK(second[2].slot(5) == 0);
  CHECK(second[3].ticket == 6);
  CHECK(second[3].slot(5) == 1);
  CHECK(buf.ticket(0) == 5);
  CHECK(buf.ticket(1) == 6);
  CHECK(buf.ticket(2) == 2);  // not reserved again: its trajectory and ticket stay
  CHECK(buf.length(0) == 2);
  CHECK(buf.length(2) == 5);
  CHECK(code_of([&] { buf.check_key(first[0]); }) == gear::errc::stale_key);
  buf.check_key(second[3]);
  // Sampling never returns an evicted trajectory.
  auto out = buf.make_batch(gear::batch_size{256}, gear::window_length{2});
  gear::rng g{5};
  buf.sample(out, gear::window{.length = 2}, g);
  for (auto k : out.keys()) CHECK(buf.contains(k));
}

TEST_CASE("tickets never wrap: a key is stale forever once its slot is reserved again") {
  host_buffer buf{gear::capacity{4}, gear::max_length{2}};
  model m;
  const auto first = insert(buf, m, {1, 2, 1, 2});
  const auto fifth = insert(buf, m, {2});
  CHECK(fifth[0].ticket == 4);
  CHECK(fifth[0].slot(4) == 0);
  CHECK(buf.ticket(0) == 4);
  CHECK(buf.length(0) == 2);
  CHECK(!buf.contains(first[0]));
  CHECK(buf.contains(first[1]));
  const std::string what =
      expect_error(buf, gear::errc::stale_key, [&] { buf.check_key(first[0]); });
  CHECK_MESSAGE(
      what.find("key (ticket 0, slot 0) names a trajectory no longer stored") != std::string::npos,
      what);
  // Many laps later slot 0 holds ticket 4 + 4n; neither old key comes back, and every key of the
  // current lap is live.
  for (int lap = 0; lap < 25; ++lap) insert(buf, m, {1, 1, 1, 1});
  CHECK(buf.tickets_issued() == 105);
  CHECK(buf.ticket(0) == 104);
  CHECK(buf.ticket(1) == 101);
  CHECK(!buf.contains(first[0]));
  CHECK(!buf.contains(fifth[0]));
  for (std::uint64_t t = 0; t < 105; ++t) CHECK(buf.contains(m.key_of(t)) == (t >= 101));
  CHECK(!buf.contains(m.key_of(105)));  // not issued yet
  CHECK(!buf.contains(m.key_of(gear::no_ticket)));
  CHECK(code_of([&] { buf.check_key(m.key_of(105)); }) == gear::errc::stale_key);
}

TEST_CASE("step-wise writer: append, commit, abandon, takeover") {
  static_assert(std::is_same_v<decltype(std::declval<host_buffer&>().make_writer()),
                               host_buffer::writer_type>);
  host_buffer buf{gear::capacity{3}, gear::max_length{4}};
  packed p(42, {3});
  model keys;  // the buffer's keys, once one is known
  {
    auto w = buf.make_writer();
    CHECK(buf.tickets_issued() == 1);  // reserved at once
    CHECK(buf.ticket(w.slot()) == 0);
    for (std::int64_t t = 0; t < 3; ++t)
      w.append(reinterpret_cast<const float*>(p.columns[0].data()) + t * 6,
               reinterpret_cast<const std::int32_t*>(p.columns[1].data()) + t,
               reinterpret_cast<const bool*>(p.columns[2].data()) + t,
               reinterpret_cast<const std::uint8_t*>(p.columns[3].data()) + t * 64);
    CHECK(buf.size() == 0);  // not visible before commit
    const gear::key k = w.commit();
    CHECK(buf.size() == 1);
    CHECK(buf.contains(k));
    CHECK(buf.length(k.slot(buf.capacity())) == 3);
    CHECK(buf.ticket(k.slot(buf.capacity())) == k.ticket);
    model m;
    m.record(k, 42, 3);
    keys.record(k, 42, 3);
    auto out = buf.make_batch(gear::batch_size{4}, gear::window_length{4});
    gear::rng g{1};
    const gear::window win{.length = 4};
    buf.sample(out, win, g);
    const std::string err = m.check(copy_host_batch(out), win);
    CHECK_MESSAGE(err.empty(), err);
    CHECK_THROWS_AS(w.commit(), gear::error);  // already committed
  }
  {
    auto w = buf.make_writer();
    const auto slot = w.slot();
    const float obs[6] = {};
    const std::int32_t a = 0;
    const bool d = false;
    const std::uint8_t img[64] = {};
    w.append(obs, &a, &d, img);
    CHECK(buf.length(slot) == 0);
    CHECK(buf.ticket(slot) == 1);
    CHECK(!buf.contains(keys.key_of(1)));  // pending: not a stored trajectory
  }                                          // abandoned: the slot stays empty and unsampled
  CHECK(buf.size() == 1);
  CHECK(buf.length(1) == 0);
  CHECK(buf.ticket(1) == 1);
  CHECK(!buf.contains(keys.key_of(1)));
  {
    auto w = buf.make_writer();  // ticket 2, slot 2
    const float obs[6] = {1, 2, 3, 4, 5, 6};
    const std::int32_t a = 7;
    const bool d = true;
    const std::uint8_t img[64] = {9};
    w.append(obs, &a, &d, img);
    w.append(obs, &a, &d, img);
    const gear::key k = w.commit_async();  // host storage: visible when it returns
    CHECK(k == keys.key_of(2));
    CHECK(buf.contains(k));
    CHECK(buf.size() == 2);
    CHECK(buf.length(2) == 2);
    CHECK(code_of([&] { (void)w.commit_async(); }) == gear::errc::invalid_reservation);
    CHECK(code_of([&] { w.append(obs, &a, &d, img); }) == gear::errc::invalid_reservation);
    CHECK(buf.size() == 2);
  }
  {
    auto w = buf.make_writer();
    model m;
    const float obs[6] = {};
    const std::int32_t a = 0;
    const bool d = false;
    const std::uint8_t img[64] = {};
    w.append(obs, &a, &d, img);
    insert(buf, m, {1, 1, 1});  // three newer reservations take the writer's slot over
    try {
      w.append(obs, &a, &d, img);
      FAIL("append after takeover must throw");
    } catch (const gear::error& e) {
      CHECK(e.code() == gear::errc::invalid_reservation);
    }
    const fingerprint before = take_fingerprint(buf);
    CHECK(code_of([&] { (void)w.commit(); }) == gear::errc::invalid_reservation);
    CHECK(take_fingerprint(buf) == before);
  }  // destroying the taken-over writer leaves the new occupant alone
  CHECK(buf.size() == 3);
  CHECK(buf.tickets_issued() == 7);
  for (std::int64_t s = 0; s < 3; ++s) CHECK(buf.length(s) == 1);
}

TEST_CASE("a writer moved from holds no slot: its calls are refused, the new owner commits") {
  host_buffer buf{gear::capacity{2}, gear::max_length{4}};
  const float obs[6] = {1, 2, 3, 4, 5, 6};
  const std::int32_t a = 7;
  const bool d = true;
  const std::uint8_t img[64] = {9};
  auto w = buf.make_writer();
  w.append(obs, &a, &d, img);
  auto moved = std::move(w);
  const fingerprint before = take_fingerprint(buf);
  try {
    w.append(obs, &a, &d, img);
    FAIL("append on a moved-from writer must throw");
  } catch (const gear::error& e) {
    CHECK(e.code() == gear::errc::invalid_reservation);
    CHECK(std::string(e.what()).find("moved from") != std::string::npos);
  }
  CHECK(code_of([&] { (void)w.commit_async(); }) == gear::errc::invalid_reservation);
  CHECK(take_fingerprint(buf) == before);
  moved.append(obs, &a, &d, img);
  const gear::key k = moved.commit();
  CHECK(buf.contains(k));
  CHECK(buf.length(k.slot(buf.capacity())) == 2);
  CHECK(buf.size() == 1);
}

TEST_CASE("reserve, write through ref, commit (the GPU-simulator path, on the host)") {
  host_buffer buf{gear::capacity{6}, gear::max_length{5}};
  const gear::reservation r = buf.reserve(4);
  CHECK(r.first_ticket == 0);
  CHECK(r.count == 4);
  CHECK(r.capacity == 6);
  CHECK(buf.tickets_issued() == 4);
  auto ref = buf.ref(gear::op::write_steps{}, gear::op::read_metadata{});
  for (std::int64_t i = 0; i < 4; ++i) CHECK(ref.ticket(r.slot(i)) == std::uint64_t(i));
  packed p(100, {5, 5, 5, 5});
  for (std::int64_t i = 0; i < 4; ++i) {
    CHECK(ref.length(r.slot(i)) == 0);
    for (std::int64_t t = 0; t < 5; ++t) {
      std::memcpy(ref.step<0>(r.slot(i), t), p.columns[0].data() + (i * 5 + t) * 24, 24);
      std::memcpy(ref.step<1>(r.slot(i), t), p.columns[1].data() + (i * 5 + t) * 4, 4);
      std::memcpy(ref.step<2>(r.slot(i), t), p.columns[2].data() + (i * 5 + t), 1);
      std::memcpy(ref.step<3>(r.slot(i), t), p.columns[3].data() + (i * 5 + t) * 64, 64);
    }
  }
  CHECK(buf.size() == 0);
  std::vector<gear::key> keys(4);
  const std::vector<std::int64_t> lens{5, 4, 3, 5};
  buf.commit(r, lens, keys);
  CHECK(buf.size() == 4);
  CHECK(ref.length(r.slot(2)) == 3);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(keys[i].ticket == r.first_ticket + i);
    CHECK(keys[i].incarnation == keys[0].incarnation);
    CHECK(ref.ticket(r.slot(std::int64_t(i))) == keys[i].ticket);
    CHECK(ref.length(r.slot(std::int64_t(i))) == lens[i]);
  }
  model m;
  for (std::size_t i = 0; i < 4; ++i) m.record(keys[i], 100 + i, lens[i]);
  const std::string err =
      sample_checked(buf, m, 64, gear::window{5, 0, gear::anchor::end, gear::pad::head}, 9);
  CHECK_MESSAGE(err.empty(), err);
}

// ---- uniform selection: distributions
// -------------------------------------------------------------

TEST_CASE("uniform with replacement: chi-square at significance 0.001 over 10^6 draws") {
  // 1000 live trajectories among 1200 reserved slots (200 pending holes must never be drawn).
  host_buffer buf{gear::capacity{1200}, gear::max_length{1}};
  model m;
  insert(buf, m, std::vector<std::int64_t>(1000, 1));
  const gear::reservation hole = buf.reserve(200);
  (void)hole;
  auto out = buf.make_batch(gear::batch_size{10000}, gear::window_length{1});
  std::vector<double> counts(1200, 0);
  const std::uint64_t seed = 20261202;
  INFO("seed " << seed);
  gear::rng g{seed};
  for (int call = 0; call < 100; ++call) {
    buf.sample(out, gear::window{}, g);
    for (auto k : out.keys()) counts[static_cast<std::size_t>(k.slot(1200))] += 1;
  }
  for (std::size_t s = 1000; s < 1200; ++s) REQUIRE(counts[s] == 0);
  counts.resize(1000);
  const std::vector<double> expected(1000, 1e6 / 1000);
  const double stat = chi2(counts, expected), crit = chi2_critical_0001(999);
  MESSAGE("uniform chi2 = " << stat << ", critical(0.001, df 999) = " << crit);
  CHECK(stat < crit);

  // Power: the same test rejects a sampler that favours the first 10% of slots by 10%.
  std::vector<double> planted(1000, 0);
  std::mt19937_64 gen(seed);
  std::vector<double> bias(1000, 1.0);
  for (int i = 0; i < 100; ++i) bias[i] = 1.1;
  std::discrete_distribution<int> wrong(bias.begin(), bias.end());
  for (int i = 0; i < 1000000; ++i) planted[wrong(gen)] += 1;
  CHECK(chi2(planted, expected) > crit);
}

TEST_CASE("uniform without replacement: distinct rows, uniform inclusion (chi-square 0.001)") {
  host_buffer buf{gear::capacity{64}, gear::max_length{1}, gear::select::uniform{false}};
  model m;
  insert(buf, m, std::vector<std::int64_t>(50, 1));
  auto out = buf.make_batch(gear::batch_size{20}, gear::window_length{1});
  std::vector<double> counts(50, 0);
  const std::uint64_t seed = 777;
  INFO("seed " << seed);
  gear::rng g{seed};
  for (int call = 0; call < 50000; ++call) {  // 10^6 rows
    buf.sample(out, gear::window{}, g);
    std::set<std::int64_t> rows;
    for (auto k : out.keys()) {
      rows.insert(k.slot(64));
      counts[static_cast<std::size_t>(k.slot(64))] += 1;
    }
    REQUIRE(rows.size() == 20);
  }
  const std::vector<double> expected(50, 1e6 / 50);
  const double stat = chi2(counts, expected), crit = chi2_critical_0001(49);
  MESSAGE("without-replacement inclusion chi2 = " << stat << ", critical = " << crit);
  CHECK(stat < crit);
  // Taking every trajectory works and returns each once.
  auto all = buf.make_batch(gear::batch_size{50}, gear::window_length{1});
  buf.sample(all, gear::window{}, g);
  std::set<std::uint64_t> rows;
  for (auto k : all.keys()) rows.insert(k.ticket);
  CHECK(rows.size() == 50);
}

TEST_CASE("random windows start uniformly (chi-square 0.001)") {
  host_buffer buf{gear::capacity{1}, gear::max_length{30}};
  model m;
  insert(buf, m, {30});
  const gear::window w{10, 2, gear::anchor::random, gear::pad::tail};  // starts 2..20
  auto out = buf.make_batch(gear::batch_size{1000}, gear::window_length{10});
  std::vector<double> counts(19, 0);
  gear::rng g{31337};
  for (int call = 0; call < 200; ++call) {
    buf.sample(out, w, g);
    std::vector<std::int64_t> firsts;
    const std::string err = m.check(copy_host_batch(out), w, &firsts);
    REQUIRE_MESSAGE(err.empty(), err);
    for (auto f : firsts) counts[static_cast<std::size_t>(f - 2)] += 1;
  }
  const std::vector<double> expected(19, 200000.0 / 19);
  const double stat = chi2(counts, expected);
  MESSAGE("window start chi2 = " << stat << " (df 18, critical 42.31 at 0.001)");
  CHECK(stat < 42.31);  // exact table value for df = 18
}

TEST_CASE("the same seed gives the same batch") {
  host_buffer buf{gear::capacity{100}, gear::max_length{10}};
  model m;
  std::mt19937_64 gen(1);
  insert(buf, m, random_lengths(gen, 100, 10));
  auto a = buf.make_batch(gear::batch_size{32}, gear::window_length{6});
  auto b = buf.make_batch(gear::batch_size{32}, gear::window_length{6});
  gear::rng g1{5}, g2{5};
  const gear::window w{6, 0, gear::anchor::random, gear::pad::head};
  buf.sample(a, w, g1);
  buf.sample(b, w, g2);
  const auto ha = copy_host_batch(a), hb = copy_host_batch(b);
  CHECK(ha.keys == hb.keys);
  CHECK(ha.columns == hb.columns);
  buf.sample(b, w, g2);  // the next call of the stream differs
  CHECK(copy_host_batch(b).keys != ha.keys);
}

TEST_CASE(
    "reserve_staging: each limit out of range is refused by name; storage::host stages nothing") {
  host_buffer buf{gear::capacity{8}, gear::max_length{6}};
  model m;
  (void)insert(buf, m, {3, 6, 1});
  const fingerprint before = take_fingerprint(buf);
  buf.reserve_staging(
      {.insert_trajectories = 8, .insert_steps = 48, .batch = 256, .in_flight = 64});
  buf.reserve_staging({});  // the defaults are in range
  CHECK(take_fingerprint(buf) == before);
  const std::pair<gear::call_limits, const char*> bad[] = {
      {{.insert_trajectories = 0}, "insert_trajectories"},
      {{.insert_trajectories = 9}, "insert_trajectories"},  // capacity 8
      {{.insert_trajectories = -1}, "insert_trajectories"},
      {{.insert_trajectories = 2, .insert_steps = 1}, "insert_steps"},
      {{.insert_trajectories = 2, .insert_steps = 13}, "insert_steps"},  // 2 x max_length 6
      {{.insert_trajectories = 8, .insert_steps = INT64_MAX}, "insert_steps"},
      {{.batch = 0}, "batch"},
      {{.batch = (std::int64_t{1} << 32) + 1}, "batch"},
      {{.in_flight = 0}, "in_flight"},
      {{.in_flight = 65}, "in_flight"},
      {{.writers = -1}, "writers"},
      {{.writers = 257}, "writers"},
  };
  for (const auto& [limits, field] : bad) {
    const std::string what = expect_error(buf, gear::errc::invalid_argument,
                                          [&, limits = limits] { buf.reserve_staging(limits); });
    CHECK_MESSAGE(what.find(std::string("call_limits.") + field) != std::string::npos, what);
  }
  // At the edge: 2 trajectories of max_length steps each.
  buf.reserve_staging({.insert_trajectories = 2, .insert_steps = 12});
  CHECK(take_fingerprint(buf) == before);
}

// A landing insert's upload is seen finished either by an event query or by inference: a newer
// upload of the same thread on the same stream has finished (detail/buffer/landing_state.hpp).
// Random landing lists from four origins, two of them one stream handle used by two threads,
// each origin's uploads finishing as a prefix of its own order: every insert must come out
// marked exactly when its upload has finished, with at most one question per unfinished insert
// and per origin, and none about an insert already marked. The same checks catch an inference
// that takes a stream handle alone for an origin (planted below): another thread's finished
// upload on that stream says nothing about this thread's.
TEST_CASE("landing: finished uploads are inferred only within one thread's stream") {
  using gear::detail::landing_insert;
  std::promise<void> release;
  const std::shared_future<void> go = release.get_future().share();
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) threads.emplace_back([go] { go.wait(); });
  const auto stream = [](std::uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); };
  const std::pair<std::thread::id, cudaStream_t> origins[] = {{threads[0].get_id(), stream(16)},
                                                              {threads[1].get_id(), stream(16)},
                                                              {threads[0].get_id(), stream(32)},
                                                              {threads[2].get_id(), stream(48)}};
  // The planted defect: a stream handle alone taken for an origin.
  auto by_stream_only = [](std::span<landing_insert> landing, auto&& finished) {
    std::vector<cudaStream_t> done;
    for (std::size_t i = landing.size(); i-- > 0;) {
      landing_insert& l = landing[i];
      const bool answered = std::find(done.begin(), done.end(), l.stream) != done.end();
      if (!l.uploaded) l.uploaded = answered || finished(l);
      if (l.uploaded && !answered) done.push_back(l.stream);
    }
    return std::size_t{0};
  };
  std::mt19937_64 gen(20261206);
  int wrong = 0, planted_wrong = 0, over_asked = 0, asked_marked = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const auto n = static_cast<std::size_t>(gen() % 25);
    std::vector<landing_insert> landing(n);
    std::vector<int> origin_of(n);
    std::array<std::size_t, 4> count{}, finished_count{};
    std::vector<std::size_t> rank(n);  // the insert's place in its origin's order
    for (std::size_t i = 0; i < n; ++i) {
      origin_of[i] = static_cast<int>(gen() % 4);
      landing[i].thread = origins[origin_of[i]].first;
      landing[i].stream = origins[origin_of[i]].second;
      rank[i] = count[static_cast<std::size_t>(origin_of[i])]++;
    }
    for (std::size_t o = 0; o < 4; ++o) finished_count[o] = gen() % (count[o] + 1);
    std::vector<char> truth(n);
    for (std::size_t i = 0; i < n; ++i) {
      truth[i] = rank[i] < finished_count[static_cast<std::size_t>(origin_of[i])];
      landing[i].uploaded = truth[i] && gen() % 3 == 0;  // seen by an earlier settle
    }
    std::vector<landing_insert> planted = landing;
    std::size_t unfinished = 0;
    for (char t : truth) unfinished += t == 0;
    int asked_about_marked = 0;
    auto ask = [&](std::span<landing_insert> list) {
      return [&, list](const landing_insert& l) {
        const auto i = static_cast<std::size_t>(&l - list.data());
        asked_about_marked += l.uploaded;
        return truth[i] != 0;
      };
    };
    const std::size_t asked =
        gear::detail::note_finished_uploads(std::span<landing_insert>(landing), ask(landing));
    by_stream_only(std::span<landing_insert>(planted), ask(planted));
    for (std::size_t i = 0; i < n; ++i) {
      wrong += landing[i].uploaded != (truth[i] != 0);
      planted_wrong += planted[i].uploaded != (truth[i] != 0);
    }
    over_asked += asked > unfinished + 4;
    asked_marked += asked_about_marked;
  }
  release.set_value();
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
  CHECK(over_asked == 0);
  CHECK(asked_marked == 0);
  // The checks' power: the planted inference marks some unfinished upload as finished.
  CHECK(planted_wrong > 0);
}

namespace {
/// What write_landing_pieces reads of a buffer: its landing inserts, ring and slot geometry.
struct landing_core {
  using spec_type = gear::spec<gear::column<"a", std::uint8_t, 3>, gear::column<"b", float, 5>>;
  static constexpr std::size_t num_columns = 2;
  std::vector<gear::detail::landing_insert> landing_;
  gear::detail::slot_ring ring_{16, 1};
  struct {
    std::array<gear::detail::column_geometry, 2> kernel;
  } regions_;
};
}  // namespace

// A publish of landing inserts places num_columns pieces per pending ticket of the inserts it
// commits (the settle sizes its lease by that count before it writes them), each from the
// insert's device staging at the packed column offset (insert_staging's layout) into its slot.
// A ticket a later call already committed, and an insert not committed now, give none.
TEST_CASE("landing: a publish writes a piece per column of each pending ticket it commits") {
  landing_core b;
  // Staging and slot regions large enough for every address the pieces name.
  std::vector<std::byte> staging_a(std::size_t{2} << 20), staging_b(1024), staging_c(1024),
      slots(8192);
  b.regions_.kernel = {gear::detail::column_geometry{slots.data(), 100, 3},
                       gear::detail::column_geometry{slots.data() + 8, 1000, 20}};
  std::vector<gear::detail::slot_record> records(8);
  auto land = [&](std::vector<std::int64_t> lengths, std::byte* device) {
    gear::detail::landing_insert l;
    l.lease.device = device;
    l.lengths = lengths;
    for (std::int64_t len : lengths) l.steps += len;
    const auto count = static_cast<std::int64_t>(lengths.size());
    l.first_ticket = b.ring_.reserve(count, records.data()).first_ticket;
    b.landing_.push_back(l);
  };
  land({2, 70000}, staging_a.data());  // tickets 0, 1 (the second's columns span chunks)
  land({4}, staging_b.data());         // ticket 2: not committed by this publish
  land({1, 3}, staging_c.data());      // tickets 3, 4; ticket 3 committed by a later call
  const std::int64_t one[] = {1};
  b.ring_.commit(gear::reservation{3, 1, 16, 1}, one, records.data());
  const std::vector<char> commit = {1, 0, 1};
  std::int64_t commits = 0;  // as settle_landing counts them: the pending tickets committed now
  for (std::size_t i = 0; i < b.landing_.size(); ++i)
    for (std::size_t t = 0; t < b.landing_[i].lengths.size(); ++t)
      commits += commit[i] && b.ring_.is_pending(b.landing_[i].first_ticket + t);
  REQUIRE(commits == 3);
  std::vector<gear::detail::landing_piece> out(8);
  const std::int64_t chunks = gear::detail::write_landing_pieces(b, commit, out.data());
  using gear::detail::landing_piece;
  const auto packed = [](std::int64_t steps, std::int64_t step) {  // a column's packed bytes
    return static_cast<std::size_t>(gear::align_up(steps * step, gear::segment_alignment));
  };
  const std::vector<landing_piece> expected = {
      // insert 0, ticket 0 (slot 0): 2 steps at step 0 of each column
      {staging_a.data(), slots.data(), 2 * 3},
      {staging_a.data() + packed(70002, 3), slots.data() + 8, 2 * 20},
      // ticket 1 (slot 1): 70000 steps from step 2
      {staging_a.data() + 2 * 3, slots.data() + 100, 70000 * 3},
      {staging_a.data() + packed(70002, 3) + 2 * 20, slots.data() + 8 + 1000, 70000 * 20},
      // insert 2, ticket 4 (slot 4), 3 steps from step 1; ticket 3 is committed already
      {staging_c.data() + 1 * 3, slots.data() + 400, 3 * 3},
      {staging_c.data() + packed(4, 3) + 1 * 20, slots.data() + 8 + 4000, 3 * 20},
  };
  for (std::size_t p = 0; p < expected.size(); ++p) {
    INFO("piece " << p);
    CHECK(out[p].src == expected[p].src);
    CHECK(out[p].dst == expected[p].dst);
    CHECK(out[p].bytes == expected[p].bytes);
  }
  CHECK(out[expected.size()].bytes == 0);  // nothing written past them
  CHECK(static_cast<std::int64_t>(expected.size()) ==
        commits * static_cast<std::int64_t>(landing_core::num_columns));
  const std::int64_t chunk = gear::detail::landing_chunk;
  CHECK(chunks == 1 + 1 + (70000 * 3 + chunk - 1) / chunk + (70000 * 20 + chunk - 1) / chunk + 2);
}
