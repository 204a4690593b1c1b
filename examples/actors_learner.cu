// gear example: actors and a learner on one buffer, each thread on its own stream, with no lock
// or event of their own (README, "Threads and streams").
//
//   4 actor threads   insert trajectories from host memory, each on its own stream
//   1 learner thread  samples windows with priorities, "trains", updates the priorities
//
// Every step of a trajectory holds (actor << 24 | episode << 8 | t), so the learner checks each
// sampled row: all its steps come from one trajectory, in order, and the row's key is the one
// the actor got back for it (no torn row, no row under another trajectory's key). Runs on the GPU
// (device storage) when there is one, otherwise on the CPU with host storage; prints progress.

#include <atomic>
#include <cstdio>
#include <gear/gear.cuh>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

using spec = gear::spec<gear::column<"step", std::int32_t>, gear::column<"reward", float>>;

constexpr int actors = 4;
constexpr std::int64_t episodes_per_actor = 400, length = 24, window = 8, batch = 64;

/// A stream per thread on the GPU; nothing on the CPU.
struct own_stream {
  cudaStream_t s{};
  explicit own_stream(bool gpu) {
    if (gpu) GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  ~own_stream() {
    if (s != nullptr) (void)cudaStreamDestroy(s);
  }
  own_stream(const own_stream&) = delete;
  own_stream& operator=(const own_stream&) = delete;
  [[nodiscard]] cuda::stream_ref ref() const { return cuda::stream_ref{s}; }
};

template <class T>
std::vector<T> to_host(const T* p, std::size_t n, bool gpu, cuda::stream_ref s) {
  std::vector<T> out(n);
  if (gpu) {
    GEAR_CUDA_TRY(cudaMemcpyAsync(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost, s.get()));
    GEAR_CUDA_TRY(cudaStreamSynchronize(s.get()));
  } else {
    std::copy_n(p, n, out.begin());
  }
  return out;
}

template <class Storage>
int run(const char* where) {
  using buffer = gear::replay_buffer<spec, Storage, gear::select::prioritized>;
  constexpr bool gpu = buffer::on_device;
  buffer buf{gear::capacity{512}, gear::max_length{length},
             gear::select::prioritized{.alpha = 0.6, .beta = 0.4}};
  std::printf("actors_learner on the %s: %d actors x %lld episodes, 1 learner\n", where, actors,
              static_cast<long long>(episodes_per_actor));
  // The most one call asks for: the staging of such calls is allocated now, not during the run
  // (each actor and the learner keep about two calls queued).
  buf.reserve_staging({.insert_trajectories = 1,
                       .insert_steps = length,
                       .batch = batch,
                       .in_flight = 2 * (actors + 1)});

  // Which trajectory each key names, as the actors got them back (the learner checks rows
  // against it). The example's own bookkeeping, not something gear needs.
  std::mutex keys_mutex;
  std::map<std::uint64_t, std::int32_t> trajectory_of;  // ticket -> actor << 24 | episode << 8

  std::atomic<int> running{actors};
  auto actor = [&](int id) {
    own_stream stream(gpu);
    std::vector<std::int32_t> steps(length);
    std::vector<float> rewards(length);
    const std::int64_t len[] = {length};
    for (std::int64_t e = 0; e < episodes_per_actor; ++e) {
      const std::int32_t tag = id << 24 | static_cast<std::int32_t>(e) << 8;
      for (std::int64_t t = 0; t < length; ++t) {
        steps[static_cast<std::size_t>(t)] = tag | static_cast<std::int32_t>(t);
        rewards[static_cast<std::size_t>(t)] = static_cast<float>((e + t) % 5);
      }
      gear::key k{};
      // Host memory is copied during the call: `steps` may be refilled at once.
      buf.insert_async({len, {gear::input(steps.data()), gear::input(rewards.data())}},
                       std::span<gear::key>(&k, 1), stream.ref());
      const std::lock_guard<std::mutex> hold(keys_mutex);
      trajectory_of[k.ticket] = tag;
    }
    if (gpu) GEAR_CUDA_TRY(cudaStreamSynchronize(stream.s));
    --running;
  };

  std::int64_t rows_checked = 0, bad_rows = 0, updates_applied = 0, updates_stale = 0;
  auto learner = [&] {
    own_stream stream(gpu);
    auto b = buf.make_batch(gear::batch_size{batch}, gear::window_length{window});
    gear::rng rng{7};
    const gear::window w{.length = window, .from = gear::anchor::random};
    int iteration = 0;
    while (running.load() > 0 || iteration < 50) {
      if (buf.size() < batch) {  // warm-up: wait for the actors' first trajectories
        std::this_thread::yield();
        continue;
      }
      buf.sample(b, w, rng, stream.ref());
      const auto keys = to_host(b.keys_data(), batch, gpu, stream.ref());
      const auto mask = to_host(b.mask_data(), batch * window, gpu, stream.ref());
      const auto steps = to_host(reinterpret_cast<const std::int32_t*>(b.column_data(0)),
                                 batch * window, gpu, stream.ref());
      std::vector<float> priorities(batch);
      for (std::int64_t r = 0; r < batch; ++r) {
        std::int32_t tag = -1;
        {
          const std::lock_guard<std::mutex> hold(keys_mutex);
          const auto it = trajectory_of.find(keys[static_cast<std::size_t>(r)].ticket);
          if (it != trajectory_of.end()) tag = it->second;
        }
        std::int32_t previous = -1;
        for (std::int64_t j = 0; j < window; ++j) {
          const auto at = static_cast<std::size_t>(r * window + j);
          if (mask[at] == 0) continue;
          const std::int32_t v = steps[at];
          // A step of this row's own trajectory (the actor may not have recorded the key yet:
          // then only the row's consistency is checked), following the previous one.
          if ((tag >= 0 && (v & ~0xFF) != tag) || (previous >= 0 && v != previous + 1)) ++bad_rows;
          previous = v;
        }
        ++rows_checked;
        priorities[static_cast<std::size_t>(r)] = 0.1f + static_cast<float>(r % 7);  // "TD error"
      }
      // Keys evicted since the sample are skipped and counted, not an error.
      const auto result = buf.update_priorities(
          std::span<const gear::key>(keys.data(), keys.size()), priorities, stream.ref());
      updates_applied += result.applied;
      updates_stale += result.stale;
      if (++iteration % 100 == 0)
        std::printf("  learner: %d batches, %lld rows checked, %lld stored\n", iteration,
                    static_cast<long long>(rows_checked), static_cast<long long>(buf.size()));
    }
  };

  std::vector<std::thread> threads;
  for (int id = 0; id < actors; ++id) threads.emplace_back(actor, id);
  threads.emplace_back(learner);
  for (auto& t : threads) t.join();

  std::printf("done: %lld rows checked, %lld bad; priority updates: %lld applied, %lld stale\n",
              static_cast<long long>(rows_checked), static_cast<long long>(bad_rows),
              static_cast<long long>(updates_applied), static_cast<long long>(updates_stale));
  return bad_rows == 0 && rows_checked > 0 ? 0 : 1;
}

int main() {
  try {
    if (gear::detail::gpu_available()) return run<gear::storage::device>("GPU (device storage)");
    std::printf("no GPU found: using host storage\n");
    return run<gear::storage::host>("CPU (host storage)");
  } catch (const gear::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
