// gear_cub_variants: each hand-written step of prioritized selection and priority updates against
// a version of the same step built from CUB, on the same tree, draws and pairs, in one run:
//
//   descent    a group of 16 lanes per row folds a node's 16 children in index order |
//              cub::WarpScan<double, 16>::InclusiveSum, then ballots (gear's sum_tree_find_group)
//   rebuild    one launch per level, each node the sum of its 16 children in index order (gear's
//              sum_tree_level_kernel) | cub::DeviceSegmentedReduce::Sum per level
//   duplicates the last pair of each slot wins by atomicMax bids, read back by the pairs (what the
//              update's mark and apply kernels do) | cub::DeviceRadixSort::SortPairs on the slot,
//              then each run's last pair
//
// N = 2^24 leaves, B = 4096 rows or pairs (10% naming a slot named before), medians of 200
// launches of each variant taken alternately (CUDA events). Besides the time, each line says
// whether the two variants give the same result: the descent's rows, the rebuilt nodes bit for
// bit, the winning pairs. Usage: gear_cub_variants [log2 N]. Exits 77 without a GPU.

#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_reduce.cuh>
#include <cub/warp/warp_scan.cuh>
#include <gear/gear.cuh>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace gd = gear::detail;
constexpr int threads = 256;
constexpr int group = gd::sum_tree_group;

// ---- descent -----------------------------------------------------------------------------------

/// The descent gear used before cub::WarpScan: the 16 children reach every lane of the group by
/// shuffles and are folded in index order.
__global__ void descend_hand(const double* tree, gd::sum_tree_shape s, const double* u,
                             std::int64_t rows, std::int64_t* out) {
  const std::int64_t row = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / group;
  const int lane = static_cast<int>(threadIdx.x % group);
  double target = u[row < rows ? row : 0];
  std::int64_t j = 0;
  for (int d = 0; d + 1 < s.levels; ++d) {
    const double mine = tree[s.offset[d + 1] + j * gd::sum_tree_fanout + lane];
    int pick = -1, last = 0;
    for (int c = 0; c < gd::sum_tree_fanout; ++c) {
      const double v = __shfl_sync(0xFFFFFFFFu, mine, c, group);
      const bool positive = v > 0;
      const bool open = positive && pick < 0;
      const bool here = open && target < v;
      last = positive ? c : last;
      pick = here ? c : pick;
      target = open && !here ? target - v : target;
    }
    j = j * gd::sum_tree_fanout + (pick >= 0 ? pick : last);
  }
  if (row < rows && lane == 0) out[row] = j;
}

/// gear's descent (sum_tree_find_group: cub::WarpScan, then ballots).
__global__ void descend_cub(const double* tree, gd::sum_tree_shape s, const double* u,
                            std::int64_t rows, std::int64_t* out) {
  __shared__ gd::sum_tree_scan::TempStorage storage[threads / group];
  const std::int64_t row = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / group;
  const int lane = static_cast<int>(threadIdx.x % group);
  double leaf = 0;
  const std::int64_t slot = gd::sum_tree_find_group(storage[threadIdx.x / group], tree, nullptr, 0,
                                                    s, u[row < rows ? row : 0], lane, leaf);
  if (row < rows && lane == 0) out[row] = slot;
}

// ---- duplicates
// ----------------------------------------------------------------------------------

__global__ void bid(const std::uint32_t* slots, std::int64_t n, unsigned long long* winner) {
  const std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (i < n) atomicMax(winner + slots[i], static_cast<unsigned long long>(i) + 1);
}

/// Each pair learns whether it won; the winner clears its word for the next update once it has
/// read it (a loser reads the winner's bid or 0, never its own).
__global__ void resolve(const std::uint32_t* slots, std::int64_t n, unsigned long long* winner,
                        std::uint8_t* keep) {
  const std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const bool wins = winner[slots[i]] == static_cast<unsigned long long>(i) + 1;
  keep[i] = wins;
  if (wins) winner[slots[i]] = 0;
}

/// After a stable sort of (slot, index) by slot: each run's last pair is its slot's last write.
__global__ void last_of_runs(const std::uint32_t* sorted_slots, const std::uint32_t* sorted_index,
                             std::int64_t n, std::uint8_t* keep) {
  const std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (k < n) keep[sorted_index[k]] = k + 1 == n || sorted_slots[k] != sorted_slots[k + 1];
}

// ---- harness -----------------------------------------------------------------------------------

struct times16 {
  __host__ __device__ long long operator()(long long k) const { return k * gd::sum_tree_fanout; }
};

template <class T>
T* device_copy(const std::vector<T>& v) {
  T* p = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&p, v.size() * sizeof(T)));
  GEAR_CUDA_TRY(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}
template <class T>
std::vector<T> host_copy(const T* p, std::size_t n) {
  std::vector<T> v(n);
  GEAR_CUDA_TRY(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

/// Medians (us, CUDA events around each call) of `a` and `b`, 200 calls each, taken alternately
/// in rounds of 20.
template <class A, class B>
std::pair<double, double> medians(cudaStream_t s, A a, B b) {
  cudaEvent_t start{}, stop{};
  GEAR_CUDA_TRY(cudaEventCreate(&start));
  GEAR_CUDA_TRY(cudaEventCreate(&stop));
  auto time = [&](auto& f) {
    GEAR_CUDA_TRY(cudaEventRecord(start, s));
    f();
    GEAR_CUDA_TRY(cudaEventRecord(stop, s));
    GEAR_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    GEAR_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    return 1e3 * static_cast<double>(ms);
  };
  for (int warm = 0; warm < 5; ++warm) time(a), time(b);
  std::vector<double> ta, tb;
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < 20; ++i) ta.push_back(time(a));
    for (int i = 0; i < 20; ++i) tb.push_back(time(b));
  }
  GEAR_CUDA_TRY(cudaEventDestroy(start));
  GEAR_CUDA_TRY(cudaEventDestroy(stop));
  std::nth_element(ta.begin(), ta.begin() + ta.size() / 2, ta.end());
  std::nth_element(tb.begin(), tb.begin() + tb.size() / 2, tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

void line(const char* step, std::pair<double, double> t, const std::string& same) {
  std::printf("| %-10s | %8.1f | %8.1f | %5.2f | %-12s | %s |\n", step, t.first, t.second,
              t.second / t.first, t.first <= t.second ? "hand-written" : "CUB", same.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (!gd::gpu_available()) {
    std::puts("gear_cub_variants: no GPU, skipped");
    return 77;
  }
  const int log_n = argc > 1 ? std::atoi(argv[1]) : 24;
  if (log_n < 8 || log_n > 30) {
    std::fprintf(stderr, "gear_cub_variants: log2 N must be in [8, 30], got %d\n", log_n);
    return 2;
  }
  const std::int64_t n = std::int64_t{1} << log_n, batch = 4096;
  const double alpha = 0.6;
  cudaStream_t s{};
  GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // The tree: leaves p^alpha of log-normal priorities, internal nodes by the host rebuild.
  const gd::sum_tree_shape shape = gd::make_sum_tree_shape(n);
  std::vector<double> tree(static_cast<std::size_t>(shape.total), 0.0);
  std::mt19937_64 gen(20261205);
  std::normal_distribution<double> log_p(0.0, 1.5);
  for (std::int64_t i = 0; i < n; ++i)
    tree[static_cast<std::size_t>(shape.leaf(i))] = std::pow(std::exp(log_p(gen)), alpha);
  gd::sum_tree_rebuild(tree.data(), shape);
  double* nodes = device_copy(tree);
  std::vector<double> u(static_cast<std::size_t>(batch));
  for (auto& x : u) x = gd::unit_interval(gen()) * tree[0];
  double* du = device_copy(u);
  std::int64_t *rows_hand = nullptr, *rows_cub = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&rows_hand, batch * sizeof(std::int64_t)));
  GEAR_CUDA_TRY(cudaMalloc(&rows_cub, batch * sizeof(std::int64_t)));

  std::printf(
      "gear_cub_variants: N = 2^%d leaves, B = %lld (median us of 200 launches, CUDA "
      "events)\n",
      log_n, static_cast<long long>(batch));
  std::puts("| step       |     hand |      CUB | CUB / hand | faster       | same result |");
  std::puts("|---|---|---|---|---|---|");

  // Descent.
  const auto descent_blocks = static_cast<unsigned>((batch * group + threads - 1) / threads);
  auto hand_descent = [&] {
    descend_hand<<<descent_blocks, threads, 0, s>>>(nodes, shape, du, batch, rows_hand);
    GEAR_CHECK_LAUNCH("descend_hand");
  };
  auto cub_descent = [&] {
    descend_cub<<<descent_blocks, threads, 0, s>>>(nodes, shape, du, batch, rows_cub);
    GEAR_CHECK_LAUNCH("descend_cub");
  };
  const auto descent = medians(s, hand_descent, cub_descent);
  GEAR_CUDA_TRY(cudaStreamSynchronize(s));
  const auto rh = host_copy(rows_hand, static_cast<std::size_t>(batch));
  const auto rc = host_copy(rows_cub, static_cast<std::size_t>(batch));
  std::int64_t same_rows = 0, host_rows = 0;
  for (std::size_t r = 0; r < rh.size(); ++r) {
    same_rows += rh[r] == rc[r];
    host_rows += rc[r] == gd::sum_tree_find(tree.data(), shape, u[r]);
  }
  line("descent", descent,
       std::to_string(same_rows) + " of " + std::to_string(batch) +
           " rows (CUB = host tree: " + std::to_string(host_rows) + ")");

  // Rebuild of the internal levels from the leaves.
  gd::priority_tree t{};
  t.nodes = nodes;
  t.shape = shape;
  auto hand_rebuild = [&] {
    for (int d = shape.levels - 2; d >= 0; --d) {
      gd::sum_tree_level_kernel<<<gd::blocks_for(shape.count[d], threads), threads, 0, s>>>(t, d);
      GEAR_CHECK_LAUNCH("sum_tree_level_kernel");
    }
  };
  double* cub_nodes = device_copy(tree);
  const auto begins =
      thrust::make_transform_iterator(thrust::make_counting_iterator(0LL), times16{});
  std::size_t temp_bytes = 0;
  GEAR_CUDA_TRY(cub::DeviceSegmentedReduce::Sum(nullptr, temp_bytes, cub_nodes, cub_nodes,
                                                shape.count[shape.levels - 2], begins, begins + 1,
                                                s));
  void* temp = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&temp, temp_bytes));
  auto cub_rebuild = [&] {
    for (int d = shape.levels - 2; d >= 0; --d) {
      std::size_t bytes = temp_bytes;
      GEAR_CUDA_TRY(cub::DeviceSegmentedReduce::Sum(temp, bytes, cub_nodes + shape.offset[d + 1],
                                                    cub_nodes + shape.offset[d], shape.count[d],
                                                    begins, begins + 1, s));
    }
  };
  const auto rebuild = medians(s, hand_rebuild, cub_rebuild);
  GEAR_CUDA_TRY(cudaStreamSynchronize(s));
  const auto nh = host_copy(nodes, static_cast<std::size_t>(shape.internal()));
  const auto nc = host_copy(cub_nodes, static_cast<std::size_t>(shape.internal()));
  std::int64_t same_nodes = 0, host_nodes = 0;
  for (std::size_t k = 0; k < nh.size(); ++k) {
    same_nodes += std::memcmp(&nh[k], &nc[k], sizeof(double)) == 0;
    host_nodes += std::memcmp(&nh[k], &tree[k], sizeof(double)) == 0;
  }
  line("rebuild", rebuild,
       std::to_string(same_nodes) + " of " + std::to_string(nh.size()) +
           " nodes bit for bit (hand = host tree: " + std::to_string(host_nodes) + ")");

  // Duplicates: B pairs, every tenth naming the slot of the pair before.
  std::vector<std::uint32_t> slots(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < slots.size(); ++i)
    slots[i] = i % 10 == 9 ? slots[i - 1] : static_cast<std::uint32_t>(gen() % n);
  std::uint32_t* dslots = device_copy(slots);
  std::vector<std::uint32_t> index(slots.size());
  for (std::size_t i = 0; i < index.size(); ++i) index[i] = static_cast<std::uint32_t>(i);
  std::uint32_t* dindex = device_copy(index);
  unsigned long long* winner = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&winner, static_cast<std::size_t>(n) * sizeof(unsigned long long)));
  GEAR_CUDA_TRY(cudaMemset(winner, 0, static_cast<std::size_t>(n) * sizeof(unsigned long long)));
  std::uint8_t *keep_hand = nullptr, *keep_cub = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&keep_hand, batch));
  GEAR_CUDA_TRY(cudaMalloc(&keep_cub, batch));
  std::uint32_t *sorted_slots = nullptr, *sorted_index = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&sorted_slots, batch * sizeof(std::uint32_t)));
  GEAR_CUDA_TRY(cudaMalloc(&sorted_index, batch * sizeof(std::uint32_t)));
  std::size_t sort_bytes = 0;
  GEAR_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, dslots, sorted_slots, dindex,
                                                sorted_index, batch, 0, log_n, s));
  void* sort_temp = nullptr;
  GEAR_CUDA_TRY(cudaMalloc(&sort_temp, sort_bytes));
  const auto pair_blocks = gd::blocks_for(batch, threads);
  auto hand_duplicates = [&] {
    bid<<<pair_blocks, threads, 0, s>>>(dslots, batch, winner);
    GEAR_CHECK_LAUNCH("bid");
    resolve<<<pair_blocks, threads, 0, s>>>(dslots, batch, winner, keep_hand);
    GEAR_CHECK_LAUNCH("resolve");
  };
  auto cub_duplicates = [&] {
    std::size_t bytes = sort_bytes;
    GEAR_CUDA_TRY(cub::DeviceRadixSort::SortPairs(sort_temp, bytes, dslots, sorted_slots, dindex,
                                                  sorted_index, batch, 0, log_n, s));
    last_of_runs<<<pair_blocks, threads, 0, s>>>(sorted_slots, sorted_index, batch, keep_cub);
    GEAR_CHECK_LAUNCH("last_of_runs");
  };
  const auto duplicates = medians(s, hand_duplicates, cub_duplicates);
  GEAR_CUDA_TRY(cudaStreamSynchronize(s));
  const auto kh = host_copy(keep_hand, static_cast<std::size_t>(batch));
  const auto kc = host_copy(keep_cub, static_cast<std::size_t>(batch));
  std::int64_t same_keep = 0, winners = 0;
  for (std::size_t i = 0; i < kh.size(); ++i) {
    same_keep += kh[i] == kc[i];
    winners += kh[i];
  }
  line("duplicates", duplicates,
       std::to_string(same_keep) + " of " + std::to_string(batch) + " pairs (" +
           std::to_string(winners) + " win)");

  for (void* p :
       {static_cast<void*>(nodes), static_cast<void*>(du), static_cast<void*>(rows_hand),
        static_cast<void*>(rows_cub), static_cast<void*>(cub_nodes), temp,
        static_cast<void*>(dslots), static_cast<void*>(dindex), static_cast<void*>(winner),
        static_cast<void*>(keep_hand), static_cast<void*>(keep_cub),
        static_cast<void*>(sorted_slots), static_cast<void*>(sorted_index), sort_temp})
    GEAR_CUDA_TRY(cudaFree(p));
  GEAR_CUDA_TRY(cudaStreamDestroy(s));
  return 0;
}
