// gear_enqueue_calls: where the host time of one sample_async goes, per selection policy (PERF.md
// P7: B = 256 windows of 16 steps of 256 B, device storage, 16384 trajectories). Prints each
// policy's host time per call (median over rounds of four calls on an idle stream); run with
//
//   LD_PRELOAD=build/bench/libgear_cuda_calls.so build/bench/gear_enqueue_calls
//
// it also prints the CUDA runtime calls each sample_async makes, their count and time (this
// program links the runtime as a shared library so that the preloaded one can count them). The
// last four rows sample under set_max_times_sampled.
// Exits 77 without a GPU.

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <gear/gear.cuh>
#include <vector>

namespace {

using step_spec = gear::spec<gear::column<"x", std::uint8_t, 256>>;

// libgear_cuda_calls.so's controls, when it is preloaded (null otherwise).
struct call_counter {
  void (*reset)() = nullptr;
  void (*count)(bool) = nullptr;
  void (*print)(const char*, double) = nullptr;
  call_counter() {
    reset = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gear_calls_reset"));
    count = reinterpret_cast<void (*)(bool)>(dlsym(RTLD_DEFAULT, "gear_calls_count"));
    print =
        reinterpret_cast<void (*)(const char*, double)>(dlsym(RTLD_DEFAULT, "gear_calls_print"));
  }
  [[nodiscard]] bool present() const { return reset && count && print; }
};

/// max_times > 0: the buffer removes each trajectory after that many returns
/// (set_max_times_sampled), counted on the host.
template <class Policy>
void measure(const char* label, Policy policy, const call_counter& counter,
             std::int64_t max_times = 0) {
  constexpr std::int64_t total = 16384, len = 16, batch = 256, chunk = 1024, calls = 4;
  constexpr int rounds = 300;
  cudaStream_t s{};
  GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    gear::replay_buffer<step_spec, gear::storage::device, Policy> buf{
        gear::capacity{total}, gear::max_length{len}, policy};
    std::vector<std::uint8_t> steps(static_cast<std::size_t>(chunk * len * 256));
    const std::vector<std::int64_t> lengths(chunk, len);
    std::vector<gear::key> keys(chunk);
    const auto fill_up = [&] {  // consuming policies drain a round's rows
      while (buf.size() + chunk <= total)
        buf.insert({lengths, {gear::input(steps.data(), {256})}}, keys, s);
      GEAR_CUDA_TRY(cudaStreamSynchronize(s));
    };
    fill_up();
    if (max_times > 0) buf.set_max_times_sampled(max_times);
    auto out = buf.make_batch(gear::batch_size{batch}, gear::window_length{len});
    const gear::window w{.length = len};
    gear::rng g{7};
    buf.sample(out, w, g, s);  // staging and events made
    std::vector<double> per_call;
    if (counter.present()) {
      counter.reset();
      counter.count(false);
    }
    for (int round = 0; round < rounds; ++round) {
      fill_up();
      if (counter.present()) counter.count(true);
      const auto start = std::chrono::steady_clock::now();
      for (std::int64_t i = 0; i < calls; ++i) buf.sample_async(out, w, g, s);
      const auto end = std::chrono::steady_clock::now();
      if (counter.present()) counter.count(false);
      per_call.push_back(std::chrono::duration<double>(end - start).count() / calls);
      GEAR_CUDA_TRY(cudaStreamSynchronize(s));
    }
    std::nth_element(per_call.begin(), per_call.begin() + rounds / 2, per_call.end());
    std::printf("%s: %.2f us per sample_async (median of %d rounds of %lld calls)\n", label,
                1e6 * per_call[rounds / 2], rounds, static_cast<long long>(calls));
    if (counter.present()) counter.print(label, static_cast<double>(rounds * calls));
  }
  GEAR_CUDA_TRY(cudaStreamDestroy(s));
}

}  // namespace

int main() {
  if (!gear::detail::gpu_available()) {
    std::printf("gear_enqueue_calls: no GPU; skipping\n");
    return 77;
  }
  const call_counter counter;
  std::printf("host time of sample_async, B = 256 windows of 16 steps of 256 B, device storage%s\n",
              counter.present() ? "; CUDA runtime calls per sample_async (count, time)"
                                : " (preload libgear_cuda_calls.so for the calls it makes)");
  measure("uniform", gear::select::uniform{}, counter);
  measure("uniform without replacement", gear::select::uniform{.replacement = false}, counter);
  measure("prioritized", gear::select::prioritized{}, counter);
  measure("recency", gear::select::recency{.newest = 4096}, counter);
  measure("fifo", gear::select::fifo{}, counter);
  measure("lifo", gear::select::lifo{}, counter);
  // Under max_times_sampled (a limit of 2: trajectories are removed, and fill_up inserts anew),
  // the rows are counted on the host: no read-back, no synchronisation, except prioritized.
  measure("uniform, max_times_sampled 2", gear::select::uniform{}, counter, 2);
  measure("uniform without replacement, max_times_sampled 2",
          gear::select::uniform{.replacement = false}, counter, 2);
  measure("recency, max_times_sampled 2", gear::select::recency{.newest = 4096}, counter, 2);
  measure("prioritized, max_times_sampled 2 (reads its rows back)", gear::select::prioritized{},
          counter, 2);
  return 0;
}
