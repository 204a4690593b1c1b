// gear example: a training step captured into a CUDA graph, sample included.
//
//   fill a buffer -> capture [sample a batch -> a (fake) training kernel] into one graph ->
//   replay it every step, inserting new trajectories between replays
//
// Sampling with a gear::device_rng keeps the draw's call number on the GPU, so every replay
// draws a fresh batch (exactly the batch an eager call with gear::rng of the same seed would
// draw) from what the buffer holds when the replay runs. A training loop whose shapes are fixed
// then pays one graph launch per step instead of a host enqueue per kernel.
//
// Needs a GPU (exits 77 without one).

#include <cstdio>
#include <gear/gear.cuh>
#include <vector>

using spec = gear::spec<gear::column<"obs", float, 4>, gear::column<"reward", float>>;

// A stand-in for a training step: adds each row's masked reward sum to a running total.
__global__ void fake_train_step(const float* rewards, const std::uint8_t* mask, std::int64_t rows,
                                std::int64_t length, double* total) {
  const std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (row >= rows) return;
  float sum = 0;
  for (std::int64_t j = 0; j < length; ++j)
    sum += mask[row * length + j] ? rewards[row * length + j] : 0.0f;
  atomicAdd(total, static_cast<double>(sum));
}

int main() {
  if (!gear::detail::gpu_available()) {
    std::printf("graph_replay: no GPU; skipping\n");
    return 77;
  }
  try {
    cudaStream_t s{};
    GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const cuda::stream_ref stream{s};

    // 1. A uniform buffer on the GPU; every call below uses one stream (a buffer sampled with a
    //    device_rng is bound to its stream: replays wait for no other one).
    gear::replay_buffer<spec, gear::storage::device, gear::select::uniform> buf{
        gear::capacity{2048}, gear::max_length{64}};
    const std::int64_t T = 64, count = 256;
    std::vector<std::int64_t> lengths(count, T);
    std::vector<float> obs(count * T * 4, 0.5f), reward(count * T, 1.0f);
    std::vector<gear::key> keys(count);
    buf.insert({lengths, {gear::input(obs.data(), {4}), gear::input(reward.data())}}, keys, stream);

    // 2. Capture one step: the sample and the kernel that consumes its batch.
    const std::int64_t B = 256, L = 32;
    auto batch = buf.make_batch(gear::batch_size{B}, gear::window_length{L});
    double* total = nullptr;
    GEAR_CUDA_TRY(cudaMalloc(&total, sizeof(double)));
    GEAR_CUDA_TRY(cudaMemsetAsync(total, 0, sizeof(double), s));
    gear::device_rng draws{42};
    cudaGraph_t graph{};
    GEAR_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    buf.sample_async(batch, gear::window{.length = L, .from = gear::anchor::random}, draws, stream);
    fake_train_step<<<(B + 127) / 128, 128, 0, s>>>(batch.column<"reward">().data_handle(),
                                                    batch.mask().data_handle(), B, L, total);
    GEAR_CUDA_TRY(cudaStreamEndCapture(s, &graph));
    GEAR_CHECK_LAUNCH("fake_train_step");
    cudaGraphExec_t step{};
    GEAR_CUDA_TRY(cudaGraphInstantiate(&step, graph, 0));

    // 3. The loop: one launch per step. Eager inserts between replays are seen by the next one.
    const int steps = 100;
    for (int i = 0; i < steps; ++i) {
      GEAR_CUDA_TRY(cudaGraphLaunch(step, s));
      if (i % 10 == 9)
        buf.insert({lengths, {gear::input(obs.data(), {4}), gear::input(reward.data())}}, keys,
                   stream);
    }
    double sum = 0;
    GEAR_CUDA_TRY(cudaMemcpyAsync(&sum, total, sizeof sum, cudaMemcpyDeviceToHost, s));
    GEAR_CUDA_TRY(cudaStreamSynchronize(s));

    // Every reward is 1 and every window of 32 steps fits a trajectory of 64: each step adds
    // B * L. The call number advanced once per replay.
    const double want = static_cast<double>(steps) * B * L;
    std::printf(
        "graph_replay: %d replays, reward sum %.0f (want %.0f), %zu trajectories stored, "
        "device_rng at call %llu\n",
        steps, sum, want, static_cast<std::size_t>(buf.size()),
        static_cast<unsigned long long>(draws.calls(stream)));
    const bool ok = sum == want && draws.calls(stream) == static_cast<std::uint64_t>(steps);
    GEAR_CUDA_TRY(cudaGraphExecDestroy(step));
    GEAR_CUDA_TRY(cudaGraphDestroy(graph));
    GEAR_CUDA_TRY(cudaFree(total));
    GEAR_CUDA_TRY(cudaStreamDestroy(s));
    return ok ? 0 : 1;
  } catch (const gear::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
