// Contention: 8 actor threads insert trajectories of 64 steps of 28 KiB from pageable host memory
// into one device-storage buffer, each on its own stream, while a learner thread samples B = 256
// windows of 64 steps on its own stream; no lock of theirs (each actor keeps up to 4 inserts in
// flight on its stream, as each copy reference below keeps 4 buffers in flight). Reported as ratios
// measured in this run: the learner against its own solo rate, the actors together against a pinned
// host-to-device cudaMemcpy, and single-threaded sample_async at 256 B steps against itself
// before the buffer was ever used from a second stream (what thread safety costs one stream).
// References without a buffer say what the copy method alone allows: 8 threads copying their
// pageable trajectories through pinned memory (a CPU copy, as a landing insert does, then a copy
// to the GPU), straight from pageable memory (the driver stages it), and the first again while
// the learner samples (what the copies alone cost the learner, and it them); copies from pinned
// memory filled once (no CPU copy: what the copy engines and the bus give under the learner's
// load); and a CPU copy into pinned memory read by a kernel on a high-priority stream (zero-copy:
// whether loads issued by the multiprocessors fare better beside the learner than the copy
// engines do). Each of the last two alone, with the learner, and the learner beside it. Then an
// experiment without gear: a gather of the learner's shape written two ways (a block per row, as
// gear's; blocks that take 64 KiB chunks from a shared counter), each alone and beside zero-copy
// copies of 16 and of 2 blocks a copy, and those copies' rates: whether a gather that shares out
// its work as it goes would let loads from the multiprocessors carry the actors' bytes.
//
// With gpu-time, the learner records an event before and after each sample (alone, with the
// actors, beside the copy threads), and a table after the ratios says where its stream's time
// went; those events slow the learner a little, so its ratios are then not comparable with a run
// without it.
//
//   gear_contention [seconds per phase, default 2] [gpu-time]       exits 77 without a GPU

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <gear/gear.cuh>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::int64_t step_bytes = 28672, steps = 64, batch = 256, actors = 8;
using spec28 = gear::spec<gear::column<"obs", std::uint8_t, step_bytes>>;
using buffer28 = gear::replay_buffer<spec28, gear::storage::device>;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

struct stream {
  cudaStream_t s{};
  stream() { GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~stream() { (void)cudaStreamDestroy(s); }
};

/// Pinned host-to-device copy of 256 MiB, GB/s (best of 5).
double h2d_limit() {
  const std::size_t bytes = std::size_t{256} << 20;
  gear::detail::allocation h(gear::memory_kind::pinned_host, bytes),
      d(gear::memory_kind::device, bytes);
  std::memset(h.data(), 1, bytes);
  stream s;
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t = clock_type::now();
    GEAR_CUDA_TRY(cudaMemcpyAsync(d.data(), h.data(), bytes, cudaMemcpyHostToDevice, s.s));
    GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
    best = std::max(best, double(bytes) / seconds_since(t) / 1e9);
  }
  return best;
}

/// How a copy reference moves each trajectory to the GPU.
enum class method {
  staged,         ///< a CPU copy into pinned memory, then cudaMemcpyAsync from there (as a landing
                  ///< insert's placement does)
  driver,         ///< one cudaMemcpyAsync from the pageable memory (the driver stages it)
  pinned_only,    ///< cudaMemcpyAsync from pinned memory filled once: no CPU copy (the copy
                  ///< engines and the bus alone)
  staged_kernel,  ///< a CPU copy into pinned memory, then a kernel on a stream of the greatest
                  ///< priority reads it over the bus (zero-copy) and writes device memory: 16
                  ///< blocks of 256 threads a copy
  staged_narrow,  ///< the same with 2 blocks of 1024 threads a copy (half the bytes in flight, on 8
                  ///< times fewer multiprocessors)
};

/// Copies `bytes` from pinned (mapped) host memory into device memory with every thread of the
/// grid: gear's own copy loop (detail/copy.cuh), whose threads each keep
/// tuning::copy_vectors_per_thread loads in flight.
__global__ void zero_copy(const std::byte* from, std::byte* to, std::int64_t bytes) {
  gear::detail::group_copy(to, from, bytes, static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x),
                           static_cast<int>(gridDim.x * blockDim.x));
}

/// What 8 threads move from their own pageable trajectories into device memory, each on its own
/// stream, with no buffer, GB/s over `seconds`, by `how` (4 pinned buffers per thread in turn,
/// each reused once the copy from it has finished). With a callable `side`, runs it meanwhile (for
/// as long as it takes) instead of sleeping `seconds`.
template <class Side = int>
double copy_reference(method how, double seconds, std::size_t bytes, Side side = 0) {
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> copies{0};
  auto worker = [&] {
    int least = 0, greatest = 0;
    GEAR_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s{};
    const bool by_kernel = how == method::staged_kernel || how == method::staged_narrow;
    GEAR_CUDA_TRY(
        cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, by_kernel ? greatest : least));
    std::vector<std::uint8_t> mine(bytes, 3);
    gear::detail::allocation dst(gear::memory_kind::device, bytes);
    std::vector<gear::detail::allocation> pinned;
    std::vector<gear::detail::event> done;
    for (int i = 0; i < 4; ++i) {
      pinned.emplace_back(gear::memory_kind::pinned_host, bytes);
      std::memcpy(pinned.back().data(), mine.data(), bytes);
      done.push_back(gear::detail::event::make());
    }
    std::int64_t n = 0;
    while (!stop.load()) {
      const auto k = static_cast<std::size_t>(n % 4);
      if (how == method::driver) {
        GEAR_CUDA_TRY(cudaMemcpyAsync(dst.data(), mine.data(), bytes, cudaMemcpyHostToDevice, s));
        ++n;
        continue;
      }
      GEAR_CUDA_TRY(cudaEventSynchronize(done[k].get()));
      if (how != method::pinned_only) std::memcpy(pinned[k].data(), mine.data(), bytes);
      const auto length = static_cast<std::int64_t>(bytes);
      if (how == method::staged_kernel) {
        zero_copy<<<16, 256, 0, s>>>(pinned[k].device_data(), dst.data(), length);
        GEAR_CHECK_LAUNCH("zero_copy");
      } else if (how == method::staged_narrow) {
        zero_copy<<<2, 1024, 0, s>>>(pinned[k].device_data(), dst.data(), length);
        GEAR_CHECK_LAUNCH("zero_copy");
      } else {
        GEAR_CUDA_TRY(
            cudaMemcpyAsync(dst.data(), pinned[k].data(), bytes, cudaMemcpyHostToDevice, s));
      }
      GEAR_CUDA_TRY(cudaEventRecord(done[k].get(), s));
      ++n;
    }
    GEAR_CUDA_TRY(cudaStreamSynchronize(s));
    GEAR_CUDA_TRY(cudaStreamDestroy(s));
    copies += n;
  };
  const auto t = clock_type::now();
  std::vector<std::thread> pool;
  for (int a = 0; a < 8; ++a) pool.emplace_back(worker);
  if constexpr (std::is_invocable_v<Side>)
    side();
  else
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : pool) th.join();
  return double(copies.load()) * double(bytes) / seconds_since(t) / 1e9;
}

/// Row r of the batch from row rows[r] of the table, a block per row (as gear's gather copies rows
/// this long), with gear's block copy.
__global__ void rows_by_block(const std::byte* table, std::byte* out, const std::int64_t* rows,
                              std::int64_t row_bytes) {
  gear::detail::block_copy(out + blockIdx.x * row_bytes, table + rows[blockIdx.x] * row_bytes,
                           row_bytes);
}

/// The same rows, cut into chunks of `chunk_bytes` that each block takes from `counter` (0 when
/// the launch starts) until none is left: a block slowed by its multiprocessor's neighbours takes
/// fewer.
__global__ void rows_by_counter(const std::byte* table, std::byte* out, const std::int64_t* rows,
                                std::int64_t row_bytes, std::int64_t chunk_bytes,
                                std::int64_t chunks, unsigned long long* counter) {
  const std::int64_t per_row = (row_bytes + chunk_bytes - 1) / chunk_bytes;
  __shared__ unsigned long long taken;
  for (;;) {
    __syncthreads();  // every thread has read the last chunk's number
    if (threadIdx.x == 0) taken = atomicAdd(counter, 1ull);
    __syncthreads();
    const auto k = static_cast<std::int64_t>(taken);
    if (k >= chunks) return;
    const std::int64_t r = k / per_row, lo = k % per_row * chunk_bytes;
    gear::detail::block_copy(out + r * row_bytes + lo, table + rows[r] * row_bytes + lo,
                             gear::detail::min64(chunk_bytes, row_bytes - lo));
  }
}

/// An experiment beside the zero-copy references, without gear: a learner's gather of B = 256
/// rows of 64 steps of 28 KiB from a table of 2048 rows, copied a block per row or by blocks (4
/// per multiprocessor) that take 64 KiB chunks from a shared counter. Says whether a gather that
/// shares its work out as it goes keeps its rate beside zero-copy copies, as one whose blocks each
/// own a row does not.
class row_copies {
 public:
  row_copies()
      : table_(gear::memory_kind::device, table_rows * row_bytes),
        out_(gear::memory_kind::device, batch * row_bytes),
        rows_(gear::memory_kind::device, batch * sizeof(std::int64_t)),
        counters_(gear::memory_kind::device, per_sync * sizeof(unsigned long long)),
        grid_(4 * gear::detail::multiprocessors()) {
    std::vector<std::int64_t> rows(batch);
    std::uint64_t x = 12345;
    for (auto& r : rows) {  // a fixed pseudo-random draw of rows
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      r = static_cast<std::int64_t>((x >> 33) % table_rows);
    }
    GEAR_CUDA_TRY(cudaMemcpy(rows_.data(), rows.data(), rows_.size(), cudaMemcpyHostToDevice));
    for (std::size_t r = 0; r < table_rows; ++r)  // each row its own byte
      GEAR_CUDA_TRY(cudaMemsetAsync(table_.data() + r * row_bytes, byte_of(r), row_bytes, s_.s));
    // Each copy once, its batch checked every 4 KiB against the rows drawn.
    std::vector<std::uint8_t> got(out_.size());
    for (const bool by_counter : {false, true}) {
      GEAR_CUDA_TRY(cudaMemsetAsync(out_.data(), 0, out_.size(), s_.s));
      launch(by_counter, 0);
      GEAR_CUDA_TRY(
          cudaMemcpyAsync(got.data(), out_.data(), got.size(), cudaMemcpyDeviceToHost, s_.s));
      GEAR_CUDA_TRY(cudaStreamSynchronize(s_.s));
      std::size_t wrong = 0;
      for (std::size_t at = 0; at < got.size(); at += 4096)
        wrong += got[at] != byte_of(static_cast<std::size_t>(rows[at / row_bytes]));
      wrong += got.back() != byte_of(static_cast<std::size_t>(rows.back()));
      GEAR_REQUIRE(wrong == 0, gear::errc::cuda_error,
                   std::string("the row copy experiment copied wrong bytes (") +
                       (by_counter ? "by counter" : "a block per row") + ")");
    }
  }

  /// Batches per second over `seconds`, per_sync launches between synchronisations.
  double rate(bool by_counter, double seconds) {
    std::int64_t n = 0;
    const auto t = clock_type::now();
    while (seconds_since(t) < seconds) {
      for (int i = 0; i < per_sync; ++i) launch(by_counter, i);
      GEAR_CUDA_TRY(cudaStreamSynchronize(s_.s));
      n += per_sync;
    }
    return double(n) / seconds_since(t);
  }

 private:
  static std::uint8_t byte_of(std::size_t row) { return static_cast<std::uint8_t>(row * 7 + 1); }

  /// Enqueues one batch's copy; by counter, with counter `i` (all are cleared before the first).
  void launch(bool by_counter, int i) {
    const auto* rows = reinterpret_cast<const std::int64_t*>(rows_.data());
    auto* counters = reinterpret_cast<unsigned long long*>(counters_.data());
    constexpr auto row = static_cast<std::int64_t>(row_bytes);
    constexpr auto chunk = static_cast<std::int64_t>(chunk_bytes);
    if (!by_counter) {
      rows_by_block<<<batch, 256, 0, s_.s>>>(table_.data(), out_.data(), rows, row);
      GEAR_CHECK_LAUNCH("rows_by_block");
      return;
    }
    if (i == 0) GEAR_CUDA_TRY(cudaMemsetAsync(counters, 0, counters_.size(), s_.s));
    rows_by_counter<<<grid_, 256, 0, s_.s>>>(table_.data(), out_.data(), rows, row, chunk,
                                             batch * ((row + chunk - 1) / chunk), counters + i);
    GEAR_CHECK_LAUNCH("rows_by_counter");
  }

  static constexpr std::size_t table_rows = 2048, chunk_bytes = std::size_t{64} << 10;
  static constexpr std::size_t row_bytes = std::size_t{steps} * step_bytes;
  static constexpr int per_sync = 16;
  gear::detail::allocation table_, out_, rows_, counters_;
  int grid_ = 0;
  stream s_;
};

/// Where a learner's time goes on its stream (gear_contention's gpu-time mode), microseconds per
/// sample: between an event recorded before each sample_async and one after it (`in_sample`),
/// between one sample's end and the next one's start (`between`), and the wall time of each
/// synchronised batch less its GPU span (`host`: the stream waiting for the host).
struct gpu_time {
  double in_sample = 0, between = 0, host = 0;
};

/// Samples for `seconds` on the learner's stream; returns samples per second. With `host_us`,
/// also the host time of one sample_async call, microseconds on average; with `timed`, where the
/// time went on the stream (the events this records cost the stream a little: its rate is then
/// not comparable with untimed runs).
template <class Buffer>
double learn(Buffer& buf, cuda::stream_ref s, double seconds, std::int64_t window,
             std::atomic<bool>* stop = nullptr, double* host_us = nullptr,
             gpu_time* timed = nullptr) {
  auto out = buf.make_batch(gear::batch_size{batch}, gear::window_length{window});
  gear::rng g{1};
  const gear::window w{.length = window, .from = gear::anchor::random};
  buf.sample(out, w, g, s);
  constexpr int per_sync = 16;
  std::vector<cudaEvent_t> marks(timed != nullptr ? 2 * per_sync : 0);
  for (auto& e : marks) GEAR_CUDA_TRY(cudaEventCreate(&e));
  auto elapsed_us = [&](int from, int to) {
    float ms = 0;
    GEAR_CUDA_TRY(cudaEventElapsedTime(&ms, marks[from], marks[to]));
    return 1e3 * double(ms);
  };
  std::int64_t n = 0;
  double in_calls = 0, in_sample = 0, between = 0, batches = 0;
  const auto t = clock_type::now();
  while (seconds_since(t) < seconds) {
    const auto calls = clock_type::now();
    for (int i = 0; i < per_sync; ++i) {
      if (timed != nullptr) GEAR_CUDA_TRY(cudaEventRecord(marks[2 * i], s.get()));
      buf.sample_async(out, w, g, s);
      if (timed != nullptr) GEAR_CUDA_TRY(cudaEventRecord(marks[2 * i + 1], s.get()));
    }
    in_calls += seconds_since(calls);
    GEAR_CUDA_TRY(cudaStreamSynchronize(s.get()));
    n += per_sync;
    if (timed == nullptr) continue;
    batches += seconds_since(calls);
    for (int i = 0; i < per_sync; ++i) {
      in_sample += elapsed_us(2 * i, 2 * i + 1);
      if (i + 1 < per_sync) between += elapsed_us(2 * i + 1, 2 * i + 2);
    }
  }
  const double rate = double(n) / seconds_since(t);
  for (auto& e : marks) GEAR_CUDA_TRY(cudaEventDestroy(e));
  if (host_us != nullptr) *host_us = 1e6 * in_calls / double(n);
  if (timed != nullptr)
    *timed = {in_sample / double(n), between / double(n),
              (1e6 * batches - in_sample - between) / double(n)};
  if (stop != nullptr) stop->store(true);
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  double phase = 2.0;
  if (argc > 1) {
    char* end = nullptr;
    phase = std::strtod(argv[1], &end);
    if (end == argv[1] || *end != '\0' || !(phase >= 0.1 && phase <= 600) || argc > 3 ||
        (argc == 3 && std::strcmp(argv[2], "gpu-time") != 0)) {
      std::fprintf(stderr,
                   "gear_contention: bad arguments\nusage: gear_contention [seconds per phase, "
                   "0.1 to 600; default 2] [gpu-time]\n");
      return 2;
    }
  }
  const bool timing = argc > 2;
  if (!gear::detail::gpu_available()) {
    std::printf("gear_contention: no GPU; skipping\n");
    return 77;
  }
  gpu_time solo_time, with_time, copy_time;  // filled in gpu-time mode
  auto timed = [&](gpu_time& t) { return timing ? &t : nullptr; };
  auto progress = [](const char* what) { std::fprintf(stderr, "gear_contention: %s\n", what); };
  progress("measuring the pinned host-to-device copy");
  const double limit = h2d_limit();

  // Thread safety on one stream: 256 B steps, B = 256, windows of 64; timed per call on the host
  // and on the GPU (16 calls per sync), before and after a second stream has used the buffer.
  using spec256 = gear::spec<gear::column<"obs", std::uint8_t, 256>>;
  gear::replay_buffer<spec256, gear::storage::device> small{gear::capacity{4096},
                                                            gear::max_length{64}};
  {
    std::vector<std::uint8_t> data(std::size_t{4096} * 64 * 256, 7);
    std::vector<std::int64_t> lens(4096, 64);
    std::vector<gear::key> keys(4096);
    stream s;
    small.insert(gear::trajectories<spec256>{lens, {gear::input(data.data(), {256})}}, keys, s.s);
  }
  stream learner_stream, other;
  progress("one stream, then after a second stream");
  const double one_stream = learn(small, learner_stream.s, phase, 64);
  {  // a second stream touches the buffer once: from now on every call records its position
    auto out = small.make_batch(gear::batch_size{1}, gear::window_length{1});
    gear::rng g{2};
    small.sample(out, gear::window{.length = 1}, g, other.s);
  }
  const double two_streams = learn(small, learner_stream.s, phase, 64);

  // Actors and a learner.
  const std::int64_t capacity = 2048;
  buffer28 buf{gear::capacity{capacity}, gear::max_length{steps}};
  std::vector<std::uint8_t> traj(std::size_t{steps} * step_bytes);
  for (std::size_t i = 0; i < traj.size(); ++i) traj[i] = static_cast<std::uint8_t>(i * 131);
  const std::int64_t len[] = {steps};
  const gear::trajectories<spec28> one{len, {gear::input(traj.data(), {step_bytes})}};
  {
    stream s;
    gear::key k{};
    for (std::int64_t i = 0; i < capacity; ++i)
      buf.insert_async(one, std::span<gear::key>(&k, 1), s.s);
    GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
  }
  progress("learner alone");
  double solo_host_us = 0, with_host_us = 0;
  const double solo =
      learn(buf, learner_stream.s, phase, steps, nullptr, &solo_host_us, timed(solo_time));
  progress("warm-up, actors alone, then actors with the learner");

  auto act = [&](std::atomic<bool>& stop, std::atomic<std::int64_t>& inserted) {
    stream s;
    std::vector<std::uint8_t> mine(traj);  // each actor its own pageable trajectory
    const gear::trajectories<spec28> in{len, {gear::input(mine.data(), {step_bytes})}};
    gear::key k{};
    // Up to 4 inserts in flight on the actor's stream, as the copy references keep 4 buffers in
    // flight per thread: before its fifth, an actor waits for its first to finish.
    std::vector<gear::detail::event> done;
    for (int i = 0; i < 4; ++i) done.push_back(gear::detail::event::make());
    std::int64_t n = 0;
    while (!stop.load()) {
      const auto at = static_cast<std::size_t>(n % 4);
      if (n >= 4) GEAR_CUDA_TRY(cudaEventSynchronize(done[at].get()));
      buf.insert_async(in, std::span<gear::key>(&k, 1), s.s);
      GEAR_CUDA_TRY(cudaEventRecord(done[at].get(), s.s));
      ++n;
    }
    GEAR_CUDA_TRY(cudaStreamSynchronize(s.s));
    inserted += n;
  };

  // A warm-up with both (untimed: the staging grows to what this load keeps in flight), then
  // actors alone, then actors with the learner.
  double actors_alone = 0, actors_with = 0, learner_with = 0;
  for (int round = 0; round < 3; ++round) {
    const bool with_learner = round != 1;
    std::atomic<bool> stop{false};
    std::atomic<std::int64_t> inserted{0};
    const auto t = clock_type::now();
    std::vector<std::thread> pool;
    for (int a = 0; a < actors; ++a) pool.emplace_back(act, std::ref(stop), std::ref(inserted));
    if (with_learner) {
      learner_with =
          learn(buf, learner_stream.s, phase, steps, &stop, &with_host_us, timed(with_time));
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(phase));
      stop = true;
    }
    for (auto& th : pool) th.join();
    const double gbps = double(inserted.load()) * steps * step_bytes / seconds_since(t) / 1e9;
    if (round > 0) (with_learner ? actors_with : actors_alone) = gbps;
  }

  progress("references: 8 threads copying pageable trajectories to the GPU, no buffer");
  const std::size_t traj_bytes = std::size_t{steps} * step_bytes;
  const double copy_staged = copy_reference(method::staged, phase, traj_bytes);
  const double copy_driver = copy_reference(method::driver, phase, traj_bytes);
  // Each method again while the learner samples, with the learner's rate beside it.
  auto with_learner = [&](method how, double& learner_rate, gpu_time* t = nullptr) {
    return copy_reference(how, phase, traj_bytes, [&] {
      learner_rate = learn(buf, learner_stream.s, phase, steps, nullptr, nullptr, t);
    });
  };
  double learner_copy = 0, learner_pinned = 0, learner_kernel = 0;
  const double copy_with_learner = with_learner(method::staged, learner_copy, timed(copy_time));
  progress("references: from pinned memory alone (no CPU copy), and through a zero-copy kernel");
  const double copy_pinned = copy_reference(method::pinned_only, phase, traj_bytes);
  const double copy_pinned_with_learner = with_learner(method::pinned_only, learner_pinned);
  const double copy_kernel = copy_reference(method::staged_kernel, phase, traj_bytes);
  const double copy_kernel_with_learner = with_learner(method::staged_kernel, learner_kernel);
  progress(
      "an experiment without gear: rows copied a block per row or by chunks from a counter, "
      "beside zero-copy copies");
  row_copies rc;
  const double by_block = rc.rate(false, phase), by_counter = rc.rate(true, phase);
  // A zero-copy method's GB/s with a row copy (by counter or not) running meanwhile; its rate.
  auto beside = [&](method how, bool counter, double& rate) {
    return copy_reference(how, phase, traj_bytes, [&] { rate = rc.rate(counter, phase); });
  };
  double block_wide = 0, counter_wide = 0, block_narrow = 0, counter_narrow = 0;
  (void)beside(method::staged_kernel, false, block_wide);
  const double wide_by_counter = beside(method::staged_kernel, true, counter_wide);
  const double copy_narrow = copy_reference(method::staged_narrow, phase, traj_bytes);
  (void)beside(method::staged_narrow, false, block_narrow);
  const double narrow_by_counter = beside(method::staged_narrow, true, counter_narrow);

  std::printf("%-58s %12s %14s %8s %8s\n", "operation", "figure", "reference", "ratio", "target");
  // One line: a rate (per second) or a bandwidth (GB/s) against its reference.
  auto row = [](const char* what, double figure, double reference, bool bandwidth,
                const char* target = "") {
    if (bandwidth)
      std::printf("%-58s %6.1f GB/s %8.1f GB/s %7.1f%% %8s\n", what, figure, reference,
                  100 * figure / reference, target);
    else
      std::printf("%-58s %9.1f /s %11.1f /s %7.1f%% %8s\n", what, figure, reference,
                  100 * figure / reference, target);
  };
  row("sample_async 256 B steps B=256 w=64, after a 2nd stream", two_streams, one_stream, false,
      ">= 95%");
  row("learner B=256 w=64 28 KiB, with 8 actors", learner_with, solo, false, ">= 90%");
  row("8 actors inserting 28 KiB steps, with learner", actors_with, limit, true, ">= 80%");
  row("8 threads: CPU copy to pinned, then H2D (no buffer)", copy_staged, limit, true);
  row("8 threads: H2D from pageable, driver-staged (no buffer)", copy_driver, limit, true);
  row("learner, 8 threads copying as above (no buffer)", learner_copy, solo, false);
  row("8 threads copying as above, with the learner", copy_with_learner, limit, true);
  row("8 threads: H2D from pinned, no CPU copy (no buffer)", copy_pinned, limit, true);
  row("8 threads copying from pinned, with the learner", copy_pinned_with_learner, limit, true);
  row("learner, 8 threads copying from pinned", learner_pinned, solo, false);
  row("8 threads: CPU copy to pinned, zero-copy kernel reads it", copy_kernel, limit, true);
  row("8 threads copying by zero-copy kernel, with the learner", copy_kernel_with_learner, limit,
      true);
  row("learner, 8 threads copying by zero-copy kernel", learner_kernel, solo, false);
  row("rows a block per row (no gear), alone; against the learner", by_block, solo, false);
  row("rows by 64 KiB chunks from a counter, alone", by_counter, by_block, false);
  row("a block per row, beside zero-copy copies", block_wide, by_block, false);
  row("chunks from a counter, beside zero-copy copies", counter_wide, by_counter, false);
  row("zero-copy copies, beside the chunks from a counter", wide_by_counter, limit, true);
  row("8 threads: zero-copy kernel of 2 blocks a copy, alone", copy_narrow, limit, true);
  row("a block per row, beside 2-block zero-copy copies", block_narrow, by_block, false);
  row("chunks from a counter, beside 2-block zero-copy copies", counter_narrow, by_counter, false);
  row("2-block zero-copy copies, beside the chunks", narrow_by_counter, limit, true);
  row("8 actors inserting 28 KiB steps, alone", actors_alone, limit, true);
  std::printf("%-58s %9.1f us %11.1f us\n",
              "learner's host time per sample_async, with actors / alone", with_host_us,
              solo_host_us);
  if (timing) {
    std::printf(
        "\nthe learner's stream, us per sample      in sample_async   between samples"
        "   waiting for the host\n");
    auto line = [](const char* what, const gpu_time& t) {
      std::printf("%-40s %15.1f %17.1f %22.1f\n", what, t.in_sample, t.between, t.host);
    };
    line("alone", solo_time);
    line("with 8 actors", with_time);
    line("beside 8 threads copying (no buffer)", copy_time);
  }
  return 0;
}
