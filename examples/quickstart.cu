// gear quickstart: make a buffer, insert trajectories, sample dense windows.
//
// Runs on the GPU (device storage) when there is one, otherwise on the CPU with host storage; the
// code is the same apart from the storage policy in the buffer's type.

#include <cstdio>
#include <gear/dlpack.hpp>  // 6. below: tensors for PyTorch, JAX, CuPy
#include <gear/gear.cuh>
#include <numeric>
#include <vector>

// 1. Say what a trajectory holds: named columns, element type, per-step shape.
using atari_spec = gear::spec<gear::column<"obs", std::uint8_t, 4, 84, 84>,  // frame stack
                              gear::column<"action", std::int32_t>, gear::column<"reward", float>,
                              gear::column<"done", bool>>;

template <class Storage>
int run(const char* where, cuda::stream_ref stream) {
  // 2. Pick the policies at compile time and size the buffer at run time.
  using buffer =
      gear::replay_buffer<atari_spec, Storage, gear::select::uniform, gear::transport::local>;
  buffer buf{gear::capacity{256}, gear::max_length{100}};
  std::printf("gear %s: buffer of %lld slots x %lld steps, running on the %s\n",
              gear::version_string, static_cast<long long>(buf.capacity()),
              static_cast<long long>(buf.max_length()), where);

  // 3. Insert a batch of whole trajectories. Each column is packed: trajectory after trajectory.
  const std::vector<std::int64_t> lengths{100, 60, 35, 80};
  const std::int64_t steps = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
  std::vector<std::uint8_t> obs(static_cast<std::size_t>(steps) * 4 * 84 * 84);
  std::vector<std::int32_t> action(static_cast<std::size_t>(steps));
  std::vector<float> reward(static_cast<std::size_t>(steps));
  std::vector<std::uint8_t> done_bytes(static_cast<std::size_t>(steps), 0);
  for (std::int64_t t = 0; t < steps; ++t) {
    obs[static_cast<std::size_t>(t) * 4 * 84 * 84] = static_cast<std::uint8_t>(t);
    action[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t % 18);
    reward[static_cast<std::size_t>(t)] = 0.5f * static_cast<float>(t % 3);
  }
  const auto* done = reinterpret_cast<const bool*>(done_bytes.data());
  std::vector<gear::key> keys(lengths.size());
  for (int round = 0; round < 100; ++round)  // 400 trajectories: the oldest are evicted (FIFO)
    buf.insert({lengths,
                {gear::input(obs.data(), {4, 84, 84}), gear::input(action.data()),
                 gear::input(reward.data()), gear::input(done)}},
               keys, stream);
  // A key names one trajectory by its ticket (the n-th reservation gets ticket n and slot
  // n % capacity); a key to an evicted trajectory is stale, never confused with its slot's new one.
  std::printf("inserted 400 trajectories; %lld stored, newest key: ticket %llu (slot %lld)\n",
              static_cast<long long>(buf.size()), static_cast<unsigned long long>(keys[3].ticket),
              static_cast<long long>(keys[3].slot(buf.capacity())));

  // 4. Sample: 32 windows of the last 64 steps, left-padded like a causal transformer wants.
  auto batch = buf.make_batch(gear::batch_size{32}, gear::window_length{64});
  gear::rng rng{2026};
  const gear::window window{
      .length = 64, .offset = 0, .from = gear::anchor::end, .padding = gear::pad::head};
  buf.sample(batch, window, rng, stream);

  // 5. Read the results: mdspans [B, L, shape...] in the buffer's batch memory.
  auto rewards = batch.template column<"reward">();
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(32 * 64));
  std::vector<float> reward_rows(static_cast<std::size_t>(32 * 64));
  if constexpr (buffer::on_device) {
    GEAR_CUDA_TRY(
        cudaMemcpy(mask.data(), batch.mask().data_handle(), mask.size(), cudaMemcpyDeviceToHost));
    GEAR_CUDA_TRY(cudaMemcpy(reward_rows.data(), rewards.data_handle(),
                             reward_rows.size() * sizeof(float), cudaMemcpyDeviceToHost));
  } else {
    std::copy_n(batch.mask().data_handle(), mask.size(), mask.begin());
    std::copy_n(rewards.data_handle(), reward_rows.size(), reward_rows.begin());
  }
  std::int64_t valid = 0;
  for (auto m : mask) valid += m;
  std::printf(
      "sampled %lld x %lld windows: %lld of %lld positions hold steps (the rest is padding)\n",
      static_cast<long long>(rewards.extent(0)), static_cast<long long>(rewards.extent(1)),
      static_cast<long long>(valid), static_cast<long long>(mask.size()));
  std::printf("row 0 ends with rewards %.1f %.1f %.1f\n", reward_rows[61], reward_rows[62],
              reward_rows[63]);

  // 6. Or hand the batch to a framework without a copy: a DLPack tensor viewing its bytes (for
  //    PyTorch: at::fromDLPack(tensor)). Export once; every sample into the batch refills it.
  DLManagedTensor* tensor = gear::to_dlpack<"obs">(batch);
  const DLTensor& t = tensor->dl_tensor;
  std::printf("obs as a DLPack tensor: [%lld, %lld, %lld, %lld, %lld] of uint%d on %s\n",
              static_cast<long long>(t.shape[0]), static_cast<long long>(t.shape[1]),
              static_cast<long long>(t.shape[2]), static_cast<long long>(t.shape[3]),
              static_cast<long long>(t.shape[4]), t.dtype.bits,
              t.device.device_type == kDLCUDA ? "the GPU" : "the CPU");
  const bool exported = t.data == batch.column_data(0) && t.ndim == 5;
  tensor->deleter(tensor);  // what a framework does when it lets go; the batch keeps its bytes
  return valid > 0 && exported ? 0 : 1;
}

int main() {
  try {
    if (gear::detail::gpu_available()) {
      cudaStream_t stream{};
      GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      const int rc = run<gear::storage::device>("GPU (device storage)", cuda::stream_ref{stream});
      GEAR_CUDA_TRY(cudaStreamDestroy(stream));
      return rc;
    }
    std::printf("no GPU found: using host storage\n");
    return run<gear::storage::host>("CPU (host storage)", gear::detail::no_stream());
  } catch (const gear::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
