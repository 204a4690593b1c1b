// Selection suite, device side: prioritized and recency selection on device storage, checked
// against exact distributions (chi-square at significance 0.001, fixed printed seeds, power
// checks), the device sum tree against a host rebuild, and priority updates from device memory.
// The P3 / P3u timings and their baselines are in bench/ (prioritized/device/...).
// Exits 77 (skipped) where no GPU is usable.

#include <gear/gear.cuh>
#include <gear/rank_sampler.hpp>
#include <gear/sharded_buffer.hpp>

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>

#include "gpu_common.cuh"
#include "select_common.hpp"

using namespace select_test;
using gear_test::stream_holder;
using per_buffer = gear::replay_buffer<spec, gear::storage::device, gear::select::prioritized>;
using recent_buffer = gear::replay_buffer<spec, gear::storage::device, gear::select::recency>;
using per_state = gear::select::prioritized::state<gear::exec::device>;

namespace {

template <class T>
std::vector<T> to_host(const T* p, std::int64_t n) {
  std::vector<T> out(static_cast<std::size_t>(n));
  GEAR_CUDA_TRY(cudaMemcpy(out.data(), p, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

template <class Buffer>
std::vector<double> draw_counts(Buffer& buf, gear::rng& g, std::int64_t rows, int calls,
                                const std::vector<double>& want_by_slot, cuda::stream_ref s,
                                double* worst_p) {
  std::vector<double> counts(static_cast<std::size_t>(buf.capacity()), 0);
  auto b = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
  for (int c = 0; c < calls; ++c) {
    buf.sample(b, gear::window{1}, g, s);
    const auto slots = to_host(b.slots_data(), rows);
    const auto probs = to_host(b.probabilities_data(), rows);
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto slot = static_cast<std::size_t>(slots[static_cast<std::size_t>(r)]);
      REQUIRE(slot < counts.size());
      counts[slot] += 1;
      const double want = want_by_slot[slot];
      *worst_p = std::max(*worst_p, std::abs(probs[static_cast<std::size_t>(r)] - want) / want);
    }
  }
  return counts;
}

/// A selection request of `draw` whose outputs and workspace are batch `out`'s.
template <class Batch>
gear::selection_request request_into(Batch& out, const gear::rng_draw& draw) {
  gear::selection_request r;
  r.batch = out.batch_size();
  r.slots = out.slots_data();
  r.probabilities = out.probabilities_data();
  r.weights = out.weights_data();
  out.workspace().lend_to(r);
  r.draw = draw;
  return r;
}

/// Where a test puts the arrays of an update from device memory.
enum class gpu_memory { device, pinned, managed };

/// A copy of `v` in GPU-readable memory, freed at scope end (synchronise before).
template <class T>
class gpu_array {
 public:
  explicit gpu_array(const std::vector<T>& v, gpu_memory where = gpu_memory::device)
      : n_(v.size()), where_(where) {
    const std::size_t bytes = std::max<std::size_t>(n_, 1) * sizeof(T);
    void* p = nullptr;
    if (where == gpu_memory::device) GEAR_CUDA_TRY(cudaMalloc(&p, bytes));
    if (where == gpu_memory::pinned) GEAR_CUDA_TRY(cudaMallocHost(&p, bytes));
    if (where == gpu_memory::managed) GEAR_CUDA_TRY(cudaMallocManaged(&p, bytes));
    p_ = static_cast<T*>(p);
    GEAR_CUDA_TRY(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyDefault));
  }
  gpu_array(const gpu_array&) = delete;
  gpu_array& operator=(const gpu_array&) = delete;
  ~gpu_array() { (void)(where_ == gpu_memory::pinned ? cudaFreeHost(p_) : cudaFree(p_)); }
  [[nodiscard]] std::span<const T> span() const { return {p_, n_}; }
  [[nodiscard]] T* data() const { return p_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
  gpu_memory where_;
};

/// Keeps the GPU busy for about `ns` nanoseconds, so that work enqueued behind it has not run yet.
__global__ void hold_kernel(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
void hold_gpu(cudaStream_t s, double ms) {
  hold_kernel<<<1, 1, 0, s>>>(static_cast<unsigned long long>(ms * 1e6));
  GEAR_CHECK_LAUNCH("hold_kernel");
}

/// The code and message of the gear::error f throws (errc{} and "" if none).
template <class F>
std::pair<gear::errc, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const gear::error& e) {
    return {e.code(), e.what()};
  }
  return {gear::errc{}, ""};
}

/// Everything an update may change: the tree, the raw priorities (bytes: NaN marks empty slots)
/// and the largest priority.
struct per_snapshot {
  std::vector<double> nodes;
  std::vector<std::uint32_t> raw_bits;
  float max_priority = 0;
  friend bool operator==(const per_snapshot&, const per_snapshot&) = default;
};
per_snapshot snapshot(const per_state& st, cuda::stream_ref s) {
  per_snapshot out{st.nodes(s), {}, st.max_priority(s)};
  const auto raw = st.priorities(s);
  out.raw_bits.resize(raw.size());
  std::memcpy(out.raw_bits.data(), raw.data(), raw.size() * sizeof(float));
  return out;
}

/// The device tree equals, bit for bit, the host rebuild of its own leaves; and its leaves are
/// p^alpha of the given raw priorities (by slot) to 1e-12.
void check_device_tree(const per_state& st, const std::vector<float>& raw, double alpha,
                       cuda::stream_ref s) {
  const auto nodes = st.nodes(s);
  auto rebuilt = nodes;
  gear::detail::sum_tree_rebuild(rebuilt.data(), st.shape());
  CHECK(rebuilt == nodes);
  const auto dev_raw = st.priorities(s);
  double worst = 0;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    REQUIRE(dev_raw[i] == raw[i]);
    const double want = gear::detail::priority_leaf(raw[i], alpha);
    const double got =
        nodes[static_cast<std::size_t>(st.shape().leaf(static_cast<std::int64_t>(i)))];
    worst = std::max(worst, want == 0 ? std::abs(got) : std::abs(got - want) / want);
  }
  CHECK(worst < 1e-12);
}

}  // namespace

TEST_CASE("prioritized (device): 10^6 draws follow p^alpha / sum p^alpha; weights; power check") {
  stream_holder s;
  const std::uint64_t seed = 20261202;
  const double alpha = 0.7, beta = 0.5;
  MESSAGE("prioritized device chi-square seed " << seed);
  const std::int64_t n = 300;
  per_buffer buf{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{alpha, beta}};
  const auto keys = insert_ids(buf, 0, n, cuda::stream_ref{s});
  const auto p = random_priorities(seed, static_cast<std::size_t>(n));
  buf.update_priorities(keys, p, s);
  check_device_tree(buf.selection_state(), p, alpha, s);
  const auto want = exact_probabilities(p, alpha);
  gear::rng g{seed};
  double worst_p = 0;
  const auto counts = draw_counts(buf, g, 4096, 245, want, s, &worst_p);
  CHECK(worst_p < 1e-5);
  for (std::size_t i = 0; i < p.size(); ++i)
    if (p[i] == 0) CHECK(counts[i] == 0);
  const auto fit = chi2_test(counts, want, 4096.0 * 245);
  MESSAGE("chi2 " << fit.statistic << " df " << fit.df << " critical(0.001) " << fit.critical);
  CHECK_FALSE(fit.rejects());
  const auto wrong = chi2_test(counts, exact_probabilities(p, alpha * 0.97), 4096.0 * 245);
  MESSAGE("planted alpha " << alpha * 0.97 << ": chi2 " << wrong.statistic);
  CHECK(wrong.rejects());
  // Importance weights against the formula, normalised by the batch maximum.
  auto b = buf.make_batch(gear::batch_size{777}, gear::window_length{1});
  buf.sample(b, gear::window{1}, g, s);
  const auto slots = to_host(b.slots_data(), 777);
  const auto ws = to_host(b.weights_data(), 777);
  double max_w = 0;
  for (auto sl : slots) max_w = std::max(max_w, std::pow(double(n) * want[std::size_t(sl)], -beta));
  for (std::size_t r = 0; r < slots.size(); ++r) {
    const double w = std::pow(double(n) * want[std::size_t(slots[r])], -beta) / max_w;
    REQUIRE(std::abs(ws[r] - w) <= 1e-5 * w);
  }
}

namespace {

namespace gd = gear::detail;

/// The device descent (sum_tree_find_group) for each u: its slot and its leaf's value.
__global__ void descend_rows(const double* tree, gd::sum_tree_shape s, const double* u,
                             std::int64_t rows, std::int64_t* slots, double* leaves) {
  constexpr int threads = 256, group = gd::sum_tree_group;
  __shared__ gd::sum_tree_scan::TempStorage storage[threads / group];
  const std::int64_t row = (blockIdx.x * std::int64_t{threads} + threadIdx.x) / group;
  const int lane = static_cast<int>(threadIdx.x % group);
  double leaf = 0;
  const std::int64_t slot = gd::sum_tree_find_group(storage[threadIdx.x / group], tree, nullptr, 0,
                                                    s, u[row < rows ? row : 0], lane, leaf);
  if (row < rows && lane == 0) slots[row] = slot, leaves[row] = leaf;
}

/// sum_tree_find with each node's children taken off u one by one in index order: a descent the
/// device must not match, to show the test below tells the orders apart.
std::int64_t find_in_index_order(const std::vector<double>& tree, const gd::sum_tree_shape& s,
                                 double u) {
  std::int64_t j = 0;
  for (int d = 0; d + 1 < s.levels; ++d) {
    const double* child = tree.data() + s.offset[d + 1] + j * gd::sum_tree_fanout;
    int pick = -1, last = 0;
    for (int c = 0; c < gd::sum_tree_fanout && pick < 0; ++c) {
      if (!(child[c] > 0)) continue;
      last = c;
      if (u < child[c])
        pick = c;
      else
        u -= child[c];
    }
    for (int c = last + 1; c < gd::sum_tree_fanout; ++c) last = child[c] > 0 ? c : last;
    j = j * gd::sum_tree_fanout + (pick >= 0 ? pick : last);
  }
  return j;
}

}  // namespace

TEST_CASE("prioritized (device): the descent picks the host tree's leaf, draws at boundaries too") {
  const std::uint64_t seed = 2026120501;
  INFO("seed " << seed);
  std::mt19937_64 gen(seed);
  const std::int64_t n = 5000;
  const gd::sum_tree_shape shape = gd::make_sum_tree_shape(n);
  std::vector<double> tree(static_cast<std::size_t>(shape.total), 0.0);
  std::normal_distribution<double> log_p(0.0, 1.5);
  for (std::int64_t i = 0; i < n; ++i)
    tree[std::size_t(shape.leaf(i))] = i % 7 == 3 ? 0.0 : std::pow(std::exp(log_p(gen)), 0.6);
  gd::sum_tree_rebuild(tree.data(), shape);
  // Random draws, and draws at the boundaries the descent's prefixes make (and one ulp either
  // side), where the order of the additions decides the leaf.
  std::vector<double> u;
  for (int k = 0; k < 1024; ++k) u.push_back(gd::unit_interval(gen()) * tree[0]);
  for (int k = 0; k < 1024; ++k) {
    const std::int64_t leaf = static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(n));
    double boundary = 0;
    for (int d = 0; d + 1 < shape.levels; ++d) {
      std::int64_t below = leaf;  // the node of level d + 1 on the leaf's path
      for (int up = d + 2; up < shape.levels; ++up) below /= gd::sum_tree_fanout;
      const std::int64_t first = below / gd::sum_tree_fanout * gd::sum_tree_fanout;
      double prefix[gd::sum_tree_fanout];
      gd::sum_tree_scan_children(tree.data() + shape.offset[d + 1] + first, prefix);
      if (below > first) boundary += prefix[below - first - 1];
    }
    for (const double x :
         {boundary, std::nextafter(boundary, INFINITY), std::nextafter(boundary, -INFINITY)})
      if (x >= 0 && x < tree[0]) u.push_back(x);
  }
  const auto rows = static_cast<std::int64_t>(u.size());
  double *dtree = nullptr, *du = nullptr, *dleaves = nullptr;
  std::int64_t* dslots = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&dtree, tree.size() * sizeof(double)));
  GEAR_CUDA_TRY(cudaMalloc(&du, u.size() * sizeof(double)));
  GEAR_CUDA_TRY(cudaMalloc(&dleaves, u.size() * sizeof(double)));
  GEAR_CUDA_TRY(cudaMalloc(&dslots, u.size() * sizeof(std::int64_t)));
  GEAR_CUDA_TRY(cudaMemcpy(dtree, tree.data(), tree.size() * sizeof(double), cudaMemcpyDefault));
  GEAR_CUDA_TRY(cudaMemcpy(du, u.data(), u.size() * sizeof(double), cudaMemcpyDefault));
  descend_rows<<<static_cast<unsigned>((rows * gd::sum_tree_group + 255) / 256), 256>>>(
      dtree, shape, du, rows, dslots, dleaves);
  GEAR_CHECK_LAUNCH("descend_rows");
  const auto slots = to_host(dslots, rows);
  const auto leaves = to_host(dleaves, rows);
  std::int64_t same = 0, index_order_differs = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const double x = u[std::size_t(r)];
    const std::int64_t want = gd::sum_tree_find(tree.data(), shape, x);
    same += slots[std::size_t(r)] == want;
    index_order_differs += find_in_index_order(tree, shape, x) != want;
    CHECK(leaves[std::size_t(r)] == tree[std::size_t(shape.leaf(slots[std::size_t(r)]))]);
    CHECK(leaves[std::size_t(r)] > 0);
  }
  MESSAGE("descent: " << same << " of " << rows << " draws pick the host tree's leaf; a descent "
                      << "in index order picks another for " << index_order_differs);
  CHECK(same == rows);
  CHECK(index_order_differs > 0);  // power: the draws tell the two orders apart
  for (void* p : {static_cast<void*>(dtree), static_cast<void*>(du), static_cast<void*>(dleaves),
                  static_cast<void*>(dslots)})
    GEAR_CUDA_TRY(cudaFree(p));
}

TEST_CASE(
    "prioritized (device): each way of writing the weights gives the same batch, bit for bit") {
  // The state alone over a full table (slot i holds ticket i), as the bench's P3 row runs it.
  stream_holder s;
  const std::uint64_t seed = 2026120502;
  INFO("seed " << seed);
  const std::int64_t n = 1 << 16;
  per_state st(gear::select::prioritized{0.6, 0.4}, n);
  gd::allocation lengths(gear::memory_kind::device, static_cast<std::size_t>(n) * 8);
  gd::allocation tickets(gear::memory_kind::device, static_cast<std::size_t>(n) * 8);
  {
    const std::vector<std::int64_t> ones(static_cast<std::size_t>(n), 1);
    std::vector<std::uint64_t> first(static_cast<std::size_t>(n));
    std::iota(first.begin(), first.end(), std::uint64_t{0});
    GEAR_CUDA_TRY(cudaMemcpy(lengths.data(), ones.data(), lengths.size(), cudaMemcpyDefault));
    GEAR_CUDA_TRY(cudaMemcpy(tickets.data(), first.data(), tickets.size(), cudaMemcpyDefault));
  }
  gear::slot_table t;
  t.lengths = lengths.as<std::int64_t>();
  t.tickets = tickets.as<std::uint64_t>();
  t.capacity = t.occupied = t.live = n;
  t.next_ticket = static_cast<std::uint64_t>(n);
  st.on_commit(t, 0, n, s);
  std::vector<gear::key> keys(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) keys[std::size_t(i)].ticket = static_cast<std::uint64_t>(i);
  st.update(t, keys, random_priorities(seed, keys.size()), s);
  using w = gd::select_weights;
  for (const std::int64_t rows : {600, 4096}) {
    CAPTURE(rows);
    gear::batch<spec> out(gear::memory_kind::device, gear::batch_size{rows},
                          gear::window_length{1});
    gear::selection_request r = request_into(out, gear::rng{seed}.next());
    struct result {
      std::vector<std::int64_t> slots;
      std::vector<float> probabilities, weights;
    };
    // Before each way its outputs and its scratch are poisoned (a scratch word of 0xC0 bytes reads
    // as -8577.5): a block that read another's words before they were written (a barrier that
    // does not hold) gives weights of 0 or infinity.
    auto run = [&](w how) {
      GEAR_CUDA_TRY(cudaMemsetAsync(r.weights, 0xFF, static_cast<std::size_t>(rows) * 4, s.s));
      GEAR_CUDA_TRY(
          cudaMemsetAsync(r.scratch, 0xC0, static_cast<std::size_t>(r.scratch_size) * 8, s.s));
      const w taken = st.select(t, r, s, how);
      GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
      CHECK(taken == how);  // each way can run here: an arrivals word; a grid that fits an H100
      return result{to_host(r.slots, rows), to_host(r.probabilities, rows),
                    to_host(r.weights, rows)};
    };
    const result grid = run(w::grid_sync), second = run(w::second_launch),
                 last = run(w::last_block);
    for (const result* other : {&last, &grid}) {  // each against the two-launch way
      CHECK(other->slots == second.slots);
      CHECK(std::memcmp(other->probabilities.data(), second.probabilities.data(), rows * 4) == 0);
      CHECK(std::memcmp(other->weights.data(), second.weights.data(), rows * 4) == 0);
    }
    // The weights are (P_min / P_i)^beta of the batch: 1 at the least likely row, none above.
    float largest = 0;
    for (const float x : second.weights) largest = std::max(largest, x);
    CHECK(largest == doctest::Approx(1.0f));
  }
}

TEST_CASE(
    "prioritized (device), rows drawn in the gather: the rows, probabilities and weights "
    "select() gives, bit for bit; a tree of zeros gives uniform rows of weight 1") {
  stream_holder s;
  const std::uint64_t seed = 2026120503;
  INFO("seed " << seed);
  const std::int64_t n = 5000;
  for (const bool zeros : {false, true}) {
    CAPTURE(zeros);
    per_buffer buf{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
    const auto k = insert_ids(buf, 0, n, cuda::stream_ref{s});
    buf.update_priorities(
        k,
        zeros ? std::vector<float>(std::size_t(n), 0.0f) : random_priorities(seed, std::size_t(n)),
        s);
    // Rows of one 4-byte column, 8 to a gather block (601: a block's last groups have no row),
    // up to the largest batch whose weights the gather's last block writes.
    for (const std::int64_t rows : {std::int64_t{1}, std::int64_t{64}, std::int64_t{600},
                                    std::int64_t{601}, std::int64_t{2048}}) {
      CAPTURE(rows);
      // sample(): the gather draws the rows (at most two waves of blocks, an arrivals word).
      auto fused = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
      gear::rng g{seed + static_cast<std::uint64_t>(rows)};
      GEAR_CUDA_TRY(cudaMemsetAsync(fused.weights_data(), 0xFF, std::size_t(rows) * 4, s.s));
      buf.sample(fused, gear::window{1}, g, s);
      // select() with the same draw, weights in a second launch.
      auto apart = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
      const gear::selection_request r =
          request_into(apart, gear::rng{seed + static_cast<std::uint64_t>(rows)}.next());
      CHECK(buf.selection_state().select(buf.selection_table(), r, s,
                                         gd::select_weights::second_launch) ==
            gd::select_weights::second_launch);
      GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
      CHECK(to_host(fused.slots_data(), rows) == to_host(apart.slots_data(), rows));
      const auto pf = to_host(fused.probabilities_data(), rows),
                 pa = to_host(apart.probabilities_data(), rows);
      const auto wf = to_host(fused.weights_data(), rows), wa = to_host(apart.weights_data(), rows);
      CHECK(std::memcmp(pf.data(), pa.data(), std::size_t(rows) * 4) == 0);
      CHECK(std::memcmp(wf.data(), wa.data(), std::size_t(rows) * 4) == 0);
      if (zeros)
        CHECK(std::count(wf.begin(), wf.end(), 1.0f) == rows);
      else
        CHECK(*std::max_element(wf.begin(), wf.end()) == doctest::Approx(1.0f));
      CHECK(to_host(fused.workspace().arrivals(), 1)[0] == 0u);
      // Every row names the trajectory whose bytes it holds.
      const auto keys = to_host(fused.keys_data(), rows);
      const auto ids = to_host(reinterpret_cast<const std::int32_t*>(fused.column_data(0)), rows);
      for (std::int64_t i = 0; i < rows; ++i)
        REQUIRE(keys[std::size_t(i)] == k[std::size_t(ids[std::size_t(i)])]);
    }
  }
}

TEST_CASE("prioritized (device): host and device select the same slots from the same tree") {
  stream_holder s;
  const std::uint64_t seed = 77;
  INFO("seed " << seed);
  const std::int64_t n = 5000;
  per_buffer dev{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
  gear::replay_buffer<spec, gear::storage::host, gear::select::prioritized> host{
      gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
  const auto kd = insert_ids(dev, 0, n, cuda::stream_ref{s});
  const auto kh = insert_ids(host, 0, n);
  const auto p = random_priorities(seed, static_cast<std::size_t>(n));
  dev.update_priorities(kd, p, s);
  host.update_priorities(kh, p);
  gear::rng gd{seed}, gh{seed};
  auto bd = dev.make_batch(gear::batch_size{4096}, gear::window_length{1});
  auto bh = host.make_batch(gear::batch_size{4096}, gear::window_length{1});
  dev.sample(bd, gear::window{1}, gd, s);
  host.sample(bh, gear::window{1}, gh);
  const auto sd = to_host(bd.slots_data(), 4096);
  std::int64_t same = 0;
  for (std::int64_t r = 0; r < 4096; ++r) same += sd[std::size_t(r)] == bh.slots_data()[r];
  // Leaves may differ in the last bit (device pow), which can move a draw at a boundary.
  CHECK(same >= 4090);
}

TEST_CASE(
    "prioritized (device): the selection's last block writes the weights; batches over "
    "2048 rows take a second launch; trees of 1 to 6 levels") {
  // Slots, probabilities and weights are poisoned before each sample. Slots are compared with the
  // host tree's selection from the same draws (a wrong descent through the levels a block reads
  // into shared memory would pick other slots); probabilities and weights with their formulas;
  // and the batch's arrivals word must be back at 0 after every sample, or the next sample's
  // last block would never know it is last.
  stream_holder s;
  const double alpha = 0.6, beta = 0.7;
  for (const std::int64_t n : {1, 8, 200, 1000, 5000, 70000}) {  // 1, 2, 3, 4, 5, 6 levels
    for (const std::int64_t rows : {1, 777, 2048, 2049, 9000}) {
      INFO("capacity " << n << ", batch " << rows);
      per_buffer dev{gear::capacity{n}, gear::max_length{1},
                     gear::select::prioritized{alpha, beta}};
      gear::replay_buffer<spec, gear::storage::host, gear::select::prioritized> host{
          gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{alpha, beta}};
      const auto kd = insert_ids(dev, 0, n, cuda::stream_ref{s});
      const auto kh = insert_ids(host, 0, n);
      const auto p = random_priorities(static_cast<std::uint64_t>(n), static_cast<std::size_t>(n));
      dev.update_priorities(kd, p, s);
      host.update_priorities(kh, p);
      const auto want = exact_probabilities(p, alpha);
      auto bd = dev.make_batch(gear::batch_size{rows}, gear::window_length{1});
      auto bh = host.make_batch(gear::batch_size{rows}, gear::window_length{1});
      gear::rng gd{static_cast<std::uint64_t>(rows)}, gh{static_cast<std::uint64_t>(rows)};
      for (int call = 0; call < 3; ++call) {
        GEAR_CUDA_TRY(cudaMemsetAsync(bd.slots_data(), 0xFF, std::size_t(rows) * 8, s.s));
        GEAR_CUDA_TRY(cudaMemsetAsync(bd.probabilities_data(), 0xFF, std::size_t(rows) * 4, s.s));
        GEAR_CUDA_TRY(cudaMemsetAsync(bd.weights_data(), 0xFF, std::size_t(rows) * 4, s.s));
        dev.sample(bd, gear::window{1}, gd, s);
        host.sample(bh, gear::window{1}, gh);
        const auto slots = to_host(bd.slots_data(), rows);
        const auto probs = to_host(bd.probabilities_data(), rows);
        const auto weights = to_host(bd.weights_data(), rows);
        CHECK(to_host(bd.workspace().arrivals(), 1)[0] == 0u);
        std::int64_t same = 0;
        double smallest = 1;
        for (std::int64_t r = 0; r < rows; ++r) {
          const auto slot = slots[std::size_t(r)];
          REQUIRE(slot >= 0);
          REQUIRE(slot < n);
          same += slot == bh.slots_data()[r];
          const double w = want[std::size_t(slot)];
          REQUIRE(w > 0);
          REQUIRE(std::abs(probs[std::size_t(r)] - w) <= 1e-5 * w);
          smallest = std::min(smallest, w);
        }
        // Leaves may differ in the last bit (device pow), which can move a draw at a boundary.
        CHECK(same >= rows - std::max<std::int64_t>(1, rows / 500));
        float largest = 0;
        for (std::int64_t r = 0; r < rows; ++r) {
          const double w = std::pow(smallest / want[std::size_t(slots[std::size_t(r)])], beta);
          REQUIRE(std::abs(weights[std::size_t(r)] - w) <= 1e-5 * w);
          largest = std::max(largest, weights[std::size_t(r)]);
        }
        CHECK(largest == 1.0f);  // the row of the smallest leaf: exp(0)
      }
    }
  }
}

TEST_CASE(
    "prioritized (device): with every priority 0 rows are uniform, weights 1, arrivals clear") {
  stream_holder s;
  per_buffer buf{gear::capacity{500}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
  const auto keys = insert_ids(buf, 0, 500, cuda::stream_ref{s});
  buf.update_priorities(keys, std::vector<float>(500, 0.0f), s);
  auto b = buf.make_batch(gear::batch_size{3000}, gear::window_length{1});
  gear::rng g{5};
  for (int call = 0; call < 3; ++call) {
    GEAR_CUDA_TRY(cudaMemsetAsync(b.weights_data(), 0xFF, 3000 * 4, s.s));
    buf.sample(b, gear::window{1}, g, s);
    const auto slots = to_host(b.slots_data(), 3000);
    const auto weights = to_host(b.weights_data(), 3000);
    const auto probs = to_host(b.probabilities_data(), 3000);
    for (std::size_t r = 0; r < slots.size(); ++r) {
      REQUIRE(slots[r] >= 0);
      REQUIRE(slots[r] < 500);
      REQUIRE(weights[r] == 1.0f);
      REQUIRE(probs[r] == 1.0f / 500);
    }
    CHECK(to_host(b.workspace().arrivals(), 1)[0] == 0u);
  }
}

TEST_CASE(
    "uniform without replacement (device): one launch; its last block clears the claims; "
    "large batches take a memset") {
  // Batches of every trajectory, five times over: a claim left from one sample would make a row
  // of the next find no slot (-1). The claim table and the arrivals word must be all 0 after.
  stream_holder s;
  // Up to 4096 rows of 4 bytes (8 to a gather block) the gather draws them (its last block clears
  // the claims); 4096 rows of 16 KiB (a block each, over two waves of gather blocks) a selection
  // launch whose last block clears them; 9000 rows take a memset and the selection launch
  // instead.
  using padded =
      gear::spec<gear::column<"id", std::int32_t>, gear::column<"pad", std::int32_t, 4096>>;
  REQUIRE(std::int64_t{gd::tuning::fused_gather_max_waves} * gd::multiprocessors() *
              gd::tuning::copy_blocks_per_sm <
          4096);  // so that 4096 rows of one block each take the selection launch
  auto check = [&](auto& buf, std::int64_t n) {
    auto b = buf.make_batch(gear::batch_size{n}, gear::window_length{1});
    gear::rng g{static_cast<std::uint64_t>(n)};
    for (int call = 0; call < 5; ++call) {
      GEAR_CUDA_TRY(cudaMemsetAsync(b.slots_data(), 0xFF, std::size_t(n) * 8, s.s));
      buf.sample(b, gear::window{1}, g, s);
      auto slots = to_host(b.slots_data(), n);
      std::sort(slots.begin(), slots.end());
      for (std::int64_t r = 0; r < n; ++r) REQUIRE(slots[std::size_t(r)] == r);  // each once
      const auto& w = b.workspace();
      const auto claims = to_host(w.claims(), w.size());
      CHECK(std::count(claims.begin(), claims.end(), std::uint64_t{0}) == w.size());
      CHECK(to_host(w.arrivals(), 1)[0] == 0u);
    }
  };
  for (const std::int64_t n : {1, 255, 256, 257, 600, 4096, 9000}) {
    INFO("capacity and batch " << n << " of 4 bytes");
    gear::replay_buffer<spec, gear::storage::device, gear::select::uniform> buf{
        gear::capacity{n}, gear::max_length{1}, gear::select::uniform{.replacement = false}};
    (void)insert_ids(buf, 0, n, cuda::stream_ref{s});
    check(buf, n);
  }
  {
    constexpr std::int64_t n = 4096;
    INFO("capacity and batch " << n << " of 16 KiB");
    gear::replay_buffer<padded, gear::storage::device, gear::select::uniform> buf{
        gear::capacity{n}, gear::max_length{1}, gear::select::uniform{.replacement = false}};
    std::vector<std::int32_t> ids(n), pad(std::size_t(n) * 4096, 7);
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<gear::key> keys(n);
    buf.insert({std::vector<std::int64_t>(n, 1),
                {gear::input(ids.data()), gear::input(pad.data(), {4096})}},
               keys, s);
    check(buf, n);
  }
}

TEST_CASE(
    "uniform without replacement (device), rows drawn in the gather: a row's blocks copy one "
    "trajectory; rows distinct; inclusion uniform (chi-square 0.001), with its power") {
  // Each row takes two blocks of its own (16 KiB chunks of column a) and a group in a block of
  // eight id rows: every block and group of a row claims the row's slot itself, and all must
  // copy the same trajectory.
  using wide = gear::spec<gear::column<"a", std::int32_t, 2048>, gear::column<"id", std::int32_t>>;
  constexpr std::int64_t n = 300, len = 4, steps = n * len;
  stream_holder s;
  gear::replay_buffer<wide, gear::storage::device, gear::select::uniform> buf{
      gear::capacity{n}, gear::max_length{len}, gear::select::uniform{.replacement = false}};
  std::vector<std::int32_t> a(static_cast<std::size_t>(steps) * 2048), id(steps);
  for (std::int64_t t = 0; t < steps; ++t) {
    id[std::size_t(t)] = static_cast<std::int32_t>(t / len);
    std::fill_n(a.begin() + t * 2048, 2048, static_cast<std::int32_t>(t / len));
  }
  std::vector<gear::key> keys(n);
  buf.insert(
      {std::vector<std::int64_t>(n, len), {gear::input(a.data(), {2048}), gear::input(id.data())}},
      keys, s);
  std::map<std::uint64_t, std::int32_t> id_of;
  for (std::int64_t i = 0; i < n; ++i)
    id_of[keys[std::size_t(i)].ticket] = static_cast<std::int32_t>(i);
  gear::rng g{20261205};
  // Every byte of `rows` rows agrees with the row's key; the keys are distinct. Returns the ids.
  auto sample_checked = [&](auto& b, std::int64_t rows, bool every_byte) {
    buf.sample(b, gear::window{len}, g, s);
    const auto k = to_host(b.keys_data(), rows);
    std::vector<std::int32_t> ids;
    for (const gear::key& key : k) ids.push_back(id_of.at(key.ticket));
    if (every_byte) {
      const auto col_a = to_host(b.template column<"a">().data_handle(), rows * len * 2048);
      const auto col_id = to_host(b.template column<"id">().data_handle(), rows * len);
      std::int64_t wrong = 0;
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t e = 0; e < len * 2048; ++e)
          wrong += col_a[std::size_t(r * len * 2048 + e)] != ids[std::size_t(r)];
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t t = 0; t < len; ++t)
          wrong += col_id[std::size_t(r * len + t)] != ids[std::size_t(r)];
      REQUIRE(wrong == 0);
    }
    std::vector<std::int32_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    REQUIRE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    const auto& w = b.workspace();
    const auto claims = to_host(w.claims(), w.size());
    REQUIRE(std::count(claims.begin(), claims.end(), std::uint64_t{0}) == w.size());
    REQUIRE(to_host(w.arrivals(), 1)[0] == 0u);
    return ids;
  };
  SUBCASE("every trajectory in every sample: rows race for slots, and fall back to the scan") {
    auto b = buf.make_batch(gear::batch_size{n}, gear::window_length{len});
    for (int call = 0; call < 20; ++call)
      CHECK(sample_checked(b, n, true).size() == std::size_t(n));
  }
  SUBCASE("64 of 300: inclusion uniform") {
    constexpr std::int64_t rows = 64;
    constexpr int calls = 3000;
    auto b = buf.make_batch(gear::batch_size{rows}, gear::window_length{len});
    std::vector<double> counts(n, 0.0);
    for (int call = 0; call < calls; ++call)
      for (const std::int32_t i : sample_checked(b, rows, call < 50)) counts[std::size_t(i)] += 1;
    const std::vector<double> uniform(n, 1.0 / n);
    // Inclusion counts of a sample without replacement vary less than multinomial counts, by
    // the finite-population factor (N - B) / (N - 1): the statistic is scaled back by it.
    const double scale = double(n - 1) / double(n - rows);
    chi2_result fit = chi2_test(counts, uniform, double(calls) * rows);
    fit.statistic *= scale;
    MESSAGE("inclusion chi2 (scaled) " << fit.statistic << " df " << fit.df << " critical(0.001) "
                                       << fit.critical);
    CHECK_FALSE(fit.rejects());
    // Power: the same counts against a law 5% off for every other trajectory are rejected.
    std::vector<double> tilted(n);
    for (std::int64_t i = 0; i < n; ++i) tilted[std::size_t(i)] = (i % 2 ? 1.05 : 0.95) / n;
    chi2_result planted = chi2_test(counts, tilted, double(calls) * rows);
    planted.statistic *= scale;
    MESSAGE("planted 5% tilt: chi2 (scaled) " << planted.statistic);
    CHECK(planted.rejects());
  }
}

namespace {

/// A row function that works as a block (thread 0 draws, a barrier shares the row) and says
/// neither per_thread nor row_group: the gather gives each of its rows a block of its own.
struct block_drawn_rows {
  gear::detail::uniform_rows inner;
  __device__ gear::selected_row operator()(std::int64_t row) const {
    __shared__ std::int64_t slot;
    __shared__ float probability;
    if (threadIdx.x == 0) {
      const gear::selected_row s = inner(row);
      slot = s.slot;
      probability = s.probability;
    }
    __syncthreads();
    return {slot, probability, 1.0f};
  }
};
// How each of gear's row functions is called (select/concept.hpp), checked when this compiles:
// each thread on its own, or every thread with its group; a function that says neither gets a
// block per row.
namespace gd_rows {
using namespace gear::detail;
template <class F>
constexpr int shared_by = gather_rows_per_block<drawn_rows<F>>;
static_assert(shared_by<block_drawn_rows> == 1);
static_assert(per_thread_rows<uniform_rows> && !grouped_rows<uniform_rows>);
static_assert(per_thread_rows<recency_rows> && !grouped_rows<recency_rows>);
static_assert(per_thread_rows<chosen_rows> && !grouped_rows<chosen_rows>);
static_assert(per_thread_rows<stored_rows> && !grouped_rows<stored_rows>);
static_assert(grouped_rows<uniform_gather_claims> && !per_thread_rows<uniform_gather_claims>);
static_assert(grouped_rows<prioritized_gather_rows> && !per_thread_rows<prioritized_gather_rows>);
static_assert(grouped_rows<drawn_rows<prioritized_gather_rows>>);
static_assert(per_thread_rows<drawn_rows<recency_rows>>);
static_assert(shared_by<uniform_rows> == tuning::gather_max_rows_per_block &&
              shared_by<recency_rows> == tuning::gather_max_rows_per_block &&
              shared_by<uniform_gather_claims> == tuning::gather_max_rows_per_block &&
              shared_by<prioritized_gather_rows> == tuning::gather_max_rows_per_block &&
              gather_rows_per_block<stored_rows> == tuning::gather_max_rows_per_block);
}  // namespace gd_rows

/// Uniform with replacement, drawn in the gather by block_drawn_rows: a policy written outside
/// gear whose row function needs the whole block.
struct block_uniform {
  template <class Space>
  class state {
   public:
    state(const block_uniform&, std::int64_t capacity)
        : inner_(gear::select::uniform{}, capacity) {}
    void validate(const gear::slot_table& t, std::int64_t batch) const {
      inner_.validate(t, batch);
    }
    void select(const gear::slot_table& t, const gear::selection_request& r,
                cuda::stream_ref stream) {
      inner_.select(t, r, stream);
    }
    [[nodiscard]] std::optional<block_drawn_rows> row_selector(
        const gear::slot_table& t,
        const gear::selection_request& r) const requires std::same_as<Space, gear::exec::device> {
      return block_drawn_rows{{t, r, true}};
    }

   private:
    gear::select::uniform::state<Space> inner_;
  };
};

}  // namespace

TEST_CASE(
    "a row function that works as a block gets a gather block per row: the rows, bytes and keys "
    "of the grouped uniform gather of the same draws") {
  stream_holder s;
  constexpr std::int64_t n = 1000;
  gear::replay_buffer<spec, gear::storage::device, block_uniform> blocks{gear::capacity{n},
                                                                         gear::max_length{1}};
  gear::replay_buffer<spec, gear::storage::device, gear::select::uniform> groups{
      gear::capacity{n}, gear::max_length{1}};
  (void)insert_ids(blocks, 0, n, cuda::stream_ref{s});
  (void)insert_ids(groups, 0, n, cuda::stream_ref{s});
  for (const std::int64_t rows : {1, 125, 1000}) {  // 125 and 1000: one gather launch each
    CAPTURE(rows);
    auto a = blocks.make_batch(gear::batch_size{rows}, gear::window_length{1});
    auto b = groups.make_batch(gear::batch_size{rows}, gear::window_length{1});
    gear::rng ga{static_cast<std::uint64_t>(rows)}, gb{static_cast<std::uint64_t>(rows)};
    for (int call = 0; call < 3; ++call) {
      blocks.sample(a, gear::window{1}, ga, s);
      groups.sample(b, gear::window{1}, gb, s);
      const auto slots = to_host(a.slots_data(), rows);
      CHECK(slots == to_host(b.slots_data(), rows));
      CHECK(to_host(a.probabilities_data(), rows) == to_host(b.probabilities_data(), rows));
      const auto ids = to_host(a.column<"id">().data_handle(), rows);
      CHECK(ids == to_host(b.column<"id">().data_handle(), rows));
      std::int64_t wrong = 0;  // insert_ids put id i in slot i
      for (std::int64_t r = 0; r < rows; ++r)
        wrong += slots[std::size_t(r)] < 0 || ids[std::size_t(r)] != slots[std::size_t(r)];
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("prioritized (device): duplicates (last write wins), stale keys, bad priorities") {
  stream_holder s;
  per_buffer buf{gear::capacity{8}, gear::max_length{1}, gear::select::prioritized{0.5, 0.5}};
  const auto old = insert_ids(buf, 0, 8, cuda::stream_ref{s});
  const auto k = insert_ids(buf, 8, 3, cuda::stream_ref{s});  // evicts old[0..3)
  CHECK(buf.update_priorities(std::vector<gear::key>{k[2], old[5], k[2], old[5], k[2]},
                              std::vector<float>{4.0f, 9.0f, 16.0f, 1.0f, 0.25f},
                              s) == gear::priority_update_result{5, 0});
  std::vector<float> raw(8, 1.0f);
  raw[2] = 0.25f;
  raw[5] = 1.0f;
  check_device_tree(buf.selection_state(), raw, 0.5, s);
  CHECK(buf.selection_state().max_priority(s) == 16.0f);
  const auto nodes = buf.selection_state().nodes(s);
  auto sample_once = [&] {
    gear::rng g{4};
    auto b = buf.make_batch(gear::batch_size{100}, gear::window_length{1});
    buf.sample(b, gear::window{1}, g, s);
    return std::make_pair(to_host(b.slots_data(), 100), to_host(b.weights_data(), 100));
  };
  const auto before = sample_once();
  auto expect = [&](gear::errc code, std::vector<gear::key> ks, std::vector<float> ps) {
    CHECK(gear_test::code_of([&] { buf.update_priorities(ks, ps, s); }) == code);
    CHECK(buf.selection_state().nodes(s) == nodes);
    CHECK(buf.size() == 8);
    CHECK(sample_once() == before);
  };
  expect(gear::errc::invalid_priority, {k[0], k[1]}, {3.0f, std::nanf("")});
  expect(gear::errc::invalid_priority, {k[0], k[1]}, {-0.5f, 3.0f});
  expect(gear::errc::invalid_priority, {k[0], k[1]}, {3.0f, INFINITY});
  // A bad priority fails the update even where its key is stale.
  expect(gear::errc::invalid_priority, {k[0], old[1]}, {3.0f, std::nanf("")});
  // A key of another shard fails the whole update.
  gear::key other_shard = k[1];
  other_shard.shard = 1;
  expect(gear::errc::key_out_of_range, {k[0], other_shard}, {3.0f, 3.0f});
  // Stale keys (their slots were reserved again) are skipped and counted, the live pairs applied;
  // the skipped pairs' priorities do not raise the largest priority.
  CHECK(buf.update_priorities(std::vector<gear::key>{k[0], old[1], k[1], old[2]},
                              std::vector<float>{3.0f, 100.0f, 0.5f, 100.0f},
                              s) == gear::priority_update_result{2, 2});
  raw[0] = 3.0f;
  raw[1] = 0.5f;
  check_device_tree(buf.selection_state(), raw, 0.5, s);
  CHECK(buf.selection_state().max_priority(s) == 16.0f);
  CHECK(buf.size() == 8);
}

TEST_CASE(
    "prioritized (device): set_exponents refuses an alpha that takes a stored priority out "
    "of range (the range reduced on the GPU)") {
  stream_holder s;
  per_buffer buf{gear::capacity{8}, gear::max_length{1}, gear::select::prioritized{1.0, 0.4}};
  const auto keys = insert_ids(buf, 0, 4, cuda::stream_ref{s});
  buf.update_priorities(std::vector<gear::key>{keys[0], keys[1]}, std::vector<float>{1e30f, 1e-30f},
                        s);
  auto& st = buf.selection_state();
  const auto [smallest, largest] = st.priority_range(s);
  CHECK(smallest == 1e-30f);
  CHECK(largest == 1e30f);
  const auto nodes = st.nodes(s);
  for (const double alpha : {20.0, 12.0}) {  // 1e600 is infinite; 1e-360 underflows to 0
    CHECK(gear_test::code_of([&] { st.set_exponents(alpha, 0.5, s); }) ==
          gear::errc::invalid_argument);
    CHECK(st.alpha() == 1.0);
    CHECK(st.nodes(s) == nodes);
  }
  st.set_exponents(2.0, 0.5, s);
  CHECK(st.alpha() == 2.0);
  CHECK(st.nodes(s)[0] == doctest::Approx(1e60 + 1e-60 + 2.0));
}

TEST_CASE("prioritized (device): 10^6 random updates with duplicates keep the tree exact") {
  stream_holder s;
  const std::uint64_t seed = 8080;
  INFO("seed " << seed);
  const std::int64_t n = 100000;
  const double alpha = 0.6;
  per_buffer buf{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{alpha, 0.4}};
  std::vector<gear::key> keys;
  for (std::int64_t at = 0; at < n; at += 50000) {
    const auto k = insert_ids(buf, std::int32_t(at), 50000, cuda::stream_ref{s});
    keys.insert(keys.end(), k.begin(), k.end());
  }
  std::vector<float> raw(static_cast<std::size_t>(n), 1.0f);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> lg(std::log(1e-4), std::log(1e4));
  std::vector<gear::key> ks(4096);
  std::vector<float> ps(4096);
  for (int round = 0; round < 245; ++round) {  // 1,003,520 updates
    for (std::size_t i = 0; i < ks.size(); ++i) {
      const auto slot = gen() % (round % 2 ? 3000 : n);  // odd rounds: many duplicates
      ks[i] = keys[slot];
      ps[i] = static_cast<float>(std::exp(lg(gen)));
      raw[slot] = ps[i];
    }
    buf.update_priorities_async(ks, ps, s);
  }
  GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
  check_device_tree(buf.selection_state(), raw, alpha, s);
  long double fresh = 0;
  for (float p : raw)
    fresh += std::pow(static_cast<long double>(p), static_cast<long double>(alpha));
  const double root = buf.selection_state().total(s);
  const double rel = std::abs(static_cast<double>((root - fresh) / fresh));
  MESSAGE("device root " << root << " fresh " << static_cast<double>(fresh) << " relative " << rel);
  CHECK(rel < 1e-9);
  // A new alpha rebuilds the whole tree on the device.
  buf.selection_state().set_exponents(1.0, 0.4, s);
  check_device_tree(buf.selection_state(), raw, 1.0, s);
}

TEST_CASE("prioritized (device): updates from device memory equal host-span updates bit for bit") {
  stream_holder s;
  const std::uint64_t seed = 4711;
  INFO("seed " << seed);
  const std::int64_t n = 20000;
  const double alpha = 0.7;
  per_buffer a{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{alpha, 0.4}};
  per_buffer b{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{alpha, 0.4}};
  const auto keys = insert_ids(a, 0, n, cuda::stream_ref{s});
  const auto keys_b = insert_ids(b, 0, n, cuda::stream_ref{s});  // b's keys of the same tickets
  REQUIRE(gear_test::tickets_of(keys_b) == gear_test::tickets_of(keys));
  const std::uint32_t of_a = keys[0].incarnation, of_b = keys_b[0].incarnation;
  std::vector<float> raw(static_cast<std::size_t>(n), 1.0f);
  float largest = 1.0f;
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> lg(std::log(1e-3), std::log(1e3));
  for (int round = 0; round < 30; ++round) {
    const auto where = static_cast<gpu_memory>(round % 3);
    const std::size_t count = round == 0 ? 1 : 1 + gen() % 5000;
    std::vector<gear::key> ks(count);
    std::vector<float> ps(count);
    for (std::size_t i = 0; i < count; ++i) {
      const auto slot = gen() % std::uint64_t(round % 2 ? 300 : n);  // odd rounds: duplicates
      ks[i] = keys[slot];
      ps[i] = i % 13 == 5 ? (i % 2 ? 0.0f : -0.0f) : static_cast<float>(std::exp(lg(gen)));
      raw[slot] = ps[i];
      largest = std::max(largest, ps[i]);
    }
    a.update_priorities_async(ks, ps, s);
    const gpu_array<gear::key> dk(gear_test::with_incarnation(ks, of_b), where);
    const gpu_array<float> dp(ps, where);
    if (round % 2)
      b.update_priorities(dk.span(), dp.span(), gear::memory_kind::device, s);
    else
      b.update_priorities_async(dk.span(), dp.span(), gear::memory_kind::device, s);
    b.check_priority_updates(s);  // also keeps dk, dp alive until the update has run
  }
  CHECK(snapshot(b.selection_state(), s) == snapshot(a.selection_state(), s));
  check_device_tree(b.selection_state(), raw, alpha, s);
  CHECK(b.selection_state().max_priority(s) == largest);
  // The keys of a sampled batch and priorities a kernel wrote, straight from the batch.
  auto batch = b.make_batch(gear::batch_size{4096}, gear::window_length{1});
  gear::rng g{seed};
  b.sample(batch, gear::window{1}, g, s);
  const auto sampled = to_host(batch.keys().data(), 4096);
  const auto td = random_priorities(seed + 1, 4096, false);
  const gpu_array<float> dtd(td);
  b.update_priorities(std::span<const gear::key>(batch.keys().data(), 4096), dtd.span(),
                      gear::memory_kind::device, s);
  a.update_priorities(gear_test::with_incarnation(sampled, of_a), td, s);
  CHECK(snapshot(b.selection_state(), s) == snapshot(a.selection_state(), s));
  // New trajectories enter at the largest priority, read by the commit on the device.
  const auto fresh = insert_ids(b, 0, 100, cuda::stream_ref{s});
  insert_ids(a, 0, 100, cuda::stream_ref{s});
  largest = std::max(largest, *std::max_element(td.begin(), td.end()));
  const auto after = b.selection_state().priorities(s);
  for (const auto& k : fresh) REQUIRE(after[static_cast<std::size_t>(k.slot(n))] == largest);
  CHECK(snapshot(b.selection_state(), s) == snapshot(a.selection_state(), s));
}

TEST_CASE("prioritized (device): bad pairs from device memory fail the update; stale ones skip") {
  stream_holder s;
  per_buffer buf{gear::capacity{50}, gear::max_length{1}, gear::select::prioritized{0.8, 0.6}};
  const auto old_keys = insert_ids(buf, 0, 50, cuda::stream_ref{s});
  const auto keys = insert_ids(buf, 50, 20, cuda::stream_ref{s});  // evicts old_keys[0..20)
  buf.erase(std::vector<gear::key>{keys[5]}, s);
  {
    const gpu_array<gear::key> dk(std::vector<gear::key>{keys[0], old_keys[30]});
    const gpu_array<float> dp(std::vector<float>{2.0f, 3.0f});
    buf.update_priorities(dk.span(), dp.span(), gear::memory_kind::device, s);
  }
  auto writer = buf.make_writer(s);  // slot 20 pending (old_keys[20] evicted)
  const gear::key pending{buf.ticket(20), 0, keys[0].incarnation};
  REQUIRE(pending.ticket == 70);
  auto sample_once = [&] {
    gear::rng g{99};
    auto b = buf.make_batch(gear::batch_size{300}, gear::window_length{1});
    buf.sample(b, gear::window{1}, g, s);
    return std::make_pair(to_host(b.slots_data(), 300), to_host(b.weights_data(), 300));
  };
  const auto before = snapshot(buf.selection_state(), s);
  const auto drawn = sample_once();
  const auto size = buf.size();
  CHECK(before.max_priority == 3.0f);
  auto unchanged = [&] {
    CHECK(snapshot(buf.selection_state(), s) == before);
    CHECK(buf.size() == size);
    CHECK(sample_once() == drawn);
  };
  auto expect = [&](gear::errc code, std::vector<gear::key> ks, std::vector<float> ps,
                    const std::string& names) {
    INFO("expecting " << gear::to_string(code) << ", '" << names << "'");
    const gpu_array<gear::key> dk(ks);
    const gpu_array<float> dp(ps);
    const auto [got, what] = error_of(
        [&] { buf.update_priorities(dk.span(), dp.span(), gear::memory_kind::device, s); });
    INFO(what);
    CHECK(got == code);
    CHECK(what.find(names) != std::string::npos);
    unchanged();
    // The same pairs from host memory: the same error, at once.
    CHECK(gear_test::code_of([&] { buf.update_priorities(ks, ps, s); }) == code);
    unchanged();
  };
  gear::key other_shard = keys[1];
  other_shard.shard = 1;
  expect(gear::errc::key_out_of_range, {other_shard}, {5.0f}, "key 0 (shard 1,");
  // A key of another incarnation of this shard is not this shard's either.
  gear::key other_incarnation = keys[1];
  other_incarnation.incarnation = keys[1].incarnation + 1;
  expect(gear::errc::key_out_of_range, {keys[2], other_incarnation}, {5.0f, 5.0f}, "key 1 (");
  // A stale key before it does not hide a key of another shard.
  expect(gear::errc::key_out_of_range, {keys[1], old_keys[3], other_shard}, {1.0f, 1.0f, 1.0f},
         "key 2 (shard 1,");
  expect(gear::errc::invalid_priority, {keys[1], keys[2]}, {100.0f, std::nanf("")},
         "priority 1 is nan");
  expect(gear::errc::invalid_priority, {keys[1], keys[2]}, {100.0f, -1.0f}, "priority 1 is -1");
  expect(gear::errc::invalid_priority, {keys[1], keys[2]}, {100.0f, INFINITY}, "priority 1 is inf");
  expect(gear::errc::invalid_priority, {keys[1], keys[2], keys[3]}, {-INFINITY, 3.0f, NAN},
         "priority 0 ");
  // Every key is checked before any priority, as on the host: a later bad key is named first.
  expect(gear::errc::key_out_of_range, {keys[1], keys[2], keys[3], other_shard},
         {std::nanf(""), 3.0f, 3.0f, 3.0f}, "key 3 (shard 1,");
  // Checked at once on the host: sizes, pointers, memory.
  const gpu_array<gear::key> dk(std::vector<gear::key>{keys[1], keys[2]});
  const gpu_array<float> dp(std::vector<float>{1.0f, 2.0f, 3.0f});
  const std::vector<gear::key> host_keys{keys[1], keys[2]};
  const auto device = gear::memory_kind::device;
  auto code = [&](auto&& f) { return gear_test::code_of(f); };
  CHECK(code([&] { buf.update_priorities_async(dk.span(), dp.span(), device, s); }) ==
        gear::errc::invalid_argument);
  CHECK(code([&] { buf.update_priorities(host_keys, dp.span().first(2), device, s); }) ==
        gear::errc::wrong_memory);
  CHECK(code([&] {
          buf.update_priorities(dk.span(), dp.span().first(2), gear::memory_kind::pinned_host, s);
        }) == gear::errc::wrong_memory);
  CHECK(code([&] {
          const auto* odd =
              reinterpret_cast<const float*>(reinterpret_cast<const std::byte*>(dp.data()) + 1);
          buf.update_priorities(dk.span(), std::span<const float>(odd, 2), device, s);
        }) == gear::errc::misaligned_pointer);
  CHECK(code([&] {
          buf.update_priorities(
              std::span<const gear::key>(static_cast<const gear::key*>(nullptr), std::size_t{0}),
              std::span<const float>(), device, s);
        }) == gear::errc{});  // nothing to do
  unchanged();
  CHECK(code([&] { buf.check_priority_updates(s); }) == gear::errc{});  // nothing pending
  // A bad priority fails the update even where its key is stale, as on the host.
  expect(gear::errc::invalid_priority, {old_keys[3], keys[1]}, {std::nanf(""), 5.0f},
         "priority 0 is nan");

  // Stale keys are skipped on the GPU and counted (stale_pairs); the live pairs are applied, and
  // the skipped pairs' priorities do not raise the largest priority. Stale here: evicted, erased,
  // pending (its slot is being written), never issued, and the key of a row without a trajectory.
  gear::key future = keys[1], huge = keys[1];
  future.ticket = 1000;
  huge.ticket = (std::uint64_t{1} << 63) + 5;
  const gear::key none{gear::no_ticket, 0, keys[0].incarnation};
  const std::vector<gear::key> ks{keys[1], old_keys[3], keys[5], pending, future,
                                  huge,    none,        keys[2], keys[1]};
  const std::vector<float> ps{50.0f, 60.0f, 70.0f, 80.0f, 90.0f, 100.0f, 110.0f, 0.5f, 4.0f};
  constexpr std::int64_t stale_in_ks = 6;
  auto want = buf.selection_state().priorities(s);
  want[static_cast<std::size_t>(keys[1].slot(buf.capacity()))] = 4.0f;  // its last pair wins
  want[static_cast<std::size_t>(keys[2].slot(buf.capacity()))] = 0.5f;
  const float largest = std::max(buf.selection_state().max_priority(s), 50.0f);
  const std::uint64_t stale_before = buf.selection_state().stale_pairs(s);
  {
    const gpu_array<gear::key> dk(ks);
    const gpu_array<float> dp(ps);
    const auto [got, what] = error_of(
        [&] { buf.update_priorities(dk.span(), dp.span(), gear::memory_kind::device, s); });
    INFO(what);
    CHECK(got == gear::errc{});
  }
  CHECK(buf.selection_state().stale_pairs(s) ==
        stale_before + static_cast<std::uint64_t>(stale_in_ks));
  check_device_tree(buf.selection_state(), want, 0.8, s);
  CHECK(buf.selection_state().max_priority(s) == largest);
  CHECK(buf.size() == size);
  // The same pairs from host memory: skipped on the CPU, counted in the result.
  CHECK(buf.update_priorities(ks, ps, s) == gear::priority_update_result{3, stale_in_ks});
  check_device_tree(buf.selection_state(), want, 0.8, s);
  CHECK(buf.selection_state().max_priority(s) == largest);
}

TEST_CASE("prioritized (device): a failed asynchronous update is raised once, later") {
  stream_holder s;
  const std::int64_t n = 64;
  per_buffer buf{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
  per_buffer twin{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{0.6, 0.4}};
  const auto k = insert_ids(buf, 0, n, cuda::stream_ref{s});
  const std::uint32_t of_twin = insert_ids(twin, 0, n, cuda::stream_ref{s})[0].incarnation;
  gear::key foreign = k[9];
  foreign.shard = 1;
  // bad_key: key 2 is of another shard; with_nan: priority 7 is NaN. Both carry a priority (1000)
  // that would raise the largest priority if they were applied. (A stale key does not fail an
  // update: it is skipped.)
  std::vector<gear::key> ks(10), good_k(10);
  std::vector<float> ps(10), good_p(10), nan_p(10);
  for (std::size_t i = 0; i < 10; ++i) {
    ks[i] = k[i * 3];
    good_k[i] = k[i * 5 + 1];
    ps[i] = 1000.0f;
    good_p[i] = 0.5f + static_cast<float>(i);
    nan_p[i] = 1000.0f;
  }
  ks[2] = foreign;
  nan_p[7] = std::nanf("");
  const gpu_array<gear::key> bad_key(ks), good_keys(good_k),
      all_good(std::vector<gear::key>(k.begin(), k.begin() + 10));
  const gpu_array<float> thousand(ps), good(good_p), with_nan(nan_p);
  const auto device = gear::memory_kind::device;
  const auto untouched = snapshot(buf.selection_state(), s);
  // What the good update alone gives.
  twin.update_priorities(gear_test::with_incarnation(good_k, of_twin), good_p, s);

  SUBCASE("by check_priority_updates, counting later failures; later updates still apply") {
    gear_test::gate held;
    held.hold(s.s);  // nothing below runs before the host has enqueued all of it
    buf.update_priorities_async(bad_key.span(), thousand.span(), device, s);
    buf.update_priorities_async(good_keys.span(), good.span(), device, s);  // not arrived yet
    buf.update_priorities_async(all_good.span(), with_nan.span(), device, s);
    held.open();
    const auto [code, what] = error_of([&] { buf.check_priority_updates(s); });
    INFO(what);
    CHECK(code == gear::errc::key_out_of_range);
    CHECK(what.find("(call 1)") != std::string::npos);
    CHECK(what.find("key 2 (shard 1,") != std::string::npos);
    CHECK(what.find("ticket 9) is not in this shard") != std::string::npos);
    CHECK(what.find("and 1 later update from device memory failed") != std::string::npos);
    CHECK(gear_test::code_of([&] { buf.check_priority_updates(s); }) == gear::errc{});  // once
    CHECK(snapshot(buf.selection_state(), s) == snapshot(twin.selection_state(), s));
  }
  SUBCASE("at the start of the next asynchronous call, which then does nothing") {
    buf.update_priorities_async(all_good.span(), with_nan.span(), device, s);
    GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));  // the failure has arrived
    const auto [code, what] =
        error_of([&] { buf.update_priorities_async(good_keys.span(), good.span(), device, s); });
    INFO(what);
    CHECK(code == gear::errc::invalid_priority);
    CHECK(what.find("priority 7 is nan") != std::string::npos);
    CHECK(snapshot(buf.selection_state(), s) == untouched);
    buf.update_priorities_async(good_keys.span(), good.span(), device, s);
    buf.check_priority_updates(s);
    CHECK(snapshot(buf.selection_state(), s) == snapshot(twin.selection_state(), s));
  }
  SUBCASE("by an update from host memory, which then does nothing") {
    buf.update_priorities_async(bad_key.span(), thousand.span(), device, s);
    GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
    CHECK(gear_test::code_of([&] { buf.update_priorities_async(good_k, good_p, s); }) ==
          gear::errc::key_out_of_range);
    CHECK(snapshot(buf.selection_state(), s) == untouched);
    buf.update_priorities(good_k, good_p, s);
    CHECK(snapshot(buf.selection_state(), s) == snapshot(twin.selection_state(), s));
  }
  SUBCASE("by the synchronous form before it does anything, then by its own failure") {
    hold_gpu(s.s, 20);
    buf.update_priorities_async(bad_key.span(), thousand.span(), device, s);
    CHECK(gear_test::code_of([&] {
            buf.update_priorities(good_keys.span(), good.span(), device, s);
          }) == gear::errc::key_out_of_range);
    CHECK(snapshot(buf.selection_state(), s) == untouched);
    CHECK(gear_test::code_of([&] {
            buf.update_priorities(all_good.span(), with_nan.span(), device, s);
          }) == gear::errc::invalid_priority);
    CHECK(snapshot(buf.selection_state(), s) == untouched);
    buf.update_priorities(good_keys.span(), good.span(), device, s);
    CHECK(snapshot(buf.selection_state(), s) == snapshot(twin.selection_state(), s));
  }
  // Failed updates never raised the largest priority: new trajectories enter at the good one's.
  buf.check_priority_updates(s);
  insert_ids(buf, 100, 4, cuda::stream_ref{s});
  insert_ids(twin, 100, 4, cuda::stream_ref{s});
  CHECK(snapshot(buf.selection_state(), s) == snapshot(twin.selection_state(), s));
}

TEST_CASE("prioritized: host and device states track the largest priority alike") {
  stream_holder s;
  const std::int64_t n = 32;
  per_buffer dev{gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{0.5, 0.4}};
  gear::replay_buffer<spec, gear::storage::host, gear::select::prioritized> host{
      gear::capacity{n}, gear::max_length{1}, gear::select::prioritized{0.5, 0.4}};
  const auto kd = insert_ids(dev, 0, 20, cuda::stream_ref{s});
  const auto kh = insert_ids(host, 0, 20);
  REQUIRE(gear_test::tickets_of(kd) == gear_test::tickets_of(kh));
  const std::vector<std::vector<float>> batches{{0.5f, 0.25f},         {-0.0f, 0.0f},
                                                {3.0f, std::nanf("")}, {2.0f, 7.5f},
                                                {1.0f, INFINITY},      {0.1f, 0.2f}};
  for (const auto& p : batches) {
    const std::vector<gear::key> ks{kd[3], kd[3]};
    const gpu_array<gear::key> dk(ks);
    const gpu_array<float> dp(p);
    const auto dev_code = gear_test::code_of(
        [&] { dev.update_priorities(dk.span(), dp.span(), gear::memory_kind::device, s); });
    const std::vector<gear::key> kh3{kh[3], kh[3]};  // the same trajectory's key in `host`
    const auto host_code = gear_test::code_of([&] { host.update_priorities(kh3, p); });
    CHECK(dev_code == host_code);
    CHECK(dev.selection_state().max_priority(s) == host.selection_state().max_priority(s));
  }
  CHECK(host.selection_state().max_priority() == 7.5f);
  insert_ids(dev, 20, 20, cuda::stream_ref{s});  // wraps: evicts slots 0..7
  insert_ids(host, 20, 20);
  const auto raw = dev.selection_state().priorities(s);
  for (std::int64_t i = 0; i < n; ++i)
    CHECK(raw[std::size_t(i)] == host.selection_state().priority(i));
}

TEST_CASE("recency (device): uniform over the newest K committed (chi-square, 0.001)") {
  stream_holder s;
  const std::uint64_t seed = 555;
  MESSAGE("recency device chi-square seed " << seed);
  const std::int64_t cap = 100, K = 37;
  recent_buffer buf{gear::capacity{cap}, gear::max_length{1}, gear::select::recency{K}};
  for (std::int32_t first : {0, 100, 200})
    insert_ids(buf, first, first == 200 ? 50 : 100, cuda::stream_ref{s});
  std::vector<double> want(static_cast<std::size_t>(cap), 0.0), planted = want;
  for (std::uint64_t t = 250 - K; t < 250; ++t) want[t % cap] = 1.0 / K;
  for (std::uint64_t t = 250 - K - 1; t < 250; ++t) planted[t % cap] = 1.0 / (K + 1);
  gear::rng g{seed};
  double worst = 0;
  const auto counts = draw_counts(buf, g, 4096, 245, want, s, &worst);
  CHECK(worst < 1e-6);
  std::vector<double> c, w, pl;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (want[i] == 0) CHECK(counts[i] == 0);
    if (planted[i] > 0) c.push_back(counts[i]), w.push_back(want[i]), pl.push_back(planted[i]);
  }
  const auto fit = chi2_test(c, w, 4096.0 * 245);
  MESSAGE("chi2 " << fit.statistic << " df " << fit.df << " critical " << fit.critical);
  CHECK_FALSE(fit.rejects());
  CHECK(chi2_test(c, pl, 4096.0 * 245).rejects());
}

TEST_CASE(
    "sharded (device): two prioritized shards on one GPU sample the union's law into the "
    "caller's batch, after the caller's stream's earlier work") {
  const std::uint64_t seed = 4242;
  MESSAGE("sharded device chi-square seed " << seed);
  const double alpha = 0.7, beta = 0.5;
  stream_holder s;
  int here = 0;
  GEAR_CUDA_TRY(cudaGetDevice(&here));
  gear::sharded_buffer<spec, gear::storage::device, gear::select::prioritized> buf(
      {here, here}, gear::capacity{150}, gear::max_length{1},
      gear::select::prioritized{alpha, beta}, gear::insert_route::round_robin);
  std::map<std::pair<std::uint32_t, std::uint64_t>, int> ids;
  std::vector<gear::key> all;
  for (int call = 0; call < 2; ++call) {
    const auto k = insert_ids(buf, call * 100, 100, cuda::stream_ref{s});
    for (std::size_t i = 0; i < k.size(); ++i) {
      REQUIRE(k[i].shard == std::uint32_t(call));
      ids[{k[i].shard, k[i].ticket}] = call * 100 + int(i);
    }
    all.insert(all.end(), k.begin(), k.end());
  }
  std::mt19937_64 gen(seed);
  std::vector<float> p(all.size());
  for (auto& x : p) x = float(0.05 + double(gen() % 1000) / 50.0);
  const auto r = buf.update_priorities(all, p, s);
  CHECK(r.applied == 200);
  std::vector<double> want(200);
  double m = 0;
  for (std::size_t i = 0; i < all.size(); ++i) m += std::pow(double(p[i]), alpha);
  for (std::size_t i = 0; i < all.size(); ++i)
    want[std::size_t(ids.at({all[i].shard, all[i].ticket}))] = std::pow(double(p[i]), alpha) / m;

  const std::int64_t rows = 128;
  auto b = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
  gear::rng g{seed};
  std::vector<double> counts(200, 0);
  double worst_p = 0, worst_w = 0;
  const int calls = 1500;
  for (int c = 0; c < calls; ++c) {
    if (c % 100 == 0) {  // the caller's stream busy, then a write of the batch the shards follow
      gear_test::hold(s, 20);
      GEAR_CUDA_TRY(cudaMemsetAsync(b.column_data(0), 0xFF, rows * 4, s.s));
    }
    buf.sample_async(b, gear::window{1}, g, s);
    GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
    const auto id = to_host(reinterpret_cast<const std::int32_t*>(b.column_data(0)), rows);
    const auto keys = to_host(b.keys_data(), rows);
    const auto prob = to_host(b.probabilities_data(), rows);
    const auto wt = to_host(b.weights_data(), rows);
    double pmin = 1;
    for (std::int64_t i = 0; i < rows; ++i) pmin = std::min(pmin, want[std::size_t(id[i])]);
    for (std::int64_t i = 0; i < rows; ++i) {
      const auto it = ids.find({keys[i].shard, keys[i].ticket});
      REQUIRE(it != ids.end());
      REQUIRE(id[std::size_t(i)] == it->second);  // the row holds its key's trajectory
      counts[std::size_t(it->second)] += 1;
      const double w = want[std::size_t(it->second)];
      worst_p = std::max(worst_p, std::abs(prob[std::size_t(i)] - w) / w);
      worst_w = std::max(worst_w, std::abs(wt[std::size_t(i)] - std::pow(pmin / w, beta)));
    }
  }
  CHECK(worst_p < 1e-5);
  CHECK(worst_w < 1e-5);
  const double draws = double(rows) * calls;
  const auto fair = chi2_test(counts, want, draws);
  MESSAGE("sharded device: chi2 " << fair.statistic << " critical " << fair.critical);
  CHECK_FALSE(fair.rejects());
  std::vector<double> planted(200);  // power: alpha 0.6 instead of 0.7
  double m6 = 0;
  for (std::size_t i = 0; i < all.size(); ++i) m6 += std::pow(double(p[i]), 0.6);
  for (std::size_t i = 0; i < all.size(); ++i)
    planted[std::size_t(ids.at({all[i].shard, all[i].ticket}))] = std::pow(double(p[i]), 0.6) / m6;
  CHECK(chi2_test(counts, planted, draws).rejects());
}

TEST_CASE(
    "sharded (device): a shard whose priorities went to 0 and back is sampled again; a "
    "union of zero mass refuses, then recovers") {
  stream_holder s;
  int here = 0;
  GEAR_CUDA_TRY(cudaGetDevice(&here));
  gear::sharded_buffer<spec, gear::storage::device, gear::select::prioritized> buf(
      {here, here}, gear::capacity{32}, gear::max_length{1}, gear::select::prioritized{},
      gear::insert_route::round_robin);
  const auto k0 = insert_ids(buf, 0, 16, cuda::stream_ref{s});
  const auto k1 = insert_ids(buf, 16, 16, cuda::stream_ref{s});
  REQUIRE(k1[0].shard == 1);
  auto b = buf.make_batch(gear::batch_size{64}, gear::window_length{1});
  gear::rng g{9};
  const auto rows_of_shard_1 = [&] {
    buf.sample(b, gear::window{1}, g, s);
    const auto keys = to_host(b.keys_data(), 64);
    return std::count_if(keys.begin(), keys.end(), [](const gear::key& k) { return k.shard == 1; });
  };
  buf.update_priorities(k1, std::vector<float>(16, 0.0f), s);
  for (int i = 0; i < 3; ++i) CHECK(rows_of_shard_1() == 0);
  buf.update_priorities(k1, std::vector<float>(16, 1.0f), s);
  std::int64_t later = 0;
  for (int i = 0; i < 4; ++i) later += rows_of_shard_1();
  CHECK(later > 0);  // its mass is read back every sample, rows or not

  buf.update_priorities(k0, std::vector<float>(16, 0.0f), s);
  buf.update_priorities(k1, std::vector<float>(16, 0.0f), s);
  bool refused = false;  // once the read-backs have caught up with the zeros (a sample or two)
  for (int i = 0; i < 3 && !refused; ++i)
    refused = gear_test::code_of([&] { buf.sample(b, gear::window{1}, g, s); }) ==
              gear::errc::empty_buffer;
  CHECK(refused);
  buf.update_priorities(k0, std::vector<float>(16, 1.0f), s);
  buf.sample(b, gear::window{1}, g, s);  // the failed sample made the next one read every mass
  const auto keys = to_host(b.keys_data(), 64);
  CHECK(std::all_of(keys.begin(), keys.end(), [](const gear::key& k) { return k.shard == 0; }));
}

TEST_CASE("sharded (device): uniform shards, with and without replacement, one GPU") {
  stream_holder s;
  int here = 0;
  GEAR_CUDA_TRY(cudaGetDevice(&here));
  for (const bool replacement : {true, false}) {
    INFO("replacement " << replacement);
    gear::sharded_buffer<spec, gear::storage::device, gear::select::uniform> buf(
        {here, here, here}, gear::capacity{64}, gear::max_length{1},
        gear::select::uniform{.replacement = replacement});  // device_first: shards in turn here
    std::map<std::pair<std::uint32_t, std::uint64_t>, int> ids;
    const std::int64_t sizes[3] = {5, 20, 35};
    int next = 0;
    for (const std::int64_t n : sizes) {
      const auto k = insert_ids(buf, next, n, cuda::stream_ref{s});
      for (std::size_t i = 0; i < k.size(); ++i) ids[{k[i].shard, k[i].ticket}] = next + int(i);
      next += int(n);
    }
    for (std::size_t sh = 0; sh < 3; ++sh) CHECK(buf.shard(sh).size() == sizes[sh]);
    auto b = buf.make_batch(gear::batch_size{60}, gear::window_length{1});
    gear::rng g{11};
    for (int c = 0; c < 20; ++c) {
      buf.sample(b, gear::window{1}, g, s);
      const auto id = to_host(reinterpret_cast<const std::int32_t*>(b.column_data(0)), 60);
      const auto keys = to_host(b.keys_data(), 60);
      const auto prob = to_host(b.probabilities_data(), 60);
      std::set<int> seen;
      for (std::size_t i = 0; i < 60; ++i) {
        REQUIRE(id[i] == ids.at({keys[i].shard, keys[i].ticket}));
        REQUIRE(std::abs(prob[i] - 1.0f / 60) < 1e-6f);
        seen.insert(id[i]);
      }
      if (!replacement) REQUIRE(seen.size() == 60);  // the whole union, each once
    }
  }
}

TEST_CASE(
    "sharded (device): updates from device memory: each shard applies its keys and skips "
    "the others', equal to host-span updates bit for bit; stale keys counted; a bad pair "
    "changes no shard and is raised once") {
  stream_holder s;
  int here = 0;
  GEAR_CUDA_TRY(cudaGetDevice(&here));
  using per_shards = gear::sharded_buffer<spec, gear::storage::device, gear::select::prioritized>;
  auto make = [&] {
    return std::make_unique<per_shards>(std::vector<int>{here, here, here}, gear::capacity{64},
                                        gear::max_length{1}, gear::select::prioritized{0.7, 0.5},
                                        gear::insert_route::round_robin);
  };
  auto a = make(), b = make();  // a: host spans; b: device memory
  std::vector<gear::key> keys;  // a's; b's keys of the same trajectories: of b's incarnation
  std::uint32_t of_b = 0;
  for (int call = 0; call < 3; ++call) {
    const auto k = insert_ids(*a, call * 40, 40, cuda::stream_ref{s});
    const auto kb = insert_ids(*b, call * 40, 40, cuda::stream_ref{s});
    REQUIRE(gear_test::tickets_of(kb) == gear_test::tickets_of(k));
    of_b = kb[0].incarnation;
    keys.insert(keys.end(), k.begin(), k.end());
  }
  const auto as_b = [&](const std::vector<gear::key>& ks) {
    return gear_test::with_incarnation(ks, of_b);
  };
  auto snapshots = [&](per_shards& buf) {
    std::vector<per_snapshot> out;
    for (std::size_t sh = 0; sh < 3; ++sh)
      out.push_back(snapshot(buf.shard(sh).selection_state(), s));
    return out;
  };
  std::mt19937_64 gen(99);
  for (int round = 0; round < 6; ++round) {
    INFO("round " << round);
    std::vector<gear::key> ks;  // every shard's keys, mixed, some twice
    std::vector<float> ps;
    for (int i = 0; i < 150; ++i) {
      ks.push_back(keys[gen() % keys.size()]);
      ps.push_back(float(0.01 + double(gen() % 10000) / 100.0));
    }
    a->update_priorities(ks, ps, s);
    const gpu_array<gear::key> dk(as_b(ks), round % 2 ? gpu_memory::pinned : gpu_memory::device);
    const gpu_array<float> dp(ps);
    b->update_priorities(dk.span(), dp.span(), gear::memory_kind::device, s);
    REQUIRE(snapshots(*b) == snapshots(*a));
  }
  CHECK(b->stale_pairs(s) == 0);

  // Two keys of shard 1 erased: skipped and counted once (by their shard), the rest applied.
  b->erase(as_b({keys[40], keys[41]}), s);
  a->erase(std::vector<gear::key>{keys[40], keys[41]}, s);
  std::vector<float> all(keys.size(), 2.5f);
  const gpu_array<gear::key> dall(as_b(keys));
  const gpu_array<float> dps(all);
  b->update_priorities(dall.span(), dps.span(), gear::memory_kind::device, s);
  std::vector<gear::key> live;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (i != 40 && i != 41) live.push_back(keys[i]);
  a->update_priorities(live, std::vector<float>(live.size(), 2.5f), s);
  CHECK(snapshots(*b) == snapshots(*a));
  CHECK(b->stale_pairs(s) == 2);

  // A NaN priority of shard 2's key, or a key of a shard the buffer lacks: no shard changes, and
  // the failure is raised once.
  const auto before = snapshots(*b);
  std::vector<float> bad(all);
  bad[100] = std::numeric_limits<float>::quiet_NaN();
  const gpu_array<float> dbad(bad);
  CHECK(error_of([&] {
          b->update_priorities(dall.span(), dbad.span(), gear::memory_kind::device, s);
        }).first == gear::errc::invalid_priority);
  CHECK(snapshots(*b) == before);
  CHECK(error_of([&] { b->check_priority_updates(s); }).first == gear::errc{});
  std::vector<gear::key> foreign = as_b(keys);
  foreign[5].shard = 7;
  const gpu_array<gear::key> dforeign(foreign);
  b->update_priorities_async(dforeign.span(), dps.span(), gear::memory_kind::device, s);
  GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
  // The failure has arrived: the next update raises it at its start and does nothing.
  std::vector<float> other(all.size(), 7.0f);
  const gpu_array<float> dother(other);
  const auto [code, message] = error_of([&] {
    b->update_priorities_async(dall.span(), dother.span(), gear::memory_kind::device, s);
  });
  CHECK(code == gear::errc::key_out_of_range);
  MESSAGE(message);
  GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
  CHECK(snapshots(*b) == before);
  CHECK(error_of([&] { b->check_priority_updates(s); }).first == gear::errc{});
  b->update_priorities(dall.span(), dother.span(), gear::memory_kind::device, s);
  a->update_priorities(live, std::vector<float>(live.size(), 7.0f), s);
  CHECK(snapshots(*b) == snapshots(*a));

  // A failed update still running (behind a busy stream) is not raised by the next update, which
  // is applied; check_priority_updates waits for it and raises it once.
  gear_test::gate held;
  held.hold(s.s);
  b->update_priorities_async(dall.span(), dbad.span(), gear::memory_kind::device, s);
  CHECK(error_of([&] {
          b->update_priorities_async(dall.span(), dps.span(), gear::memory_kind::device, s);
        }).first == gear::errc{});
  held.open();
  CHECK(error_of([&] { b->check_priority_updates(s); }).first == gear::errc::invalid_priority);
  CHECK(error_of([&] { b->check_priority_updates(s); }).first == gear::errc{});
  a->update_priorities(live, std::vector<float>(live.size(), 2.5f), s);
  CHECK(snapshots(*b) == snapshots(*a));
}

TEST_CASE(
    "sharded (device): prioritized, a shard empty at one sample and filled before the next "
    "takes its share of the next (its mass read again, not the read-back from when it was "
    "empty)") {
  stream_holder s;
  const int here = gear::detail::current_device_ordinal();
  using per_shards = gear::sharded_buffer<spec, gear::storage::device, gear::select::prioritized>;
  per_shards buf({here, here}, gear::capacity{64}, gear::max_length{1},
                 gear::select::prioritized{0.6, 0.4}, gear::insert_route::round_robin);
  (void)insert_ids(buf, 0, 20, cuda::stream_ref{s});  // shard 0; shard 1 empty
  auto out = buf.make_batch(gear::batch_size{4096}, gear::window_length{1});
  gear::rng g{2026120601};
  buf.sample(out, gear::window{1}, g, s);  // reads both masses; shard 1's read-back says 0
  (void)insert_ids(buf, 20, 20, cuda::stream_ref{s});  // shard 1, priority 1 like shard 0's
  GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
  buf.sample(out, gear::window{1}, g, s);
  const auto keys = to_host(out.keys_data(), 4096);
  const auto from_1 = std::count_if(keys.begin(), keys.end(), [](auto& k) { return k.shard == 1; });
  MESSAGE("rows from the shard filled after the first sample: " << from_1 << " of 4096");
  // Equal masses: Binomial(4096, 1/2), sd 32; 0 rows before the fix.
  CHECK(from_1 > 2048 - 6 * 32);
  CHECK(from_1 < 2048 + 6 * 32);
}

TEST_CASE(
    "rank_sampler (device): two ranks on their own streams, one held busy, take disjoint "
    "rows of each step; a staging is drawn again only after the last rank's copy from it") {
  stream_holder s0, s1;
  int here = 0;
  GEAR_CUDA_TRY(cudaGetDevice(&here));
  using uniform_shards = gear::sharded_buffer<spec, gear::storage::device, gear::select::uniform>;
  uniform_shards buf({here, here}, gear::capacity{64}, gear::max_length{1},
                     gear::select::uniform{.replacement = false});
  std::map<std::pair<std::uint32_t, std::uint64_t>, int> ids;
  for (const int first : {0, 20}) {
    const auto k = insert_ids(buf, first, first == 0 ? 20 : 30, cuda::stream_ref{s0});
    for (std::size_t i = 0; i < k.size(); ++i) ids[{k[i].shard, k[i].ticket}] = first + int(i);
  }
  constexpr std::int64_t rows = 16;
  gear::rank_sampler<uniform_shards> sampler(buf, gear::rank_count{2}, gear::batch_size{rows},
                                             gear::window{1}, gear::rng{21},
                                             gear::rank_sampler_options{.rounds_ahead = 1});
  auto b0 = sampler.make_batch(), b1 = sampler.make_batch();
  auto ids_of = [&](const uniform_shards::batch_type& b) {
    const auto id = to_host(reinterpret_cast<const std::int32_t*>(b.column_data(0)), rows);
    const auto keys = to_host(b.keys_data(), rows);
    std::set<int> out;
    for (std::size_t i = 0; i < std::size_t(rows); ++i) {
      REQUIRE(id[i] == ids.at({keys[i].shard, keys[i].ticket}));  // bytes of the key's trajectory
      out.insert(id[i]);
    }
    REQUIRE(out.size() == std::size_t(rows));
    return out;
  };
  auto disjoint = [](const std::set<int>& a, const std::set<int>& b) {
    return std::none_of(a.begin(), a.end(), [&](int x) { return b.count(x) > 0; });
  };
  std::set<int> rank0 = [&] {
    sampler.sample(0, b0, s0);
    return ids_of(b0);
  }();
  for (int t = 0; t < 20; ++t) {
    INFO("step " << t);
    // Rank 1's stream is busy (a training step): its copy of step t waits behind it, and rank
    // 0's draw of step t + 1 into the one staging must wait for that copy.
    hold(s1, 30);
    sampler.sample_async(1, b1, s1);
    sampler.sample_async(0, b0, s0);
    GEAR_CUDA_TRY(cudaStreamSynchronize(s1.s));
    GEAR_CUDA_TRY(cudaStreamSynchronize(s0.s));
    const std::set<int> rank1 = ids_of(b1), next0 = ids_of(b0);
    REQUIRE(disjoint(rank0, rank1));  // rank 1's step t is not step t + 1's draw
    rank0 = next0;
  }
  sampler.sample(1, b1, s1);  // step 20
  CHECK(disjoint(rank0, ids_of(b1)));
  // The busy rank draws step 21: the draw follows its stream, held while it is enqueued.
  hold(s1, 30);
  sampler.sample_async(1, b1, s1);
  sampler.sample(0, b0, s0);
  GEAR_CUDA_TRY(cudaStreamSynchronize(s1.s));
  CHECK(disjoint(ids_of(b0), ids_of(b1)));
  CHECK(sampler.next_step(0) == 22);
  CHECK(sampler.next_step(1) == 22);
}

int main(int argc, char** argv) {
  if (!gear::detail::gpu_available()) {
    try {
      per_buffer b{gear::capacity{1}, gear::max_length{1}};
      std::fprintf(stderr, "select_gpu_tests: device storage was created without a GPU\n");
      return 1;
    } catch (const gear::error& e) {
      if (e.code() != gear::errc::no_device) {
        std::fprintf(stderr, "select_gpu_tests: expected no_device, got %s\n", e.what());
        return 1;
      }
    }
    std::printf(
        "select_gpu_tests: no GPU; device storage correctly refused (no_device); skipping\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
