// gear example: a sequence-model loop that trains on recent experience.
//
// Actors keep inserting episodes; the learner samples transformer contexts (the last 64 steps of
// an episode, left-padded) uniformly from the newest K episodes only, with select::recency.
// Runs on the GPU (device storage) when there is one, otherwise on the CPU with host storage.

#include <cstdio>
#include <gear/gear.cuh>
#include <vector>

using spec = gear::spec<gear::column<"token", std::int32_t>, gear::column<"episode", std::int32_t>>;

template <class Storage>
int run(cuda::stream_ref stream) {
  using buffer = gear::replay_buffer<spec, Storage, gear::select::recency>;
  // 1. Keep 1000 episodes, but train only on the newest 100.
  buffer buf{gear::capacity{1000}, gear::max_length{128}, gear::select::recency{.newest = 100}};
  const std::int64_t L = 64, B = 32;
  auto batch = buf.make_batch(gear::batch_size{B}, gear::window_length{L});
  gear::rng rng{11};
  const gear::window context{
      .length = L, .offset = 0, .from = gear::anchor::end, .padding = gear::pad::head};
  std::int32_t episode = 0;
  for (int iteration = 0; iteration < 50; ++iteration) {
    // 2. Actors: 40 new episodes of 40..127 steps; every step records its episode number.
    std::vector<std::int64_t> lengths;
    std::vector<std::int32_t> tokens, episodes;
    for (int e = 0; e < 40; ++e, ++episode) {
      lengths.push_back(40 + (episode * 37) % 88);
      for (std::int64_t t = 0; t < lengths.back(); ++t) {
        tokens.push_back(static_cast<std::int32_t>(t));
        episodes.push_back(episode);
      }
    }
    std::vector<gear::key> keys(lengths.size());
    buf.insert({lengths, {gear::input(tokens.data()), gear::input(episodes.data())}}, keys, stream);
    // 3. Learner: one batch of contexts from the newest 100 episodes.
    buf.sample(batch, context, rng, stream);
    // ... the model trains on batch.column<"token">() [B, L] with batch.mask() here ...
  }
  std::int32_t max_age = 0;
  buf.sample(batch, context, rng, stream);
  std::vector<std::int32_t> ep(B * L);
  const auto* src = batch.template column<"episode">().data_handle();
  if constexpr (buffer::on_device)
    GEAR_CUDA_TRY(
        cudaMemcpy(ep.data(), src, ep.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
  else
    std::copy(src, src + ep.size(), ep.begin());
  // The last position of a head-padded context always holds a step: its episode number.
  for (std::int64_t r = 0; r < B; ++r) max_age = std::max(max_age, episode - 1 - ep[r * L + L - 1]);
  std::printf(
      "%d episodes inserted, %lld stored; contexts came from episodes at most %d old (K = 100)\n",
      episode, static_cast<long long>(buf.size()), max_age);
  return max_age < 100 ? 0 : 1;
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
