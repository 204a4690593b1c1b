// gear on-policy queue: rollouts that are each trained on once, in the order they were made
// (select::fifo, as PPO or IMPALA learners take them), and a cap on reuse for off-policy replay
// (set_max_times_sampled: every trajectory is removed after k returns).
//
// Runs on the GPU (device storage) when there is one, otherwise on the CPU with host storage.
// Every result is checked; the program exits 1 if one is wrong.

#include <algorithm>
#include <cstdio>
#include <gear/gear.cuh>
#include <vector>

// A rollout step: observation, action, reward and the behaviour policy's log-probability.
using rollout_spec = gear::spec<gear::column<"obs", float, 8>, gear::column<"action", std::int32_t>,
                                gear::column<"reward", float>, gear::column<"logp", float>>;

constexpr std::int64_t segment = 32;  // steps per rollout segment
constexpr std::int64_t actors = 8;    // segments per iteration, one per actor

/// Copies n values from the batch's memory (device memory on the GPU) to the host.
template <class Buffer, class T>
std::vector<T> read(const T* p, std::int64_t n) {
  std::vector<T> out(static_cast<std::size_t>(n));
  if constexpr (Buffer::on_device)
    GEAR_CUDA_TRY(cudaMemcpy(out.data(), p, out.size() * sizeof(T), cudaMemcpyDeviceToHost));
  else
    std::copy_n(p, n, out.begin());
  return out;
}

/// `actors` segments of iteration `it`: action = 1000 * it + 100 * actor + t, so every step says
/// where it came from.
template <class Buffer>
std::vector<gear::key> act(Buffer& buf, int it, cuda::stream_ref stream) {
  const std::int64_t steps = actors * segment;
  std::vector<float> obs(static_cast<std::size_t>(steps) * 8, 0.5f);
  std::vector<std::int32_t> action(static_cast<std::size_t>(steps));
  std::vector<float> reward(static_cast<std::size_t>(steps), 1.0f), logp(action.size(), -1.5f);
  for (std::int64_t a = 0; a < actors; ++a)
    for (std::int64_t t = 0; t < segment; ++t)
      action[static_cast<std::size_t>(a * segment + t)] =
          static_cast<std::int32_t>(1000 * it + 100 * a + t);
  const std::vector<std::int64_t> lengths(actors, segment);
  std::vector<gear::key> keys(actors);
  buf.insert({lengths,
              {gear::input(obs.data(), {8}), gear::input(action.data()), gear::input(reward.data()),
               gear::input(logp.data())}},
             keys, stream);
  return keys;
}

template <class Storage>
int run(const char* where, cuda::stream_ref stream) {
  std::printf("gear on-policy queue, running on the %s\n", where);
  int wrong = 0;

  // 1. A queue: the learner takes the oldest segments, each exactly once.
  {
    using queue = gear::replay_buffer<rollout_spec, Storage, gear::select::fifo>;
    queue buf{gear::capacity{4 * actors}, gear::max_length{segment}};
    auto batch = buf.make_batch(gear::batch_size{actors}, gear::window_length{segment});
    gear::rng rng{1};  // fifo draws nothing; sample takes a generator like every policy
    for (int it = 0; it < 20; ++it) {
      const std::vector<gear::key> made = act(buf, it, stream);
      buf.sample(batch, gear::window{.length = segment}, rng, stream);
      // The segments come back in the order they were inserted, and leave the queue.
      const auto keys = read<queue>(batch.keys().data(), actors);
      const auto action =
          read<queue>(batch.template column<"action">().data_handle(), actors * segment);
      for (std::int64_t a = 0; a < actors; ++a) {
        wrong += keys[static_cast<std::size_t>(a)] != made[static_cast<std::size_t>(a)];
        for (std::int64_t t = 0; t < segment; ++t)
          wrong += action[static_cast<std::size_t>(a * segment + t)] != 1000 * it + 100 * a + t;
      }
      wrong += buf.size() != 0;
      if (it < 3)
        std::printf("iteration %d: trained on tickets %llu..%llu, %lld left in the queue\n", it,
                    static_cast<unsigned long long>(keys.front().ticket),
                    static_cast<unsigned long long>(keys.back().ticket),
                    static_cast<long long>(buf.size()));
    }
    // An empty queue says so: gear::error with errc::not_enough_items, nothing changed.
    try {
      buf.sample(batch, gear::window{.length = segment}, rng, stream);
      ++wrong;
    } catch (const gear::error& e) {
      std::printf("one more sample: %s\n", e.what());
      wrong += e.code() != gear::errc::not_enough_items && e.code() != gear::errc::empty_buffer;
    }
  }

  // 2. Replay with a cap: uniform without replacement, every segment removed after 4 returns.
  {
    using replay = gear::replay_buffer<rollout_spec, Storage, gear::select::uniform>;
    replay buf{gear::capacity{4 * actors}, gear::max_length{segment},
               gear::select::uniform{.replacement = false}};
    buf.set_max_times_sampled(4);
    std::vector<gear::key> made = act(buf, 0, stream);
    for (const gear::key& k : act(buf, 1, stream)) made.push_back(k);  // 16 segments
    auto batch = buf.make_batch(gear::batch_size{actors}, gear::window_length{segment});
    gear::rng rng{2};
    std::vector<int> returns(made.size(), 0);
    int batches = 0;
    while (buf.size() >= actors && batches < 100) {  // a batch takes 8 distinct segments
      buf.sample(batch, gear::window{.length = segment}, rng, stream);
      ++batches;
      for (const gear::key& k : read<replay>(batch.keys().data(), actors))
        ++returns[static_cast<std::size_t>(std::find(made.begin(), made.end(), k) - made.begin())];
    }
    // A segment returned 4 times is gone (its key is stale); the others stay, with their counts.
    int gone = 0;
    for (std::size_t i = 0; i < made.size(); ++i) {
      wrong += returns[i] > 4 || buf.contains(made[i]) == (returns[i] == 4);
      if (buf.contains(made[i]))
        wrong += buf.times_sampled(made[i].slot(buf.capacity())) != returns[i];
      gone += returns[i] == 4;
    }
    std::printf(
        "16 segments, at most 4 returns each: after %d batches of %lld, %d are gone, "
        "%lld left with fewer returns\n",
        batches, static_cast<long long>(actors), gone, static_cast<long long>(buf.size()));
    wrong += gone + buf.size() != 16;
  }
  if (wrong != 0) std::printf("%d results were wrong\n", wrong);
  return wrong == 0 ? 0 : 1;
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
