// gear example: data-parallel learner ranks, a thread per GPU, each drawing its own batch of one
// buffer (a shard per GPU) every step, with no coordinator and no row in two ranks' batches of a
// step (two ranks on one GPU where there is only one; CPU shards and ranks without a GPU).
//
//   actors fill the shards -> every rank thread, each on its own stream, calls
//   sampler.sample(rank, batch, stream) per step -> step t is one joint draw of R x B distinct
//   trajectories, shuffled; rank r takes its B of them (whichever rank calls first draws)

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <gear/gear.cuh>
#include <gear/rank_sampler.hpp>
#include <gear/sharded_buffer.hpp>
#include <set>
#include <thread>
#include <vector>

using spec = gear::spec<gear::column<"obs", float, 8>>;

template <class Storage>
int run(std::vector<int> devices) {
  using buffer = gear::sharded_buffer<spec, Storage, gear::select::uniform>;
  constexpr bool gpu = buffer::on_device;
  const auto ranks = static_cast<std::int64_t>(devices.size());
  const std::int64_t B = 64, L = 4, steps = 100;

  // 1. A shard per rank's device; draws without replacement make a step's rows distinct.
  buffer buf(devices, gear::capacity{4096}, gear::max_length{L},
             gear::select::uniform{.replacement = false}, gear::insert_route::round_robin);
  std::vector<std::int64_t> lengths(512, L);
  std::vector<float> obs(512 * L * 8, 1.0f);
  std::vector<gear::key> keys(512);
  for (int call = 0; call < 4; ++call)
    buf.insert({lengths, {gear::input(obs.data(), {8})}}, keys, cuda::stream_ref{cudaStream_t{}});

  // 2. The ranks' sampler: R x B rows per step, staged on the current device (rank 0's).
  gear::rank_sampler<buffer> sampler(buf, gear::rank_count{ranks}, gear::batch_size{B},
                                     gear::window{.length = L}, gear::rng{2026});

  // 3. A thread per rank, on its own device and stream; each records its keys of every step.
  std::vector<std::vector<gear::key>> seen(static_cast<std::size_t>(ranks));
  std::vector<std::thread> pool;
  std::atomic<bool> failed{false};
  for (std::int64_t r = 0; r < ranks; ++r)
    pool.emplace_back([&, r] {
      try {
        const int device = devices[static_cast<std::size_t>(r)];
        cudaStream_t stream{};
        if constexpr (gpu) {
          GEAR_CUDA_TRY(cudaSetDevice(device));
          GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        }
        auto batch = sampler.make_batch();  // on this rank's device
        std::vector<gear::key> mine(B);
        for (std::int64_t t = 0; t < steps; ++t) {
          sampler.sample(r, batch, cuda::stream_ref{stream});  // a training step would use it here
          if constexpr (gpu)
            GEAR_CUDA_TRY(cudaMemcpy(mine.data(), batch.keys().data(), B * sizeof(gear::key),
                                     cudaMemcpyDeviceToHost));
          else
            std::copy(batch.keys().begin(), batch.keys().end(), mine.begin());
          seen[static_cast<std::size_t>(r)].insert(seen[static_cast<std::size_t>(r)].end(),
                                                   mine.begin(), mine.end());
        }
        if constexpr (gpu) GEAR_CUDA_TRY(cudaStreamDestroy(stream));
      } catch (const gear::error& e) {  // a rank's failure ends the example, not the process
        std::fprintf(stderr, "data_parallel: rank %lld: %s\n", static_cast<long long>(r), e.what());
        failed = true;
      }
    });
  for (auto& t : pool) t.join();
  if (failed) return 1;

  // 4. Within every step, no trajectory went to two ranks.
  for (std::int64_t t = 0; t < steps; ++t) {
    std::set<std::pair<std::uint32_t, std::uint64_t>> step;
    for (const auto& rank : seen)
      for (std::int64_t i = t * B; i < (t + 1) * B; ++i)
        step.insert(
            {rank[static_cast<std::size_t>(i)].shard, rank[static_cast<std::size_t>(i)].ticket});
    if (step.size() != static_cast<std::size_t>(ranks * B)) {
      std::fprintf(stderr, "data_parallel: step %lld shares rows between ranks\n",
                   static_cast<long long>(t));
      return 1;
    }
  }
  std::printf("data_parallel: %lld ranks x %lld rows, %lld steps, disjoint in every step, %s\n",
              static_cast<long long>(ranks), static_cast<long long>(B),
              static_cast<long long>(steps), gpu ? "on the GPU" : "on the CPU");
  return 0;
}

int main() {
  try {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      return run<gear::storage::host>({0, 0});
    std::vector<int> devices;
    for (int d = 0; d < count; ++d) devices.push_back(d);
    if (count == 1) devices.push_back(0);  // two ranks on the one GPU
    return run<gear::storage::device>(devices);
  } catch (const gear::error& e) {
    std::fprintf(stderr, "data_parallel: %s\n", e.what());
    return 1;
  }
}
