// gear example: a prioritized-replay (PER) training loop on synthetic data.
//
//   insert trajectories -> sample a batch with importance weights -> compute (fake) TD errors on
//   the GPU -> update the sampled trajectories' priorities (on the GPU, from device memory)
//   -> anneal beta -> repeat
//
// Runs on the GPU (device storage) when there is one, otherwise on the CPU with host storage.

#include <cmath>
#include <cstdio>
#include <gear/gear.cuh>
#include <span>
#include <vector>

using spec = gear::spec<gear::column<"obs", float, 8>, gear::column<"reward", float>>;

// A stand-in for the learner: |TD error| of a row = mean |reward| of its window, scaled by its
// importance weight the way a loss would be; the new priority is that plus epsilon. Real code
// runs its network here.
__global__ void fake_td_errors(const float* rewards, const std::uint8_t* mask, const float* weights,
                               std::int64_t rows, std::int64_t length, float epsilon, float* td) {
  const std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (row >= rows) return;
  float sum = 0;
  for (std::int64_t j = 0; j < length; ++j)
    sum += mask[row * length + j] ? fabsf(rewards[row * length + j]) : 0.0f;
  td[row] = sum / static_cast<float>(length) * (0.5f + 0.5f * weights[row]) + epsilon;
}

template <class Storage>
int run(cuda::stream_ref stream) {
  using buffer = gear::replay_buffer<spec, Storage, gear::select::prioritized>;
  constexpr bool gpu = buffer::on_device;
  // 1. alpha = 0.6, beta starts at 0.4 and is annealed to 1 below.
  buffer buf{gear::capacity{4096}, gear::max_length{32},
             gear::select::prioritized{.alpha = 0.6, .beta = 0.4}};

  // 2. Synthetic trajectories: trajectory i has rewards of size about i % 7 (some matter more).
  const std::int64_t count = 512, T = 32;
  std::vector<std::int64_t> lengths(count, T);
  std::vector<float> obs(count * T * 8, 0.25f), reward(count * T);
  for (std::int64_t i = 0; i < count * T; ++i) reward[i] = static_cast<float>((i / T) % 7) * 0.1f;
  std::vector<gear::key> keys(count);
  for (int round = 0; round < 8; ++round)
    buf.insert({lengths, {gear::input(obs.data(), {8}), gear::input(reward.data())}}, keys, stream);

  // 3. The loop. The batch is made once and reused: sampling allocates nothing.
  const std::int64_t B = 256, L = 16;
  auto batch = buf.make_batch(gear::batch_size{B}, gear::window_length{L});
  gear::rng rng{7};
  const float epsilon = 1e-3f;  // keeps every trajectory drawable
  std::vector<float> td(B);
  float* td_device = nullptr;
  if constexpr (gpu) GEAR_CUDA_TRY(cudaMalloc(&td_device, B * sizeof(float)));
  const int steps = 200;
  for (int step = 0; step < steps; ++step) {
    const double beta = 0.4 + 0.6 * step / (steps - 1);  // anneal beta -> 1
    buf.selection_state().set_exponents(0.6, beta, stream);
    buf.sample(batch, gear::window{.length = L, .offset = 0, .from = gear::anchor::random}, rng,
               stream);
    auto rewards = batch.template column<"reward">();
    // 4. New priorities = |TD error| + epsilon, for the batch's keys. A key sampled twice takes
    //    its last value.
    if constexpr (gpu) {
      fake_td_errors<<<(B + 127) / 128, 128, 0, stream.get()>>>(
          rewards.data_handle(), batch.mask().data_handle(), batch.weights().data(), B, L, epsilon,
          td_device);
      GEAR_CHECK_LAUNCH("fake_td_errors");
      // Keys and priorities stay on the GPU (memory_kind::device): the update's kernels read them
      // in stream order and check them there; no copy, no synchronisation. A key whose trajectory
      // was evicted since it was sampled is skipped (and counted: selection_state().stale_pairs);
      // a key of another shard or a NaN priority would make this update change nothing and be
      // thrown by a later call (check_priority_updates below, at the latest).
      buf.update_priorities_async(std::span<const gear::key>(batch.keys().data(), B),
                                  std::span<const float>(td_device, B), gear::memory_kind::device,
                                  stream);
    } else {
      std::vector<gear::key> batch_keys(B);
      for (std::int64_t r = 0; r < B; ++r) {
        float sum = 0;
        for (std::int64_t j = 0; j < L; ++j)
          sum += batch.mask().data_handle()[r * L + j] ? std::fabs(rewards.data_handle()[r * L + j])
                                                       : 0.0f;
        td[r] = sum / L * (0.5f + 0.5f * batch.weights()[r]) + epsilon;
        batch_keys[r] = batch.keys()[r];
      }
      // From host memory the counts come back at once: {applied, stale}.
      const gear::priority_update_result done = buf.update_priorities(batch_keys, td, stream);
      if (done.applied + done.stale != B) return 1;
    }
  }
  // Waits for the last update and throws if any update from device memory failed.
  buf.check_priority_updates(stream);
  if constexpr (gpu) GEAR_CUDA_TRY(cudaFree(td_device));

  // 5. Trajectories with larger rewards now have larger priorities and are drawn more often.
  buf.sample(batch, gear::window{.length = L}, rng, stream);
  std::vector<float> probs(B);
  if constexpr (gpu)
    GEAR_CUDA_TRY(cudaMemcpy(probs.data(), batch.probabilities().data(), B * sizeof(float),
                             cudaMemcpyDeviceToHost));
  else
    for (std::int64_t r = 0; r < B; ++r) probs[r] = batch.probabilities()[r];
  float lo = probs[0], hi = probs[0];
  for (float p : probs) lo = std::fmin(lo, p), hi = std::fmax(hi, p);
  std::printf("after %d PER steps on the %s: max priority %.3f, batch probabilities %.2e .. %.2e\n",
              steps, gpu ? "GPU" : "CPU", buf.selection_state().max_priority(stream), lo, hi);
  return hi > lo ? 0 : 1;
}

int main() {
  try {
    if (gear::detail::gpu_available()) {
      cudaStream_t s{};
      GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      const int rc = run<gear::storage::device>(cuda::stream_ref{s});
      GEAR_CUDA_TRY(cudaStreamDestroy(s));
      return rc;
    }
    std::printf("no GPU found: using host storage\n");
    return run<gear::storage::host>(gear::detail::no_stream());
  } catch (const gear::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
