// gear example: one prioritized buffer over the GPUs of this machine, a shard per GPU (two shards
// on one GPU where there is only one; two host shards without a GPU).
//
//   inserts go to a shard on the caller's device -> a sample splits its rows across the shards by
//   their priority mass, each shard selects on its GPU and gathers its rows straight into the
//   batch -> priorities go back to the shard each key names
//
// The batch's probabilities are those of the union: P_i = p_i^alpha / sum over every shard.

#include <cstdio>
#include <gear/gear.cuh>
#include <gear/sharded_buffer.hpp>
#include <span>
#include <vector>

using spec = gear::spec<gear::column<"obs", float, 4>, gear::column<"reward", float>>;

template <class Storage>
int run(std::vector<int> devices, cuda::stream_ref stream) {
  using buffer = gear::sharded_buffer<spec, Storage, gear::select::prioritized>;
  constexpr bool gpu = buffer::on_device;
  // 1. A shard of 2048 slots per entry; keys name their shard (key.shard). Round robin here, so
  //    that every shard fills on a one-GPU machine too (the default sends each call to a shard
  //    on the caller's device).
  buffer buf(devices, gear::capacity{2048}, gear::max_length{16},
             gear::select::prioritized{.alpha = 0.6, .beta = 0.4}, gear::insert_route::round_robin);

  // 2. Trajectories of 16 steps; reward r on every step of the r-th call.
  const std::int64_t count = 256, T = 16;
  std::vector<std::int64_t> lengths(count, T);
  std::vector<float> obs(count * T * 4, 0.5f), reward(count * T);
  std::vector<gear::key> keys(count);
  for (int call = 0; call < 8; ++call) {
    std::fill(reward.begin(), reward.end(), static_cast<float>(call));
    buf.insert({lengths, {gear::input(obs.data(), {4}), gear::input(reward.data())}}, keys, stream);
  }
  for (std::size_t s = 0; s < buf.shard_count(); ++s)
    std::printf("shard %zu (device %d): %lld trajectories\n", s, buf.device(s),
                static_cast<long long>(buf.shard(s).size()));

  // 3. Sample, give each sampled trajectory a new priority, repeat.
  const std::int64_t B = 128, L = 8;
  auto batch = buf.make_batch(gear::batch_size{B}, gear::window_length{L});
  gear::rng rng{5};
  std::vector<gear::key> sampled(B);
  std::vector<float> priority(B);
  std::vector<std::int64_t> rows_per_shard(buf.shard_count(), 0);
  for (int step = 0; step < 50; ++step) {
    buf.sample(batch, gear::window{.length = L}, rng, stream);
    if constexpr (gpu)
      GEAR_CUDA_TRY(cudaMemcpy(sampled.data(), batch.keys().data(), B * sizeof(gear::key),
                               cudaMemcpyDeviceToHost));
    else
      std::copy(batch.keys().begin(), batch.keys().end(), sampled.begin());
    for (std::int64_t r = 0; r < B; ++r) {
      ++rows_per_shard[sampled[r].shard];
      priority[r] = 0.1f + static_cast<float>(r % 10);  // a learner's |TD error| here
    }
    buf.update_priorities(sampled, priority, stream);  // each key to its shard
  }
  for (std::size_t s = 0; s < buf.shard_count(); ++s)
    std::printf("shard %zu gave %lld of %lld rows\n", s, static_cast<long long>(rows_per_shard[s]),
                static_cast<long long>(50 * B));
  std::printf("sharded: %zu shards, %lld trajectories, %s\n", buf.shard_count(),
              static_cast<long long>(buf.size()), gpu ? "on the GPU" : "on the CPU");
  return 0;
}

int main() {
  try {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      return run<gear::storage::host>({0, 0}, cuda::stream_ref{cudaStream_t{}});
    std::vector<int> devices;
    for (int d = 0; d < count; ++d) devices.push_back(d);
    if (count == 1) devices.push_back(0);  // two shards on the one GPU
    cudaStream_t s{};
    GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int rc = run<gear::storage::device>(devices, cuda::stream_ref{s});
    GEAR_CUDA_TRY(cudaStreamDestroy(s));
    return rc;
  } catch (const gear::error& e) {
    std::fprintf(stderr, "sharded: %s\n", e.what());
    return 1;
  }
}
