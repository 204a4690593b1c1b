// Stress, GPU storage: 8 threads, each on its own stream, insert, write, sample, update priorities
// and erase on one buffer with no lock or event of their own (tests/stress.hpp), for pinned_host,
// device and mixed storage; with the consuming fifo and lifo, and with max_times_sampled (uniform
// with and without replacement, recency), at a tenth of the count. GEAR_STRESS_OPS sets the
// operations per thread (default 125000: 10^6 in all per storage). Exits 77 (skipped) where no
// GPU is usable.

#include <gear/gear.cuh>

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "gpu_common.cuh"
#include "stress.hpp"

namespace {

struct thread_streams {
  std::vector<cudaStream_t> s;
  explicit thread_streams(int n) : s(static_cast<std::size_t>(n)) {
    for (auto& x : s) GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  }
  ~thread_streams() {
    for (auto x : s) (void)cudaStreamDestroy(x);
  }
  cuda::stream_ref get(int i) const { return cuda::stream_ref{s[static_cast<std::size_t>(i)]}; }
  void sync(int i) const { GEAR_CUDA_TRY(cudaStreamSynchronize(s[static_cast<std::size_t>(i)])); }
};

struct host_view {
  std::vector<gear::key> keys;
  std::vector<std::uint8_t> mask;
  std::vector<std::int64_t> v;
};

template <class Batch>
host_view fetch(const Batch& b, cuda::stream_ref s) {
  const auto rows = static_cast<std::size_t>(b.batch_size()), n = rows * b.window_length();
  host_view h{std::vector<gear::key>(rows), std::vector<std::uint8_t>(n),
              std::vector<std::int64_t>(n * 3)};
  GEAR_CUDA_TRY(cudaMemcpyAsync(h.keys.data(), b.keys_data(), rows * sizeof(gear::key),
                                cudaMemcpyDefault, s.get()));
  GEAR_CUDA_TRY(cudaMemcpyAsync(h.mask.data(), b.mask_data(), n, cudaMemcpyDefault, s.get()));
  GEAR_CUDA_TRY(
      cudaMemcpyAsync(h.v.data(), b.column_data(0), n * 3 * 8, cudaMemcpyDefault, s.get()));
  GEAR_CUDA_TRY(cudaStreamSynchronize(s.get()));
  return h;
}

std::int64_t ops_per_thread() {
  const char* env = std::getenv("GEAR_STRESS_OPS");
  return env != nullptr ? std::atoll(env) : 125000;
}

/// 8 threads of `ops` operations each (tests/stress.hpp) on buf, each on its own stream, checked.
template <class Buffer>
void stress(Buffer& buf, std::int64_t ops, std::uint64_t seed, std::int64_t max_returns = 0) {
  thread_streams streams(8);
  const auto r = gear_stress::run(
      buf, 8, ops, seed, streams, [](auto& batch, cuda::stream_ref s) { return fetch(batch, s); },
      max_returns);
  gear_stress::check(r, 8, ops);
}

}  // namespace

TEST_CASE_TEMPLATE(
    "stress: 8 threads on their own streams, one GPU buffer: no torn or mislabeled row", Storage,
    gear::storage::pinned_host, gear::storage::device,
    gear::storage::mixed<gear::storage::pinned_host, gear::storage::device>) {
  gear::replay_buffer<gear_stress::spec, Storage, gear::select::prioritized> buf{
      gear::capacity{256}, gear::max_length{gear_stress::max_len}};
  stress(buf, ops_per_thread(), 7);
}

template <class Storage, class Policy>
struct storage_and_policy {
  using storage = Storage;
  using policy = Policy;
};

TEST_CASE_TEMPLATE(
    "stress: 8 threads on their own streams, one GPU queue or stack: each trajectory returned "
    "once, each sample in order",
    Case, storage_and_policy<gear::storage::device, gear::select::fifo>,
    storage_and_policy<gear::storage::pinned_host, gear::select::lifo>,
    storage_and_policy<gear::storage::mixed<gear::storage::pinned_host, gear::storage::device>,
                       gear::select::fifo>) {
  gear::replay_buffer<gear_stress::spec, typename Case::storage, typename Case::policy> buf{
      gear::capacity{256}, gear::max_length{gear_stress::max_len}};
  stress(buf, ops_per_thread() / 10, 9);  // a tenth of the count: 10^5 per case
}

TEST_CASE(
    "stress: 8 threads on their own streams, one device buffer with max_times_sampled 3 (uniform "
    "without replacement): no trajectory returned more than 3 times") {
  gear::replay_buffer<gear_stress::spec, gear::storage::device, gear::select::uniform> buf{
      gear::capacity{256}, gear::max_length{gear_stress::max_len},
      gear::select::uniform{.replacement = false}};
  stress(buf, ops_per_thread() / 10, 11, 3);
}

TEST_CASE(
    "stress: 8 threads on their own streams, one mixed buffer with max_times_sampled 2 (uniform "
    "with replacement, rows counted from the host's own draw): no trajectory in more than two "
    "samples") {
  gear::replay_buffer<gear_stress::spec,
                      gear::storage::mixed<gear::storage::pinned_host, gear::storage::device>,
                      gear::select::uniform>
      buf{gear::capacity{256}, gear::max_length{gear_stress::max_len}};
  stress(buf, ops_per_thread() / 10, 12, 2);
}

TEST_CASE(
    "stress: 8 threads on their own streams, one device buffer with max_times_sampled 2 (recency, "
    "rows drawn on the host and staged for the gather): no trajectory in more than two samples") {
  gear::replay_buffer<gear_stress::spec, gear::storage::device, gear::select::recency> buf{
      gear::capacity{256}, gear::max_length{gear_stress::max_len},
      gear::select::recency{.newest = 128, .half_life = 32}};
  stress(buf, ops_per_thread() / 10, 13, 2);
}

int main(int argc, char** argv) {
  if (!gear::detail::gpu_available()) {
    std::printf("stress_gpu_tests: no GPU; skipping\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
