// CUDA graphs: samples drawn with a gear::device_rng, captured once and replayed.
//
//   - 1000 replays of one captured sample return, bit for bit, what 1000 eager calls with
//     gear::rng of the same seed return (slots, probabilities, weights, keys, masks, bytes), for
//     uniform with and without replacement and prioritized, with the gather drawing its own rows
//     (small batches) and after a selection launch (large ones);
//   - the rows of the replays follow the policy's law (chi-square at significance 0.001), and the
//     same test rejects draws frozen into a graph (power);
//   - a captured PER step (sample, a TD-error kernel, a priority update from device memory)
//     replayed 1000 times equals 1000 eager steps, batches and trees bit for bit;
//   - a replay samples the buffer as it is when it runs: inserts, priority updates and erases
//     made between replays are seen;
//   - calls whose host bookkeeping would not replay are refused inside a capture;
//   - every misuse is refused with errc::invalid_argument, and leaves the buffer as it was (a
//     buffer another stream has used, including by a host insert that landed, never binds).
// Exits 77 (skipped) where no GPU is usable.

#include <gear/gear.cuh>
#include <gear/sharded_buffer.hpp>

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <vector>

#include "gpu_common.cuh"
#include "select_common.hpp"

using gear_test::stream_holder;
using select_test::chi2_test;

namespace {

/// One int32 per step: trajectory n holds n * 1000 + t at step t.
using vspec = gear::spec<gear::column<"v", std::int32_t>>;
constexpr std::int64_t max_len = 16;

template <class Selection>
using buffer_of = gear::replay_buffer<vspec, gear::storage::device, Selection>;

/// Inserts trajectories numbered [first, first + count) of lengths 1..max_len (by number).
template <class Buffer>
std::vector<gear::key> insert_numbered(Buffer& buf, std::int32_t first, std::int32_t count,
                                       cuda::stream_ref s) {
  std::vector<std::int64_t> lengths;
  std::vector<std::int32_t> v;
  for (std::int32_t n = first; n < first + count; ++n) {
    lengths.push_back(1 + n % max_len);
    for (std::int64_t t = 0; t < lengths.back(); ++t)
      v.push_back(n * 1000 + static_cast<std::int32_t>(t));
  }
  std::vector<gear::key> keys(lengths.size());
  buf.insert(gear::trajectories<vspec>{lengths, {gear::input(v.data())}}, keys, s);
  return keys;
}

template <class T>
std::vector<T> to_host(const T* p, std::int64_t n) {
  std::vector<T> out(static_cast<std::size_t>(n));
  GEAR_CUDA_TRY(cudaMemcpy(out.data(), p, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

/// Everything a sample wrote, copied to the host.
struct drawn {
  std::vector<std::int64_t> slots;
  std::vector<float> probabilities, weights;
  std::vector<gear::key> keys;
  std::vector<std::uint8_t> mask;
  std::vector<std::int32_t> v;

  template <class Batch>
  static drawn of(const Batch& b) {
    const std::int64_t rows = b.batch_size(), len = b.window_length();
    drawn d;
    d.slots = to_host(b.slots_data(), rows);
    d.probabilities = to_host(b.probabilities_data(), rows);
    d.weights = to_host(b.weights_data(), rows);
    d.keys = to_host(b.keys_data(), rows);
    d.mask = to_host(b.mask_data(), rows * len);
    d.v = to_host(reinterpret_cast<const std::int32_t*>(b.column_data(0)), rows * len);
    return d;
  }
  bool operator==(const drawn& o) const {
    // Keys of two buffers: the same tickets and shards (each buffer's incarnation is its own).
    const bool same_keys = std::equal(keys.begin(), keys.end(), o.keys.begin(), o.keys.end(),
                                      [](const gear::key& a, const gear::key& b) {
                                        return a.shard == b.shard && a.ticket == b.ticket;
                                      });
    return slots == o.slots && same_keys && mask == o.mask && v == o.v &&
           std::memcmp(probabilities.data(), o.probabilities.data(),
                       probabilities.size() * sizeof(float)) == 0 &&
           std::memcmp(weights.data(), o.weights.data(), weights.size() * sizeof(float)) == 0;
  }
};

/// A graph of what `enqueue(stream)` enqueues, captured in global mode (the strictest: any call
/// that may not run during a capture fails it) and instantiated.
class captured {
 public:
  template <class F>
  captured(cudaStream_t s, F enqueue) {
    GEAR_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    try {
      enqueue();
    } catch (...) {
      cudaGraph_t broken{};
      (void)cudaStreamEndCapture(s, &broken);
      if (broken != nullptr) (void)cudaGraphDestroy(broken);
      throw;
    }
    GEAR_CUDA_TRY(cudaStreamEndCapture(s, &graph_));
    GEAR_CUDA_TRY(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  ~captured() {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
  }
  captured(const captured&) = delete;
  captured& operator=(const captured&) = delete;
  /// Launches the graph on `s` and waits for it.
  void replay(cudaStream_t s) const {
    GEAR_CUDA_TRY(cudaGraphLaunch(exec_, s));
    GEAR_CUDA_TRY(cudaStreamSynchronize(s));
  }
  /// Launches the graph on `s`, without waiting.
  void launch(cudaStream_t s) const { GEAR_CUDA_TRY(cudaGraphLaunch(exec_, s)); }
  /// Kernel nodes of the graph.
  [[nodiscard]] std::size_t kernels() const { return nodes(cudaGraphNodeTypeKernel); }
  /// Nodes of the graph of one type.
  [[nodiscard]] std::size_t nodes(cudaGraphNodeType of) const {
    std::size_t n = 0;
    GEAR_CUDA_TRY(cudaGraphGetNodes(graph_, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    GEAR_CUDA_TRY(cudaGraphGetNodes(graph_, nodes.data(), &n));
    std::size_t k = 0;
    for (const cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type{};
      GEAR_CUDA_TRY(cudaGraphNodeGetType(node, &type));
      k += type == of;
    }
    return k;
  }

 private:
  cudaGraph_t graph_{};
  cudaGraphExec_t exec_{};
};

/// `calls` eager samples with gear::rng(seed), then `calls` replays of one sample captured with
/// gear::device_rng(seed), on a copy of the same contents: each replay equals its eager call.
template <class Selection>
void check_replays_equal_eager(const Selection& policy, std::int64_t rows, const gear::window& w,
                               int calls, bool prioritize) {
  stream_holder s;
  buffer_of<Selection> buf{gear::capacity{512}, gear::max_length{max_len}, policy};
  const auto keys = insert_numbered(buf, 0, 400, s);
  if constexpr (gear::host_priority_update<typename buffer_of<Selection>::state_type>) {
    if (prioritize) {
      const auto p = select_test::random_priorities(7, keys.size());
      (void)buf.update_priorities(keys, p, s);
    }
  }
  auto b = buf.make_batch(gear::batch_size{rows}, gear::window_length{w.length});
  constexpr std::uint64_t seed = 0x5eed'0001;
  std::vector<drawn> eager;
  gear::rng g(seed);
  for (int k = 0; k < calls; ++k) {
    buf.sample(b, w, g, s);
    eager.push_back(drawn::of(b));
  }
  gear::device_rng dg(seed);
  const captured graph(s.s, [&] { buf.sample_async(b, w, dg, s); });
  int equal = 0;
  for (int k = 0; k < calls; ++k) {
    graph.replay(s.s);
    equal += drawn::of(b) == eager[static_cast<std::size_t>(k)];
  }
  CHECK(equal == calls);
  CHECK(dg.calls(s) == static_cast<std::uint64_t>(calls));
  CHECK(g.calls() == static_cast<std::uint64_t>(calls));
}

}  // namespace

TEST_CASE("1000 replays of a captured sample equal 1000 eager calls of the same seed") {
  const gear::window random_start{8, 0, gear::anchor::random, gear::pad::head};
  SUBCASE("uniform, rows drawn in the gather (B = 64)") {
    check_replays_equal_eager(gear::select::uniform{}, 64, random_start, 1000, false);
  }
  SUBCASE("uniform, a selection launch first (B = 32768: 4096 gather blocks of 8 rows)") {
    REQUIRE(std::int64_t{gear::detail::tuning::fused_gather_max_waves} *
                gear::detail::multiprocessors() * gear::detail::tuning::copy_blocks_per_sm <
            4096);
    check_replays_equal_eager(gear::select::uniform{}, 32768, random_start, 50, false);
  }
  SUBCASE("uniform without replacement: distinct rows every replay") {
    // Not bit for bit: when two rows draw the same trajectory, which keeps it depends on the
    // GPU's timing, eager or replayed (select/uniform.hpp). Each replay is checked on its own.
    stream_holder s;
    buffer_of<gear::select::uniform> buf{gear::capacity{512}, gear::max_length{max_len},
                                         gear::select::uniform{.replacement = false}};
    (void)insert_numbered(buf, 0, 400, s);
    auto b = buf.make_batch(gear::batch_size{256}, gear::window_length{8});
    gear::device_rng dg(0x5eed'0002);
    const captured graph(s.s, [&] { buf.sample_async(b, random_start, dg, s); });
    int good = 0;
    std::vector<std::int64_t> first;
    bool differ = false;
    for (int k = 0; k < 1000; ++k) {
      graph.replay(s.s);
      if (k % 250 == 0) {  // each replay leaves the claim table and the arrivals word clear
        const auto& w = b.workspace();
        std::vector<std::uint64_t> claims(static_cast<std::size_t>(w.size()));
        unsigned arrivals = 1;
        GEAR_CUDA_TRY(
            cudaMemcpy(claims.data(), w.claims(), claims.size() * 8, cudaMemcpyDeviceToHost));
        GEAR_CUDA_TRY(cudaMemcpy(&arrivals, w.arrivals(), 4, cudaMemcpyDeviceToHost));
        CHECK(std::count(claims.begin(), claims.end(), std::uint64_t{0}) == w.size());
        CHECK(arrivals == 0u);
      }
      const auto d = drawn::of(b);
      std::vector<std::int64_t> slots = d.slots;
      std::sort(slots.begin(), slots.end());
      bool ok = std::adjacent_find(slots.begin(), slots.end()) == slots.end() && slots[0] >= 0;
      for (std::size_t i = 0; i < d.v.size(); ++i)  // every valid step is its key's trajectory's
        ok = ok &&
             (d.mask[i] == 0 || static_cast<std::uint64_t>(d.v[i] / 1000) == d.keys[i / 8].ticket);
      good += ok;
      if (k == 0) first = slots;
      differ = differ || slots != first;
    }
    CHECK(good == 1000);
    CHECK(differ);  // the draws advance
    CHECK(dg.calls(s) == 1000);
  }
  SUBCASE("prioritized, with weights") {
    check_replays_equal_eager(gear::select::prioritized{.alpha = 0.7, .beta = 0.5}, 256,
                              random_start, 1000, true);
  }
  SUBCASE("prioritized, all priorities at their default") {
    check_replays_equal_eager(gear::select::prioritized{}, 64, gear::window{4}, 1000, false);
  }
}

TEST_CASE("replayed uniform samples follow the uniform law; frozen draws are rejected") {
  stream_holder s;
  using buffer = buffer_of<gear::select::uniform>;
  buffer buf{gear::capacity{200}, gear::max_length{max_len}};
  (void)insert_numbered(buf, 0, 200, s);
  constexpr std::int64_t rows = 64;
  constexpr int replays = 1000;
  auto b = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
  const std::vector<double> uniform(200, 1.0 / 200);
  const auto counts_of = [&](const captured& graph) {
    std::vector<double> counts(200, 0);
    for (int k = 0; k < replays; ++k) {
      graph.replay(s.s);
      for (const std::int64_t slot : to_host(b.slots_data(), rows)) {
        REQUIRE(slot >= 0);
        REQUIRE(slot < 200);
        counts[static_cast<std::size_t>(slot)] += 1;
      }
    }
    return counts;
  };
  gear::device_rng dg(11);
  const captured graph(s.s, [&] { buf.sample_async(b, gear::window{1}, dg, s); });
  const auto fit = chi2_test(counts_of(graph), uniform, rows * replays);
  MESSAGE("device_rng replays: chi2 " << fit.statistic << " (critical " << fit.critical << ")");
  CHECK_FALSE(fit.rejects());
  // Power: draws frozen into a graph (what a host rng's would be; gear refuses to capture those)
  // give every replay the first replay's rows.
  std::vector<double> frozen(200, 0);
  graph.replay(s.s);
  for (const std::int64_t slot : to_host(b.slots_data(), rows))
    frozen[static_cast<std::size_t>(slot)] += replays;
  const auto bad = chi2_test(frozen, uniform, rows * replays);
  MESSAGE("frozen draws: chi2 " << bad.statistic << " (critical " << bad.critical << ")");
  CHECK(bad.rejects());
}

namespace {

// A stand-in for a learner's TD errors: row r's new priority, from the bytes it gathered.
__global__ void td_errors(const std::int32_t* v, std::int64_t rows, std::int64_t length,
                          float* td) {
  const std::int64_t r = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (r < rows) td[r] = 0.05f + static_cast<float>((v[r * length] / 1000 * 7919) % 97) / 10.0f;
}

/// One PER step on `s`: a sample of batch.batch_size() windows `w`, TD errors from its bytes into
/// `td`, and the update of the rows' priorities from them (device memory). Eager with a gear::rng,
/// or captured with a gear::device_rng.
template <class Buffer, class Batch, class Draws>
void per_step(Buffer& buf, Batch& batch, Draws& draws, const gear::window& w, float* td,
              cuda::stream_ref s) {
  const std::int64_t rows = batch.batch_size();
  buf.sample_async(batch, w, draws, s);
  td_errors<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, s.get()>>>(
      reinterpret_cast<const std::int32_t*>(batch.column_data(0)), rows, w.length, td);
  GEAR_CHECK_LAUNCH("td_errors");
  buf.update_priorities_async(std::span<const gear::key>(batch.keys_data(), rows),
                              std::span<const float>(td, rows), gear::memory_kind::device, s);
}

}  // namespace

TEST_CASE("a captured PER step (sample, TD errors, update from device memory) replays as eager") {
  stream_holder s;
  using buffer = buffer_of<gear::select::prioritized>;
  // 600 pairs: the update's mark launch has 3 blocks, so its last-block epoch store is exercised.
  constexpr std::int64_t rows = 600, len = 4;
  constexpr int steps = 1000;
  const gear::select::prioritized policy{.alpha = 0.8, .beta = 0.6};
  const gear::window w{len, 0, gear::anchor::random, gear::pad::tail};
  float* td = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&td, rows * sizeof(float)));
  // The same step, eager with gear::rng, or captured once with gear::device_rng.
  const auto step = [&](buffer& buf, auto& batch, auto& draws) {
    per_step(buf, batch, draws, w, td, s);
  };
  buffer eager_buf{gear::capacity{300}, gear::max_length{max_len}, policy};
  buffer graph_buf{gear::capacity{300}, gear::max_length{max_len}, policy};
  (void)insert_numbered(eager_buf, 0, 300, s);
  (void)insert_numbered(graph_buf, 0, 300, s);
  auto eager_batch = eager_buf.make_batch(gear::batch_size{rows}, gear::window_length{len});
  auto graph_batch = graph_buf.make_batch(gear::batch_size{rows}, gear::window_length{len});
  gear::rng g(77);
  gear::device_rng dg(77);
  const captured graph(s.s, [&] { step(graph_buf, graph_batch, dg); });
  CHECK(graph.kernels() == 4);  // the gather (rows and weights drawn there); TD errors; mark, apply
  int equal = 0;
  for (int k = 0; k < steps; ++k) {
    step(eager_buf, eager_batch, g);
    graph.replay(s.s);  // synchronises s, and with it the eager step before
    equal += drawn::of(graph_batch) == drawn::of(eager_batch);
    if (k % 10 == 9) {  // eager inserts between replays: commits, evictions, stale keys
      (void)insert_numbered(eager_buf, 1000 + k, 20, s);
      (void)insert_numbered(graph_buf, 1000 + k, 20, s);
    }
  }
  CHECK(equal == steps);
  CHECK(graph_buf.selection_state().priorities(s) == eager_buf.selection_state().priorities(s));
  CHECK(graph_buf.selection_state().nodes(s) == eager_buf.selection_state().nodes(s));
  eager_buf.check_priority_updates(s);
  graph_buf.check_priority_updates(s);
  GEAR_CUDA_TRY(cudaFree(td));
}

// pinned_host records events for the host's writes (stream_order.hpp); a captured call binds the
// buffer and records none, so a host insert into a bound buffer waits for its stream.
TEST_CASE("pinned_host: a captured PER step binds the buffer; a host insert waits for replays") {
  stream_holder s;
  using buffer = gear::replay_buffer<vspec, gear::storage::pinned_host, gear::select::prioritized>;
  constexpr std::int64_t rows = 256, len = 4, capacity = 64;
  buffer buf{gear::capacity{capacity}, gear::max_length{max_len}, gear::select::prioritized{}};
  (void)insert_numbered(buf, 0, capacity, s);  // eager calls: these record events
  auto batch = buf.make_batch(gear::batch_size{rows}, gear::window_length{len});
  float* td = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&td, rows * sizeof(float)));
  const gear::window w{len, 0, gear::anchor::random, gear::pad::tail};
  gear::device_rng dg(11);
  const captured graph(s.s, [&] { per_step(buf, batch, dg, w, td, s); });
  CHECK(graph.kernels() == 4);
  // Twenty replays queued behind a kernel; an insert then overwrites every slot with the CPU. It
  // must wait for the replays: each row of the last one holds one old trajectory, whole.
  gear_test::hold(s, 200);
  for (int k = 0; k < 20; ++k) graph.launch(s.s);
  (void)insert_numbered(buf, 1000, capacity, s);
  GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
  const drawn d = drawn::of(batch);
  int whole = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t n = d.v[std::size_t(r * len)] / 1000;
    bool ok = n < capacity && d.mask[std::size_t(r * len)] == 1;
    for (std::int64_t t = 1; t < len; ++t)
      if (d.mask[std::size_t(r * len + t)] == 1)
        ok = ok && d.v[std::size_t(r * len + t)] == d.v[std::size_t(r * len + t - 1)] + 1;
    whole += ok;
  }
  CHECK(whole == rows);
  CHECK(dg.calls(s) == 20);
  GEAR_CUDA_TRY(cudaFree(td));
}

TEST_CASE("calls that cannot be captured are refused during a capture, changing nothing") {
  stream_holder s;
  using buffer = buffer_of<gear::select::prioritized>;
  buffer buf{gear::capacity{32}, gear::max_length{max_len}};
  const auto keys = insert_numbered(buf, 0, 16, s);
  auto b = buf.make_batch(gear::batch_size{8}, gear::window_length{2});
  gear::rng g(4);
  buf.sample(b, gear::window{2}, g, s);  // b.keys_data(): 8 keys in device memory
  const std::vector<float> ones(keys.size(), 1.0f);
  float* ones_device = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&ones_device, 8 * sizeof(float)));
  GEAR_CUDA_TRY(cudaMemcpy(ones_device, ones.data(), 8 * sizeof(float), cudaMemcpyHostToDevice));
  const std::int32_t one = 1;
  auto open_writer = buf.make_writer(s);
  open_writer.append(&one);
  std::optional<buffer::writer_type> doomed;
  doomed.emplace(buf.make_writer(s));
  const gear::reservation reserved = buf.reserve(1, s);
  gear::sharded_buffer<vspec, gear::storage::device> sharded({0, 0}, gear::capacity{16},
                                                             gear::max_length{max_len});
  (void)insert_numbered(sharded, 0, 8, s);
  auto sharded_batch = sharded.make_batch(gear::batch_size{4}, gear::window_length{2});
  gear::device_rng dg(4);
  GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
  const std::int64_t size = buf.size();
  const std::uint64_t tickets = buf.tickets_issued();
  const std::vector<float> priorities = buf.selection_state().priorities(s);
  const std::uint64_t draws = g.calls();
  std::vector<int> refused;
  GEAR_CUDA_TRY(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal));
  const auto attempt = [&](auto&& call) {
    try {
      call();
      refused.push_back(0);
    } catch (const gear::error& e) {
      refused.push_back(e.code() == gear::errc::invalid_argument &&
                        std::string(e.what()).find("CUDA graph") != std::string::npos);
    }
  };
  attempt([&] { buf.sample_async(b, gear::window{2}, g, s); });  // host draws: frozen
  attempt([&] {
    std::vector<std::int32_t> v(4, 1);
    std::vector<std::int64_t> lengths{4};
    std::vector<gear::key> k(1);
    buf.insert_async(gear::trajectories<vspec>{lengths, {gear::input(v.data())}}, k, s);
  });
  attempt([&] { (void)buf.reserve(1, s); });
  attempt([&] { buf.erase_async(std::span<const gear::key>(keys.data(), 1), s); });
  attempt([&] { (void)buf.update_priorities_async(keys, ones, s); });  // host spans
  attempt([&] { (void)buf.make_writer(s); });
  attempt([&] { open_writer.append(&one); });
  attempt([&] { (void)open_writer.commit_async(); });
  attempt([&] {
    const std::int64_t length = 1;
    gear::key k{};
    buf.commit_async(reserved, std::span<const std::int64_t>(&length, 1),
                     std::span<gear::key>(&k, 1), s);
  });
  attempt([&] {  // synchronous, so not capturable even from device memory
    buf.update_priorities(std::span<const gear::key>(b.keys_data(), 8),
                          std::span<const float>(ones_device, 8), gear::memory_kind::device, s);
  });
  attempt([&] { buf.sample(b, gear::window{2}, dg, s); });  // synchronous
  attempt([&] { sharded.sample_async(sharded_batch, gear::window{2}, g, s); });
  doomed.reset();  // a writer destroyed in the capture gives nothing up: its slot stays pending
  cudaGraph_t graph{};
  GEAR_CUDA_TRY(cudaStreamEndCapture(s.s, &graph));  // the capture is still valid
  std::size_t nodes = 1;
  GEAR_CUDA_TRY(cudaGraphGetNodes(graph, nullptr, &nodes));
  GEAR_CUDA_TRY(cudaGraphDestroy(graph));
  CHECK(nodes == 0);  // nothing was enqueued
  CHECK(refused == std::vector<int>(12, 1));
  CHECK(g.calls() == draws);
  CHECK(buf.size() == size);
  CHECK(buf.tickets_issued() == tickets);
  CHECK(buf.contains(keys[0]));
  const std::vector<float> after = buf.selection_state().priorities(s);  // bit for bit (NaN: none)
  CHECK(std::memcmp(after.data(), priorities.data(), after.size() * sizeof(float)) == 0);
  // And every call works again outside the capture.
  open_writer.append(&one);
  CHECK(buf.contains(open_writer.commit()));
  buf.sample(b, gear::window{2}, dg, s);
  CHECK(dg.calls(s) == 1);
  GEAR_CUDA_TRY(cudaFree(ones_device));
}

TEST_CASE("a replay samples the buffer as it is when it runs") {
  stream_holder s;
  SUBCASE("uniform: inserts after the capture are drawn, with the new count") {
    buffer_of<gear::select::uniform> buf{gear::capacity{300}, gear::max_length{max_len}};
    (void)insert_numbered(buf, 0, 100, s);
    auto b = buf.make_batch(gear::batch_size{128}, gear::window_length{1});
    gear::device_rng dg(3);
    const captured graph(s.s, [&] { buf.sample_async(b, gear::window{1}, dg, s); });
    (void)insert_numbered(buf, 100, 200, s);  // live: 100 -> 300 after the capture
    std::vector<double> counts(300, 0);
    constexpr int replays = 400;
    for (int k = 0; k < replays; ++k) {
      graph.replay(s.s);
      const auto d = drawn::of(b);
      for (std::size_t r = 0; r < d.slots.size(); ++r) {
        REQUIRE(buf.contains(d.keys[r]));
        CHECK(d.probabilities[r] == doctest::Approx(1.0 / 300));
        counts[static_cast<std::size_t>(d.v[r] / 1000)] += 1;  // the bytes name the trajectory
      }
    }
    const auto fit = chi2_test(counts, std::vector<double>(300, 1.0 / 300), 128.0 * replays);
    CHECK_FALSE(fit.rejects());
    // Power: the law of the capture's time (the first 100 only) is rejected.
    std::vector<double> old(300, 0);
    std::fill_n(old.begin(), 100, 1.0 / 100);
    CHECK(chi2_test(counts, old, 128.0 * replays).rejects());
  }
  SUBCASE("prioritized: priorities updated between replays") {
    buffer_of<gear::select::prioritized> buf{gear::capacity{64}, gear::max_length{max_len},
                                             gear::select::prioritized{.alpha = 1.0}};
    const auto keys = insert_numbered(buf, 0, 64, s);
    auto b = buf.make_batch(gear::batch_size{256}, gear::window_length{1});
    gear::device_rng dg(5);
    const captured graph(s.s, [&] { buf.sample_async(b, gear::window{1}, dg, s); });
    const auto p = select_test::random_priorities(21, keys.size(), false);
    (void)buf.update_priorities(keys, p, s);
    const auto want = select_test::exact_probabilities(p, 1.0);
    std::vector<double> counts(64, 0);
    constexpr int replays = 400;
    for (int k = 0; k < replays; ++k) {
      graph.replay(s.s);
      for (const std::int32_t v :
           to_host(reinterpret_cast<const std::int32_t*>(b.column_data(0)), 256))
        counts[static_cast<std::size_t>(v / 1000)] += 1;
    }
    CHECK_FALSE(chi2_test(counts, want, 256.0 * replays).rejects());
    CHECK(chi2_test(counts, std::vector<double>(64, 1.0 / 64), 256.0 * replays).rejects());
  }
  SUBCASE("erased after the capture: rows of slot -1, mask 0; the call number still advances") {
    buffer_of<gear::select::uniform> buf{gear::capacity{16}, gear::max_length{max_len}};
    const auto keys = insert_numbered(buf, 0, 16, s);
    auto b = buf.make_batch(gear::batch_size{32}, gear::window_length{4});
    gear::device_rng dg(9);
    const captured graph(s.s, [&] { buf.sample_async(b, gear::window{4}, dg, s); });
    buf.erase(keys, s);
    graph.replay(s.s);
    const auto d = drawn::of(b);
    CHECK(std::all_of(d.slots.begin(), d.slots.end(), [](std::int64_t x) { return x == -1; }));
    CHECK(std::all_of(d.mask.begin(), d.mask.end(), [](std::uint8_t m) { return m == 0; }));
    CHECK(std::all_of(d.keys.begin(), d.keys.end(),
                      [](const gear::key& k) { return k.ticket == gear::no_ticket; }));
    CHECK(dg.calls(s) == 1);
  }
}

TEST_CASE("a captured sample is one kernel, for each policy that draws on the GPU") {
  stream_holder s;
  buffer_of<gear::select::uniform> buf{gear::capacity{64}, gear::max_length{max_len}};
  (void)insert_numbered(buf, 0, 64, s);
  auto b = buf.make_batch(gear::batch_size{64}, gear::window_length{8});
  gear::device_rng dg(1);
  const captured graph(s.s, [&] { buf.sample_async(b, gear::window{8}, dg, s); });
  CHECK(graph.kernels() == 1);  // rows drawn in the gather
  // Without replacement (the gather's last block clears the claims) and prioritized (it writes
  // the weights): one kernel each too.
  buffer_of<gear::select::uniform> distinct{gear::capacity{64}, gear::max_length{max_len},
                                            gear::select::uniform{.replacement = false}};
  (void)insert_numbered(distinct, 0, 64, s);
  auto bd = distinct.make_batch(gear::batch_size{64}, gear::window_length{8});
  gear::device_rng dd(2);
  const captured once(s.s, [&] { distinct.sample_async(bd, gear::window{8}, dd, s); });
  CHECK(once.kernels() == 1);
  buffer_of<gear::select::prioritized> per{gear::capacity{64}, gear::max_length{max_len},
                                           gear::select::prioritized{}};
  (void)insert_numbered(per, 0, 64, s);
  auto bp = per.make_batch(gear::batch_size{64}, gear::window_length{8});
  gear::device_rng dp(3);
  const captured weighted(s.s, [&] { per.sample_async(bp, gear::window{8}, dp, s); });
  CHECK(weighted.kernels() == 1);
}

TEST_CASE("misuse of a device_rng is refused and leaves the buffer as it was") {
  stream_holder s, other;
  buffer_of<gear::select::uniform> buf{gear::capacity{32}, gear::max_length{max_len}};
  (void)insert_numbered(buf, 0, 20, s);
  auto b = buf.make_batch(gear::batch_size{8}, gear::window_length{2});
  const auto expect_refused = [&](auto&& call, const char* cause) {
    const std::int64_t size = buf.size();
    const std::uint64_t tickets = buf.tickets_issued();
    try {
      call();
      FAIL("not refused: " << cause);
    } catch (const gear::error& e) {
      CHECK(e.code() == gear::errc::invalid_argument);
      CHECK(std::string(e.what()).find(cause) != std::string::npos);
    }
    CHECK(buf.size() == size);
    CHECK(buf.tickets_issued() == tickets);
  };
  gear::device_rng dg(2);
  SUBCASE("max_times_sampled set") {
    buf.set_max_times_sampled(3);
    expect_refused([&] { buf.sample_async(b, gear::window{2}, dg, s); }, "max_times_sampled");
    CHECK(dg.calls(s) == 0);
  }
  SUBCASE("a buffer used from two streams") {
    buffer_of<gear::select::uniform> two{gear::capacity{32}, gear::max_length{max_len}};
    (void)insert_numbered(two, 0, 10, s);
    (void)insert_numbered(two, 10, 10, other);
    const std::int64_t size = two.size();
    auto b2 = two.make_batch(gear::batch_size{8}, gear::window_length{2});
    try {  // the insert on `other` landed: the buffer has seen two streams
      two.sample_async(b2, gear::window{2}, dg, s);
      FAIL("a buffer used from two streams was bound");
    } catch (const gear::error& e) {
      CHECK(e.code() == gear::errc::invalid_argument);
    }
    CHECK(two.size() == size);
    CHECK(dg.calls(s) == 0);
    gear::rng g(1);  // still sampled from either stream with a host rng
    two.sample(b2, gear::window{2}, g, other);
  }
  SUBCASE("once bound, calls on another stream") {
    buf.sample(b, gear::window{2}, dg, s);
    expect_refused([&] { (void)insert_numbered(buf, 100, 4, other); }, "gear::device_rng");
    gear::rng g(1);
    expect_refused([&] { buf.sample(b, gear::window{2}, g, other); }, "gear::device_rng");
    (void)insert_numbered(buf, 100, 4, s);  // its own stream goes on
    buf.sample(b, gear::window{2}, dg, s);
    CHECK(dg.calls(s) == 2);
  }
  SUBCASE("max_times_sampled on a bound buffer") {
    buf.sample(b, gear::window{2}, dg, s);
    expect_refused([&] { buf.set_max_times_sampled(2); }, "max_times_sampled");
    CHECK(buf.max_times_sampled() == 0);
  }
  SUBCASE("a refused sample binds neither the buffer nor the device_rng") {
    buffer_of<gear::select::uniform> empty{gear::capacity{32}, gear::max_length{max_len}};
    auto b2 = empty.make_batch(gear::batch_size{8}, gear::window_length{2});
    try {
      empty.sample_async(b2, gear::window{2}, dg, s);
      FAIL("an empty buffer was sampled");
    } catch (const gear::error& e) {
      CHECK(e.code() == gear::errc::empty_buffer);
    }
    (void)insert_numbered(empty, 0, 4, other);     // not bound to s
    empty.sample(b2, gear::window{2}, dg, other);  // nor is dg
    CHECK(dg.calls(other) == 1);
  }
  SUBCASE("one device_rng on two streams") {
    buf.sample(b, gear::window{2}, dg, s);
    buffer_of<gear::select::uniform> second{gear::capacity{32}, gear::max_length{max_len}};
    (void)insert_numbered(second, 0, 4, other);
    auto b2 = second.make_batch(gear::batch_size{8}, gear::window_length{2});
    const std::int64_t size = second.size();
    CHECK_THROWS_AS(second.sample(b2, gear::window{2}, dg, other), gear::error);
    CHECK(second.size() == size);
    CHECK(dg.calls(s) == 1);
  }
}

int main(int argc, char** argv) {
  if (!gear::detail::gpu_available()) {
    try {
      gear::device_rng g(1);
      std::fprintf(stderr, "graph_gpu_tests: a device_rng was made without a GPU\n");
      return 1;
    } catch (const gear::error& e) {
      if (e.code() != gear::errc::no_device) {
        std::fprintf(stderr, "graph_gpu_tests: expected no_device, got %s\n", e.what());
        return 1;
      }
    }
    std::printf("graph_gpu_tests: no GPU; device_rng correctly refused (no_device); skipping\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
