// gear's benchmark suite (Google Benchmark). See bench/README.md for how to run it and what the
// figures mean.
//
// Every GPU figure is timed with CUDA events after a warm-up and reported as the median over the
// timed iterations, next to a limit measured in the same process right before it (D2D copy,
// pinned H2D copy, multi-threaded host memcpy) and the ratio of the two. Tables are filled with a
// known pattern (never zeros) far larger than the 60 MB L2, and every benchmark checks its output
// once against that pattern before timing; a wrong result fails the run.
//
// The pattern: byte b of step t of the trajectory in slot s is pattern_byte(s, t, b). Its first 8
// bytes hold (s << 32 | t), so a gathered row says which slot and window it came from.
//
// Without a GPU only the host/... benchmarks are registered (the CI smoke test runs them). The P6
// capacity benchmarks (capacity/..., tens of GiB) run last, so that a failure there cannot cost the
// figures of the others; they skip with a message where the machine lacks the memory.

#include <benchmark/benchmark.h>
#include <thrust/binary_search.h>
#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/scan.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <gear/gear.cuh>
#include <gear/rank_sampler.hpp>
#include <gear/sharded_buffer.hpp>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <vector>

namespace {

constexpr std::int64_t trajectory_steps = 1000;
constexpr std::int64_t window_steps = 64;
constexpr std::int64_t gib = std::int64_t{1} << 30;
constexpr std::int64_t mib = std::int64_t{1} << 20;
/// Bytes of the sampled tables: both far above the 60 MB L2.
constexpr std::int64_t device_table_bytes = 4 * gib;
constexpr std::int64_t pinned_table_bytes = 2 * gib;
/// Bytes each limit copy moves.
constexpr std::int64_t limit_bytes = 1 * gib;
/// Seconds of timed work per benchmark (GPU); the host smoke benchmarks use less.
constexpr double gpu_min_time = 0.2;

bool g_failed = false;
/// Name of the running benchmark (this version of Google Benchmark's State does not carry it).
std::string g_name;

template <std::int64_t StepBytes>
using step_spec = gear::spec<gear::column<"obs", std::uint8_t, StepBytes>>;

// ---- the fill pattern -------------------------------------------------------------------------

__host__ __device__ inline std::uint8_t pattern_byte(std::int64_t slot, std::int64_t step,
                                                     std::int64_t b) {
  if (b < 8) {
    const auto header = (static_cast<std::uint64_t>(slot) << 32) | static_cast<std::uint64_t>(step);
    return static_cast<std::uint8_t>(header >> (8 * b));
  }
  // slot * 251 + step * 13 + b * 7 + (b >> 8) * 3 + 1, modulo 256: 32-bit arithmetic suffices.
  return static_cast<std::uint8_t>(
      static_cast<std::uint32_t>(slot) * 251u + static_cast<std::uint32_t>(step) * 13u +
      static_cast<std::uint32_t>(b) * 7u + static_cast<std::uint32_t>(b >> 8) * 3u + 1u);
}

/// Fills `count` packed trajectories of trajectory_steps steps for slots first_slot, ...: one
/// warp per step, 4-byte words (step_bytes is a multiple of 4, `out` 4-byte aligned).
__global__ void fill_kernel(std::uint8_t* out, std::int64_t first_slot, std::int64_t count,
                            std::int64_t step_bytes) {
  constexpr std::int64_t steps = trajectory_steps;
  const std::int64_t warps = std::int64_t{gridDim.x} * (blockDim.x / 32);
  const std::int64_t total = count * steps, words = step_bytes / 4;
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (std::int64_t s = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) / 32; s < total;
       s += warps) {
    const std::int64_t slot = first_slot + s / steps, step = s % steps;
    auto* p = reinterpret_cast<std::uint32_t*>(out + s * step_bytes);
    for (std::int64_t w = lane; w < words; w += 32) {
      std::uint32_t v = 0;
      for (int k = 0; k < 4; ++k)
        v |= std::uint32_t{pattern_byte(slot, step, 4 * w + k)} << (8 * k);
      p[w] = v;
    }
  }
}

/// fill_kernel on `stream`.
void fill_device(std::uint8_t* out, std::int64_t first_slot, std::int64_t count,
                 std::int64_t step_bytes, cudaStream_t stream) {
  fill_kernel<<<2048, 256, 0, stream>>>(out, first_slot, count, step_bytes);
  GEAR_CHECK_LAUNCH("fill_kernel");
}

template <class F>
void parallel_for(std::int64_t n, F f) {
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([=] {
      for (std::int64_t i = t * n / threads; i < (t + 1) * n / threads; ++i) f(i);
    });
  for (auto& th : pool) th.join();
}

void fill_host(std::uint8_t* out, std::int64_t first_slot, std::int64_t count,
               std::int64_t step_bytes) {
  parallel_for(count * trajectory_steps, [=](std::int64_t s) {
    std::uint8_t* p = out + s * step_bytes;
    for (std::int64_t b = 0; b < step_bytes; ++b)
      p[b] = pattern_byte(first_slot + s / trajectory_steps, s % trajectory_steps, b);
  });
}

// ---- small helpers ----------------------------------------------------------------------------

void fail(benchmark::State& state, const std::string& what) {
  g_failed = true;
  std::fprintf(stderr, "VERIFICATION FAILED: %s: %s\n", g_name.c_str(), what.c_str());
  state.SkipWithError(what.c_str());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// A CUDA stream and two timing events.
struct gpu_clock {
  cudaStream_t stream{};
  cudaEvent_t start{}, stop{};
  gpu_clock() {
    GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    GEAR_CUDA_TRY(cudaEventCreate(&start));
    GEAR_CUDA_TRY(cudaEventCreate(&stop));
  }
  ~gpu_clock() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    (void)cudaStreamDestroy(stream);
  }
  gpu_clock(const gpu_clock&) = delete;
  gpu_clock& operator=(const gpu_clock&) = delete;
  void begin() { GEAR_CUDA_TRY(cudaEventRecord(start, stream)); }
  /// Seconds since begin(), after waiting for the stream.
  double end() {
    GEAR_CUDA_TRY(cudaEventRecord(stop, stream));
    GEAR_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0;
    GEAR_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1e-3;
  }
};

gpu_clock& clock_() {
  static gpu_clock c;
  return c;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Times `body` (GPU work on the clock's stream, `reps` times per iteration) until Google
/// Benchmark has enough; returns the median seconds of one body call.
template <class Body>
double time_gpu(benchmark::State& state, int reps, Body body) {
  auto& c = clock_();
  for (int i = 0; i < 2; ++i) body();  // warm-up
  GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
  std::vector<double> per_call;
  for (auto _ : state) {
    c.begin();
    for (int r = 0; r < reps; ++r) body();
    const double s = c.end();
    state.SetIterationTime(s);
    per_call.push_back(s / reps);
  }
  return median(per_call);
}

/// Repetitions per timed iteration so that one iteration moves about 2 ms of work.
int reps_for(double seconds_per_call) {
  return static_cast<int>(std::clamp(2e-3 / std::max(seconds_per_call, 1e-9), 1.0, 200.0));
}

// ---- the final table --------------------------------------------------------------------------

struct table_row {
  std::string operation;  // "": the running benchmark's name
  double figure = 0;      // in `unit`
  std::string limit_name;
  double limit = 0;  // in `unit`, 0 if none
  std::string target;
  double target_ratio = 0;    // 0: no target
  std::string unit = "GB/s";  // GB/s rows also become the GBps / limit_GBps counters
  std::string met;            // "": from the ratio and target_ratio
  std::string note;           // printed last
  bool has_figure = true;     // false: a skipped benchmark (the note says why)
  bool counters = true;       // false: a second row of the same benchmark, in the table only

  table_row() = default;
  table_row(std::string operation_, double figure_, std::string limit_name_, double limit_,
            std::string target_, double target_ratio_)
      : operation(std::move(operation_)),
        figure(figure_),
        limit_name(std::move(limit_name_)),
        limit(limit_),
        target(std::move(target_)),
        target_ratio(target_ratio_) {}
};
std::vector<table_row> g_rows;

void record(benchmark::State& state, table_row row) {
  const double ratio = row.limit > 0 ? row.figure / row.limit : 0;
  if (row.counters) {
    if (row.has_figure && row.unit == "GB/s") {
      state.counters["GBps"] = row.figure;
      if (row.limit > 0) state.counters["limit_GBps"] = row.limit;
    }
    if (row.has_figure && row.limit > 0) state.counters["ratio"] = ratio;
    if (row.target_ratio > 0) {
      state.counters["target"] = row.target_ratio;
      state.counters["met"] = ratio >= row.target_ratio ? 1 : 0;
    }
  }
  if (row.operation.empty()) row.operation = g_name;
  // Google Benchmark runs a benchmark several times while it sizes the iteration count; the
  // table keeps the last run, the one it reports.
  for (auto& r : g_rows)
    if (r.operation == row.operation) {
      r = std::move(row);
      return;
    }
  g_rows.push_back(std::move(row));
}

void print_table() {
  if (g_rows.empty()) return;
  std::printf("\n%-70s %10s %-7s  %-22s %10s %7s  %-14s %-4s %s\n", "operation", "figure", "unit",
              "limit / baseline", "value", "ratio", "target", "met", "note");
  for (const auto& r : g_rows) {
    const double ratio = r.limit > 0 ? r.figure / r.limit : 0;
    char fig[32] = "-", lim[32] = "-", rat[16] = "-";
    if (r.has_figure) std::snprintf(fig, sizeof fig, "%.1f", r.figure);
    if (r.has_figure && r.limit > 0) {
      std::snprintf(lim, sizeof lim, "%.1f", r.limit);
      std::snprintf(rat, sizeof rat, "%.0f%%", 100 * ratio);
    }
    const char* met = !r.met.empty()            ? r.met.c_str()
                      : r.target_ratio <= 0     ? "-"
                      : ratio >= r.target_ratio ? "yes"
                                                : "NO";
    std::printf("%-70s %10s %-7s  %-22s %10s %7s  %-14s %-4s %s\n", r.operation.c_str(), fig,
                r.unit.c_str(), r.limit_name.empty() ? "-" : r.limit_name.c_str(), lim, rat,
                r.target.empty() ? "-" : r.target.c_str(), met, r.note.c_str());
  }
}

// ---- limits, measured in the same process -----------------------------------------------------

struct limit_buffers {
  gear::detail::allocation dev_a{gear::memory_kind::device, limit_bytes};
  gear::detail::allocation dev_b{gear::memory_kind::device, limit_bytes};
  gear::detail::allocation pinned{gear::memory_kind::pinned_host, limit_bytes};
  std::vector<std::uint8_t> pageable = std::vector<std::uint8_t>(limit_bytes);
  limit_buffers() {
    fill_device(dev_a.as<std::uint8_t>(), 0, limit_bytes / (trajectory_steps * 1024), 1024,
                clock_().stream);
    fill_host(pinned.as<std::uint8_t>(), 0, limit_bytes / (trajectory_steps * 1024), 1024);
    fill_host(pageable.data(), 0, limit_bytes / (trajectory_steps * 1024), 1024);
    GEAR_CUDA_TRY(cudaStreamSynchronize(clock_().stream));
  }
};
limit_buffers& limits() {
  static limit_buffers l;
  return l;
}

/// Median of `reps` timed GPU copies, in seconds.
double time_copy(void* dst, const void* src, std::int64_t bytes, cudaMemcpyKind kind,
                 int reps = 5) {
  auto& c = clock_();
  std::vector<double> t;
  for (int i = 0; i < reps + 1; ++i) {
    c.begin();
    GEAR_CUDA_TRY(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(bytes), kind, c.stream));
    const double s = c.end();
    if (i > 0) t.push_back(s);  // the first is warm-up
  }
  return median(t);
}

/// Back-to-back cudaMemcpyAsync calls of `bytes` each (at most limit_bytes / 4), device to device
/// (`device`: bytes read + written per second) or pinned host to device (bytes copied per
/// second), in GB/s, timed like gear's calls. Successive copies walk through the 1 GiB limit
/// buffers, so none is served from L2. What one call of that size can reach, launch and all: the
/// reference for small gathers. `us_per_call`, if given, receives one copy's time.
double same_size_copy(std::int64_t bytes, bool device, double* us_per_call = nullptr) {
  // Measured once per size and kind: Google Benchmark runs a benchmark several times while it
  // sizes the iteration count.
  static std::map<std::pair<std::int64_t, bool>, std::pair<double, double>> known;
  if (const auto it = known.find({bytes, device}); it != known.end()) {
    if (us_per_call != nullptr) *us_per_call = it->second.second;
    return it->second.first;
  }
  auto& l = limits();
  auto& c = clock_();
  const std::int64_t positions = limit_bytes / bytes;
  const double counted = device ? 2.0 * bytes : 1.0 * bytes;
  const int reps = reps_for(counted / (device ? 4e12 : 5e10));
  const std::byte* from = device ? l.dev_a.data() : l.pinned.data();
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    c.begin();
    for (int r = 0; r < reps; ++r) {
      const std::int64_t at = (std::int64_t{i} * reps + r) % positions * bytes;
      GEAR_CUDA_TRY(cudaMemcpyAsync(l.dev_b.data() + at, from + at, static_cast<std::size_t>(bytes),
                                    device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                                    c.stream));
    }
    const double sec = c.end();
    if (i > 0) t.push_back(sec / reps);  // the first is warm-up
  }
  known[{bytes, device}] = {counted / median(t) / 1e9, median(t) * 1e6};
  if (us_per_call != nullptr) *us_per_call = median(t) * 1e6;
  return counted / median(t) / 1e9;
}

/// Device-to-device cudaMemcpy, bytes read + written per second, in GB/s.
double d2d_limit() {
  auto& l = limits();
  return 2.0 * limit_bytes /
         time_copy(l.dev_b.data(), l.dev_a.data(), limit_bytes, cudaMemcpyDeviceToDevice) / 1e9;
}
/// Pinned host-to-device cudaMemcpy, GB/s.
double h2d_limit() {
  auto& l = limits();
  return double(limit_bytes) /
         time_copy(l.dev_b.data(), l.pinned.data(), limit_bytes, cudaMemcpyHostToDevice) / 1e9;
}
/// memcpy of `bytes` from pageable to pinned memory with up to 16 threads, GB/s (median of 3).
double memcpy_mt_limit(std::int64_t bytes) {
  auto& l = limits();
  bytes = std::min(bytes, limit_bytes);
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  std::vector<double> t;
  for (int rep = 0; rep < 4; ++rep) {
    const double t0 = wall_seconds();
    parallel_for(threads, [&](std::int64_t i) {
      const std::int64_t lo = i * bytes / threads, hi = (i + 1) * bytes / threads;
      std::memcpy(l.pinned.data() + lo, l.pageable.data() + lo, static_cast<std::size_t>(hi - lo));
    });
    if (rep > 0) t.push_back(wall_seconds() - t0);
  }
  return double(bytes) / median(t) / 1e9;
}

void bm_limit_d2d(benchmark::State& state) {
  for (auto _ : state) state.SetIterationTime(2.0 * limit_bytes / (d2d_limit() * 1e9));
  record(state, {"", d2d_limit(), "", 0, "", 0});
}
void bm_limit_h2d(benchmark::State& state) {
  for (auto _ : state) state.SetIterationTime(limit_bytes / (h2d_limit() * 1e9));
  record(state, {"", h2d_limit(), "", 0, "", 0});
}
void bm_limit_memcpy(benchmark::State& state) {
  double gbps = 0;
  for (auto _ : state) {
    gbps = memcpy_mt_limit(256 * mib);
    state.SetIterationTime(256.0 * mib / (gbps * 1e9));
  }
  record(state, {"", gbps, "", 0, "", 0});
}

// ---- the sampled tables -----------------------------------------------------------------------

/// A table of StepBytes steps filled with the pattern, in Storage; one alive at a time.
struct table_base {
  virtual ~table_base() = default;
};
std::unique_ptr<table_base> g_table;
std::string g_table_name;

template <std::int64_t StepBytes, class Storage>
struct sampled_table : table_base {
  using buffer_type = gear::replay_buffer<step_spec<StepBytes>, Storage>;
  static constexpr std::int64_t trajectory_bytes = StepBytes * trajectory_steps;
  static constexpr std::int64_t slots =
      (std::is_same_v<Storage, gear::storage::device> ? device_table_bytes : pinned_table_bytes) /
      trajectory_bytes;
  buffer_type buf{gear::capacity{slots}, gear::max_length{trajectory_steps}};

  sampled_table() {
    // Fill through insert from device memory, in chunks of at most 256 MiB, slot i = ticket i.
    const std::int64_t chunk = std::clamp<std::int64_t>(256 * mib / trajectory_bytes, 1, slots);
    gear::detail::allocation staging(gear::memory_kind::device,
                                     static_cast<std::size_t>(chunk * trajectory_bytes));
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(chunk), trajectory_steps);
    std::vector<gear::key> keys(static_cast<std::size_t>(chunk));
    auto& c = clock_();
    for (std::int64_t first = 0; first < slots; first += chunk) {
      const std::int64_t n = std::min(chunk, slots - first);
      fill_device(staging.as<std::uint8_t>(), first, n, StepBytes, c.stream);
      buf.insert({std::span<const std::int64_t>(lengths.data(), static_cast<std::size_t>(n)),
                  {gear::input(staging.as<const std::uint8_t>(), {StepBytes})},
                  gear::memory_kind::device},
                 keys, c.stream);
    }
  }

  static sampled_table& get() {
    const std::string name = std::to_string(StepBytes) + typeid(Storage).name();
    if (g_table_name != name) {
      g_table.reset();  // free the previous table first
      g_table_name.clear();
      g_table = std::make_unique<sampled_table>();
      g_table_name = name;
    }
    return static_cast<sampled_table&>(*g_table);
  }
};

/// Frees the cached sampled table (benchmarks that need the memory call it first).
void release_cached_tables() {
  g_table.reset();
  g_table_name.clear();
}

/// Checks rows of a gathered [B, L, step_bytes] batch (host copy, L = `length`) against the
/// pattern: each row is L consecutive steps of the slot its key (if given) names. The tables are
/// filled once, so slot i holds ticket i. Returns "" or what is wrong.
std::string check_rows(const std::uint8_t* rows, std::int64_t batch, std::int64_t step_bytes,
                       std::int64_t length, const gear::key* keys, const std::uint8_t* mask,
                       std::int64_t max_slot, std::int64_t first_row = 0,
                       std::int64_t row_stride = 1) {
  const std::int64_t row_bytes = length * step_bytes;
  for (std::int64_t r = first_row; r < batch; r += row_stride) {
    const std::uint8_t* row = rows + r * row_bytes;
    std::uint64_t header = 0;
    std::memcpy(&header, row, 8);
    const auto slot = static_cast<std::int64_t>(header >> 32);
    const auto start = static_cast<std::int64_t>(header & 0xFFFFFFFFu);
    if (slot >= max_slot || start > trajectory_steps - length)
      return "row " + std::to_string(r) + ": header names slot " + std::to_string(slot) + " step " +
             std::to_string(start);
    if (keys != nullptr && keys[r].ticket != static_cast<std::uint64_t>(slot))
      return "row " + std::to_string(r) + ": key ticket " + std::to_string(keys[r].ticket) +
             ", data of slot " + std::to_string(slot);
    for (std::int64_t t = 0; t < length; ++t) {
      if (mask != nullptr && mask[r * length + t] != 1)
        return "row " + std::to_string(r) + ": mask is not 1 at " + std::to_string(t);
      for (std::int64_t b = 0; b < step_bytes; ++b)
        if (row[t * step_bytes + b] != pattern_byte(slot, start + t, b))
          return "row " + std::to_string(r) + " step " + std::to_string(t) + " byte " +
                 std::to_string(b) + " differs from the pattern";
    }
  }
  return "";
}

/// Copies rows of a device batch (and their keys and mask) back and checks them: rows 0, B/2
/// and B-1, or with row_stride > 0 rows 0, row_stride, 2 row_stride, ... and B-1.
template <class Batch>
std::string check_device_batch(const Batch& out, const std::uint8_t* data, std::int64_t step_bytes,
                               std::int64_t max_slot, std::int64_t row_stride = 0) {
  const std::int64_t b = out.batch_size(), length = out.window_length();
  const std::int64_t row_bytes = length * step_bytes;
  std::vector<gear::key> keys(static_cast<std::size_t>(b));
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(b * length));
  GEAR_CUDA_TRY(cudaMemcpy(keys.data(), out.keys().data(), keys.size() * sizeof(gear::key),
                           cudaMemcpyDeviceToHost));
  GEAR_CUDA_TRY(
      cudaMemcpy(mask.data(), out.mask().data_handle(), mask.size(), cudaMemcpyDeviceToHost));
  std::vector<std::int64_t> rows{0, b / 2};
  if (row_stride > 0) {
    rows.clear();
    for (std::int64_t r = 0; r < b; r += row_stride) rows.push_back(r);
  }
  rows.push_back(b - 1);
  std::vector<std::uint8_t> row(static_cast<std::size_t>(row_bytes));
  for (std::int64_t r : rows) {
    GEAR_CUDA_TRY(cudaMemcpy(row.data(), data + r * row_bytes, row.size(), cudaMemcpyDeviceToHost));
    std::string e = check_rows(row.data(), 1, step_bytes, length, keys.data() + r,
                               mask.data() + r * length, max_slot);
    if (!e.empty()) return "row " + std::to_string(r) + ": " + e;
  }
  return "";
}

const char* storage_name(gear::storage::device) { return "device"; }
const char* storage_name(gear::storage::pinned_host) { return "pinned_host"; }

__global__ void empty_kernel() {}

/// GPU time of one empty kernel launched back to back with others (us, median of 5 runs of 1000
/// launches), measured once: the floor under any launch, beside the small gathers' figures.
double empty_launch_us() {
  static const double us = [] {
    auto& c = clock_();
    std::vector<double> t;
    for (int i = 0; i < 6; ++i) {
      c.begin();
      for (int r = 0; r < 1000; ++r) empty_kernel<<<1, 32, 0, c.stream>>>();
      GEAR_CHECK_LAUNCH("empty_kernel");
      const double sec = c.end();
      if (i > 0) t.push_back(sec / 1000);
    }
    return median(t) * 1e6;
  }();
  return us;
}

/// Host time of enqueueing one empty kernel (us, median of 9 rounds of 40 launches, each round
/// timed on the host from its first launch's start to its last's return, the stream synchronised
/// between rounds), measured once: the floor under any call that launches, beside P7's rows.
double empty_launch_host_us() {
  static const double us = [] {
    auto& c = clock_();
    std::vector<double> t;
    for (int round = 0; round < 10; ++round) {
      const double t0 = wall_seconds();
      for (int i = 0; i < 40; ++i) empty_kernel<<<1, 32, 0, c.stream>>>();
      const double sec = wall_seconds() - t0;
      GEAR_CHECK_LAUNCH("empty_kernel");
      GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
      if (round > 0) t.push_back(sec / 40);
    }
    return median(t) * 1e6;
  }();
  return us;
}

/// What bm_sample and bm_naive_gather share: the cached table, the limit measured right before
/// the benchmark, and a [batch, length] batch of windows at random offsets, sampled once.
template <std::int64_t StepBytes, class Storage>
struct sample_setup {
  static constexpr bool device = std::is_same_v<Storage, gear::storage::device>;
  using table_type = sampled_table<StepBytes, Storage>;

  table_type& t = table_type::get();
  const double limit = device ? d2d_limit() : h2d_limit();
  const gear::window w;
  typename table_type::buffer_type::batch_type out;
  gear::rng g;
  gpu_clock& c = clock_();

  sample_setup(std::int64_t batch, std::int64_t length, std::uint64_t seed)
      : w{.length = length, .offset = 0, .from = gear::anchor::random},
        out(t.buf.make_batch(gear::batch_size{batch}, gear::window_length{length})),
        g(seed) {
    t.buf.sample(out, w, g, c.stream);
  }

  [[nodiscard]] std::int64_t batch() const { return out.batch_size(); }
  [[nodiscard]] std::int64_t row_bytes() const { return w.length * StepBytes; }
  /// The gathered rows (device memory).
  [[nodiscard]] const std::uint8_t* data() const {
    return reinterpret_cast<const std::uint8_t*>(out.template column<0>().data_handle());
  }
  /// Bytes one gather moves, as the limit counts them: read + written for device storage,
  /// read over PCIe for pinned host storage.
  [[nodiscard]] double moved() const {
    const double gathered = double(batch()) * row_bytes();
    return device ? 2 * gathered : gathered;
  }
  static const char* limit_name() { return device ? "D2D copy (r+w)" : "H2D pinned copy"; }
};

/// gear's sample_async (selection + fused gather) into a [batch, length] window batch; with
/// `targeted`, held against the PERF.md target of its step size.
template <std::int64_t StepBytes, class Storage>
void bm_sample(benchmark::State& state, std::int64_t length, bool targeted) {
  sample_setup<StepBytes, Storage> s(state.range(0), length, 2026);
  if (auto e = check_device_batch(s.out, s.data(), StepBytes, s.t.slots); !e.empty())
    return fail(state, e);
  const int reps = reps_for(s.moved() / (s.limit * 1e9));
  const double sec =
      time_gpu(state, reps, [&] { s.t.buf.sample_async(s.out, s.w, s.g, s.c.stream); });
  state.counters["us_per_sample"] = sec * 1e6;
  // Issue 13's P1 / P2: >= 90% of a copy of the same bytes per call (D2D for device storage,
  // pinned H2D for pinned host), the peak copy for gathers too large to copy apart; P1s: 256 B
  // steps at B = 256 >= 75% of the peak D2D copy, in a second row.
  const double figure = s.moved() / sec / 1e9;
  const std::int64_t gathered = s.batch() * s.row_bytes();
  table_row row{"", figure, s.limit_name(), s.limit, "", 0};
  if (targeted) {
    row.target = s.device ? "P1 >= 90%" : "P2 >= 90%";
    row.target_ratio = 0.90;
  }
  if (gathered <= limit_bytes / 4) {
    double copy_us = 0;
    const double same = same_size_copy(gathered, s.device, &copy_us);
    state.counters["same_size_copy_GBps"] = same;
    row.limit_name = s.device ? "same-size D2D copy" : "same-size H2D copy";
    row.limit = same;
    char note[160];
    std::snprintf(note, sizeof note,
                  "%.0f%% of the peak copy; per call: %.1f us, the copy %.1f us, an empty "
                  "launch %.1f us",
                  100 * figure / s.limit, sec * 1e6, copy_us, empty_launch_us());
    row.note = note;
  }
  record(state, row);
  if (targeted && s.device && StepBytes == 256 && s.batch() == 256) {
    table_row peak{g_name + "/against_peak", figure, s.limit_name(), s.limit, "P1s >= 75%", 0.75};
    peak.counters = false;  // the benchmark's counters stay those of the row above
    record(state, peak);
  }
}

/// Baseline: one thread per byte, rows given as (slot, first step).
__global__ void naive_gather_kernel(const std::uint8_t* base, std::int64_t slot_stride,
                                    std::int64_t step_bytes, const std::int64_t* slots,
                                    const std::int64_t* starts, std::int64_t batch,
                                    std::uint8_t* dst) {
  const std::int64_t row_bytes = window_steps * step_bytes;
  const std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (i >= batch * row_bytes) return;
  const std::int64_t row = i / row_bytes, off = i % row_bytes;
  dst[i] = base[slots[row] * slot_stride + starts[row] * step_bytes + off];
}

/// The rows (slot, first step) a device batch holds, read from the headers of its rows.
void rows_of_batch(const std::uint8_t* data, std::int64_t batch, std::int64_t row_bytes,
                   std::vector<std::int64_t>& slots, std::vector<std::int64_t>& starts) {
  std::vector<std::uint64_t> headers(static_cast<std::size_t>(batch));
  GEAR_CUDA_TRY(cudaMemcpy2D(headers.data(), 8, data, static_cast<std::size_t>(row_bytes), 8,
                             static_cast<std::size_t>(batch), cudaMemcpyDeviceToHost));
  slots.resize(headers.size());
  starts.resize(headers.size());
  for (std::size_t i = 0; i < headers.size(); ++i) {
    slots[i] = static_cast<std::int64_t>(headers[i] >> 32);
    starts[i] = static_cast<std::int64_t>(headers[i] & 0xFFFFFFFFu);
  }
}

/// Baseline: the published system's collection kernel's design, written here from its description:
/// each row's window split among threads of `load` bytes each (16-byte copies, a byte tail),
/// 1024-thread blocks, rows given as (slot, first step).
__global__ void split_gather_kernel(const std::uint8_t* base, std::int64_t slot_stride,
                                    std::int64_t step_bytes, const std::int64_t* slots,
                                    const std::int64_t* starts, std::int64_t batch,
                                    std::int64_t split, std::int64_t load, std::uint8_t* dst) {
  const std::int64_t row_bytes = window_steps * step_bytes;
  const std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  const std::int64_t row = i / split, first = i % split * load;
  if (row >= batch || first >= row_bytes) return;
  const std::int64_t n = row_bytes - first < load ? row_bytes - first : load;
  const std::uint8_t* from = base + slots[row] * slot_stride + starts[row] * step_bytes + first;
  std::uint8_t* to = dst + row * row_bytes + first;
  const std::int64_t vectors = n / 16;  // rows, steps and loads are multiples of 16 bytes
  for (std::int64_t v = 0; v < vectors; ++v)
    reinterpret_cast<uint4*>(to)[v] = reinterpret_cast<const uint4*>(from)[v];
  for (std::int64_t b = vectors * 16; b < n; ++b) to[b] = from[b];
}

/// What the baselines that gather gear's own rows share: a sample's setup, the rows (slot, first
/// step) gear chose on the device, the table's base and slot stride, and a destination.
template <std::int64_t StepBytes, class Storage>
struct same_rows {
  sample_setup<StepBytes, Storage> s;
  std::int64_t batch, row_bytes;
  gear::detail::allocation rows, dst;
  const std::uint8_t* base = nullptr;
  std::int64_t stride = 0;

  explicit same_rows(std::int64_t rows_in_batch, std::uint64_t seed)
      : s(rows_in_batch, window_steps, seed), batch(s.batch()), row_bytes(s.row_bytes()) {
    std::vector<std::int64_t> slots, starts;
    rows_of_batch(s.data(), batch, row_bytes, slots, starts);
    rows = gear::detail::allocation(gear::memory_kind::device,
                                    2 * slots.size() * sizeof(std::int64_t));
    GEAR_CUDA_TRY(cudaMemcpy(slots_data(), slots.data(), slots.size() * 8, cudaMemcpyHostToDevice));
    GEAR_CUDA_TRY(
        cudaMemcpy(starts_data(), starts.data(), starts.size() * 8, cudaMemcpyHostToDevice));
    dst = gear::detail::allocation(gear::memory_kind::device,
                                   static_cast<std::size_t>(batch * row_bytes));
    const auto ref = s.t.buf.ref(gear::op::write_steps{});
    base = reinterpret_cast<const std::uint8_t*>(ref.template step<0>(0, 0));
    stride = reinterpret_cast<const std::uint8_t*>(ref.template step<0>(1, 0)) - base;
  }
  [[nodiscard]] std::int64_t* slots_data() const { return rows.as<std::int64_t>(); }
  [[nodiscard]] std::int64_t* starts_data() const { return rows.as<std::int64_t>() + batch; }
  [[nodiscard]] std::uint8_t* out() const { return dst.as<std::uint8_t>(); }
  /// "" if rows 0, B/2 and B-1 of the destination hold gear's rows, byte for byte.
  [[nodiscard]] std::string differs(const char* what) const {
    std::vector<std::uint8_t> a(static_cast<std::size_t>(row_bytes)), b(a.size());
    for (std::int64_t r : {std::int64_t{0}, batch / 2, batch - 1}) {
      GEAR_CUDA_TRY(
          cudaMemcpy(a.data(), s.data() + r * row_bytes, a.size(), cudaMemcpyDeviceToHost));
      GEAR_CUDA_TRY(cudaMemcpy(b.data(), out() + r * row_bytes, b.size(), cudaMemcpyDeviceToHost));
      if (a != b) return std::string(what) + " differs from gear's at row " + std::to_string(r);
      if (auto e = check_rows(b.data(), 1, StepBytes, window_steps, nullptr, nullptr, s.t.slots);
          !e.empty())
        return e;
    }
    return "";
  }
};

/// The naive gather kernel over the same rows gear's sample chose (windows of window_steps).
template <std::int64_t StepBytes, class Storage>
void bm_naive_gather(benchmark::State& state) {
  same_rows<StepBytes, Storage> r(state.range(0), 7);
  const auto blocks = static_cast<unsigned>((r.batch * r.row_bytes + 255) / 256);
  auto launch = [&] {
    naive_gather_kernel<<<blocks, 256, 0, r.s.c.stream>>>(
        r.base, r.stride, StepBytes, r.slots_data(), r.starts_data(), r.batch, r.out());
  };
  launch();
  GEAR_CHECK_LAUNCH("naive_gather_kernel");
  GEAR_CUDA_TRY(cudaStreamSynchronize(r.s.c.stream));
  if (auto e = r.differs("naive gather"); !e.empty()) return fail(state, e);
  const int reps = reps_for(r.s.moved() / (r.s.limit * 1e9));
  const double sec = time_gpu(state, reps, launch);
  record(state, {"", r.s.moved() / sec / 1e9, r.s.limit_name(), r.s.limit, "", 0});
}

/// Median seconds of one body call over `rounds` rounds of `reps` calls (GPU time), after two
/// calls of warm-up: for figures a benchmark takes besides the one Google Benchmark times.
template <class Body>
double gpu_seconds(int reps, int rounds, Body body) {
  auto& c = clock_();
  for (int i = 0; i < 2; ++i) body();
  std::vector<double> per_call;
  for (int round = 0; round < rounds; ++round) {
    c.begin();
    for (int r = 0; r < reps; ++r) body();
    per_call.push_back(c.end() / reps);
  }
  return median(per_call);
}

/// P1p: the split gather (the published system's collection kernel's design) over the same rows
/// gear's sample chose, at the bytes per thread fastest for this shape (16 B .. 1 KiB, each tried
/// in the same run), and gear's sample_async of the same shape timed beside it: gear's figure
/// over the split gather's, target >= 1.1x.
template <std::int64_t StepBytes, class Storage>
void bm_split_gather(benchmark::State& state) {
  same_rows<StepBytes, Storage> r(state.range(0), 7);
  std::int64_t load = 0;
  auto launch = [&] {
    const std::int64_t split = (r.row_bytes + load - 1) / load;
    const auto blocks = static_cast<unsigned>((r.batch * split + 1023) / 1024);
    split_gather_kernel<<<blocks, 1024, 0, r.s.c.stream>>>(r.base, r.stride, StepBytes,
                                                           r.slots_data(), r.starts_data(),
                                                           r.batch, split, load, r.out());
  };
  const int reps = reps_for(r.s.moved() / (r.s.limit * 1e9));
  double best = 0;
  std::int64_t best_load = 16;
  for (load = 16; load <= 1024; load *= 2) {
    GEAR_CUDA_TRY(cudaMemsetAsync(r.out(), 0, static_cast<std::size_t>(r.batch * r.row_bytes),
                                  r.s.c.stream));
    launch();
    GEAR_CHECK_LAUNCH("split_gather_kernel");
    GEAR_CUDA_TRY(cudaStreamSynchronize(r.s.c.stream));
    if (auto e = r.differs("split gather"); !e.empty()) return fail(state, e);
    const double sec = gpu_seconds(reps, 5, launch);
    if (best == 0 || sec < best) best = sec, best_load = load;
  }
  load = best_load;
  const double gear_sec = gpu_seconds(reps, 9, [&] {
    r.s.t.buf.sample_async(r.s.out, r.s.w, r.s.g, r.s.c.stream);
  });
  const double sec = time_gpu(state, reps, launch);
  const double split = r.s.moved() / sec / 1e9, ours = r.s.moved() / gear_sec / 1e9;
  char note[96];
  std::snprintf(note, sizeof note, "%lld B a thread, the fastest of 16 B .. 1 KiB",
                static_cast<long long>(best_load));
  table_row row{"", split, r.s.limit_name(), r.s.limit, "", 0};
  row.note = note;
  record(state, row);
  table_row p1p{g_name + "/P1p", ours, "split gather", split, "P1p >= 1.1x", 1.10};
  p1p.counters = false;
  p1p.note = "gear's sample_async of the same shape, timed in this benchmark";
  record(state, p1p);
}

/// Baseline: what a user without gear writes: select on the CPU, memcpy the rows into pinned
/// staging, one cudaMemcpy to the GPU. Reads the pinned table's rows with the CPU.
template <std::int64_t StepBytes>
void bm_cpu_pipeline(benchmark::State& state) {
  const std::int64_t batch = state.range(0);
  auto& t = sampled_table<StepBytes, gear::storage::pinned_host>::get();
  const double limit = h2d_limit();
  const auto ref = t.buf.ref(gear::op::write_steps{});
  // Mapped pinned memory has one address for CPU and GPU (unified addressing, 64-bit Linux).
  const auto* base = reinterpret_cast<const std::uint8_t*>(ref.template step<0>(0, 0));
  const std::int64_t stride =
      reinterpret_cast<const std::uint8_t*>(ref.template step<0>(1, 0)) - base;
  const std::int64_t row_bytes = window_steps * StepBytes;
  gear::detail::allocation staging(gear::memory_kind::pinned_host,
                                   static_cast<std::size_t>(batch * row_bytes));
  gear::detail::allocation dst(gear::memory_kind::device,
                               static_cast<std::size_t>(batch * row_bytes));
  std::mt19937_64 gen(11);
  auto& c = clock_();
  auto once = [&] {
    for (std::int64_t r = 0; r < batch; ++r) {
      const auto slot = static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(t.slots));
      const auto start = static_cast<std::int64_t>(
          gen() % static_cast<std::uint64_t>(trajectory_steps - window_steps + 1));
      std::memcpy(staging.data() + r * row_bytes, base + slot * stride + start * StepBytes,
                  static_cast<std::size_t>(row_bytes));
    }
    GEAR_CUDA_TRY(cudaMemcpyAsync(dst.data(), staging.data(),
                                  static_cast<std::size_t>(batch * row_bytes),
                                  cudaMemcpyHostToDevice, c.stream));
    GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
  };
  once();
  {
    std::vector<std::uint8_t> back(static_cast<std::size_t>(batch * row_bytes));
    GEAR_CUDA_TRY(cudaMemcpy(back.data(), dst.data(), back.size(), cudaMemcpyDeviceToHost));
    if (auto e = check_rows(back.data(), batch, StepBytes, window_steps, nullptr, nullptr, t.slots,
                            0, std::max<std::int64_t>(1, batch / 4));
        !e.empty())
      return fail(state, e);
  }
  std::vector<double> times;
  for (auto _ : state) {
    const double t0 = wall_seconds();
    once();
    const double s = wall_seconds() - t0;
    state.SetIterationTime(s);
    times.push_back(s);
  }
  record(state,
         {"", double(batch) * row_bytes / median(times) / 1e9, "H2D pinned copy", limit, "", 0});
}

// ---- insert -----------------------------------------------------------------------------------

/// Insert from device memory into device storage: 256 MiB of trajectories per insert_async, of
/// trajectory_steps steps each, or (uneven) of 1 to trajectory_steps steps drawn uniformly (twice
/// as many trajectories: the scatter plans its blocks, detail/scatter.hpp).
template <std::int64_t StepBytes>
void bm_insert_device(benchmark::State& state, bool uneven) {
  release_cached_tables();
  using buffer_type = gear::replay_buffer<step_spec<StepBytes>, gear::storage::device>;
  constexpr std::int64_t trajectory_bytes = StepBytes * trajectory_steps;
  const std::int64_t count = std::max<std::int64_t>(1, 256 * mib / trajectory_bytes) * (uneven ? 2 : 1);
  const double limit = d2d_limit();
  buffer_type buf{gear::capacity{4 * count}, gear::max_length{trajectory_steps}};
  gear::detail::allocation src(gear::memory_kind::device,
                               static_cast<std::size_t>(count * trajectory_bytes));
  auto& c = clock_();
  fill_device(src.as<std::uint8_t>(), 0, count, StepBytes, c.stream);
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(count), trajectory_steps);
  if (uneven) {
    std::mt19937_64 gen(5);
    for (auto& l : lengths) l = 1 + static_cast<std::int64_t>(gen() % trajectory_steps);
    lengths.back() = trajectory_steps;
  }
  std::int64_t steps = 0;
  for (auto l : lengths) steps += l;
  std::vector<gear::key> keys(static_cast<std::size_t>(count));
  const gear::trajectories<step_spec<StepBytes>> in{
      lengths, {gear::input(src.as<const std::uint8_t>(), {StepBytes})}, gear::memory_kind::device};
  const double bytes = double(steps) * StepBytes;
  const double s = time_gpu(state, 4, [&] { buf.insert_async(in, keys, c.stream); });
  GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
  // One more insert, its last slot poisoned first: that trajectory (trajectory_steps long), byte
  // for byte.
  {
    const auto ref = buf.ref(gear::op::write_steps{});
    const std::int64_t next = (keys.back().slot(buf.capacity()) + count) % buf.capacity();
    GEAR_CUDA_TRY(cudaMemsetAsync(ref.template step<0>(next, 0), 0xA5,
                                  static_cast<std::size_t>(trajectory_bytes), c.stream));
    buf.insert(in, keys, c.stream);
    if (keys.back().slot(buf.capacity()) != next) return fail(state, "unexpected slot");
    std::vector<std::uint8_t> a(static_cast<std::size_t>(trajectory_bytes)), b(a.size());
    GEAR_CUDA_TRY(cudaMemcpy(a.data(), ref.template step<0>(keys.back().slot(buf.capacity()), 0),
                             a.size(), cudaMemcpyDeviceToHost));
    GEAR_CUDA_TRY(cudaMemcpy(b.data(),
                             src.as<std::uint8_t>() + (steps - trajectory_steps) * StepBytes,
                             b.size(), cudaMemcpyDeviceToHost));
    if (a != b || (!uneven && b[8] != pattern_byte(count - 1, 0, 8)))
      return fail(state, "stored trajectory differs from its source");
  }
  record(state, {"", 2 * bytes / s / 1e9, "D2D copy (r+w)", limit, "P4 >= 85%", 0.85});
}

/// Insert from pageable host memory into pinned_host storage: 256 MiB per insert.
template <std::int64_t StepBytes>
void bm_insert_pinned(benchmark::State& state) {
  release_cached_tables();
  using buffer_type = gear::replay_buffer<step_spec<StepBytes>, gear::storage::pinned_host>;
  constexpr std::int64_t trajectory_bytes = StepBytes * trajectory_steps;
  const std::int64_t count = std::max<std::int64_t>(1, 256 * mib / trajectory_bytes);
  const double bytes = double(count) * trajectory_bytes;
  const double limit = memcpy_mt_limit(static_cast<std::int64_t>(bytes));
  buffer_type buf{gear::capacity{4 * count}, gear::max_length{trajectory_steps}};
  std::vector<std::uint8_t> src(static_cast<std::size_t>(count * trajectory_bytes));
  fill_host(src.data(), 0, count, StepBytes);
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(count), trajectory_steps);
  std::vector<gear::key> keys(static_cast<std::size_t>(count));
  const gear::trajectories<step_spec<StepBytes>> in{
      lengths, {gear::input(src.data(), {StepBytes})}, gear::memory_kind::host};
  auto& c = clock_();
  for (int i = 0; i < 4; ++i) buf.insert(in, keys, c.stream);  // warm-up, touches every slot
  std::vector<double> times;
  for (auto _ : state) {
    const double t0 = wall_seconds();
    buf.insert(in, keys, c.stream);
    const double s = wall_seconds() - t0;
    state.SetIterationTime(s);
    times.push_back(s);
  }
  const auto ref = buf.ref(gear::op::write_steps{});
  const auto* stored = reinterpret_cast<const std::uint8_t*>(
      ref.template step<0>(keys.back().slot(buf.capacity()), 0));
  if (std::memcmp(stored, src.data() + (count - 1) * trajectory_bytes,
                  static_cast<std::size_t>(trajectory_bytes)) != 0)
    return fail(state, "stored trajectory differs from its source");
  record(state, {"", bytes / median(times) / 1e9, "memcpy, 16 threads", limit, "P4h >= 70%", 0.70});
}

// ---- selection cost against capacity (P6: O(log N) per sample) --------------------------------

/// One 8-byte column and trajectories of one step: the bytes a sample moves are negligible, so
/// its time is selection plus launches.
using select_spec = gear::spec<gear::column<"id", std::uint64_t>>;
constexpr std::int64_t select_batch = 4096;
constexpr std::int64_t select_smallest_n = std::int64_t{1} << 12;

/// out[i] = i << 32: the header of step 0 of the trajectory in slot i.
__global__ void header_kernel(std::uint64_t* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<std::uint64_t>(i) << 32;
}

const char* policy_name(const gear::select::uniform&) { return "uniform"; }
const char* policy_name(const gear::select::prioritized&) { return "prioritized"; }
const char* policy_name(const gear::select::recency&) { return "recency"; }

/// Microseconds per sample call at N = select_smallest_n, per policy: the ratio column's baseline.
std::map<std::string, double> g_select_base_us;

/// sample_async of `batch` windows of one step from a device buffer of capacity n, every slot
/// filled: selection (Policy) plus the gather of 8 bytes per row. Priorities (prioritized) are all
/// equal, so every probability is 1/n and every weight 1; recency draws from the newest n.
template <class Policy>
void bm_select(benchmark::State& state, std::int64_t n) {
  release_cached_tables();
  const std::int64_t batch = state.range(0);
  using buffer_type = gear::replay_buffer<select_spec, gear::storage::device, Policy>;
  Policy policy{};
  if constexpr (std::is_same_v<Policy, gear::select::recency>) policy.newest = n;
  buffer_type buf{gear::capacity{n}, gear::max_length{1}, policy};
  auto& c = clock_();
  {
    // Every slot, from device memory, 2^20 trajectories per insert; slot i = ticket i.
    const std::int64_t chunk = std::min<std::int64_t>(n, std::int64_t{1} << 20);
    gear::detail::allocation src(gear::memory_kind::device, static_cast<std::size_t>(n) * 8);
    header_kernel<<<1024, 256, 0, c.stream>>>(src.as<std::uint64_t>(), n);
    GEAR_CHECK_LAUNCH("header_kernel");
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(chunk), 1);
    std::vector<gear::key> keys(static_cast<std::size_t>(chunk));
    for (std::int64_t first = 0; first < n; first += chunk) {
      const auto m = static_cast<std::size_t>(std::min(chunk, n - first));
      buf.insert_async({std::span<const std::int64_t>(lengths.data(), m),
                        {gear::input(src.as<const std::uint64_t>() + first)},
                        gear::memory_kind::device},
                       keys, c.stream);
    }
    GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
  }
  auto out = buf.make_batch(gear::batch_size{batch}, gear::window_length{1});
  gear::rng g{2026};
  const gear::window w{.length = 1, .offset = 0, .from = gear::anchor::start};
  buf.sample(out, w, g, c.stream);
  {
    const auto b = static_cast<std::size_t>(batch);
    std::vector<std::uint64_t> ids(b);
    std::vector<gear::key> keys(b);
    std::vector<std::uint8_t> mask(b);
    std::vector<float> probabilities(b), weights(b);
    GEAR_CUDA_TRY(cudaMemcpy(ids.data(), out.template column<0>().data_handle(), b * 8,
                             cudaMemcpyDeviceToHost));
    GEAR_CUDA_TRY(
        cudaMemcpy(keys.data(), out.keys().data(), b * sizeof(gear::key), cudaMemcpyDeviceToHost));
    GEAR_CUDA_TRY(cudaMemcpy(mask.data(), out.mask().data_handle(), b, cudaMemcpyDeviceToHost));
    GEAR_CUDA_TRY(cudaMemcpy(probabilities.data(), out.probabilities().data(), b * 4,
                             cudaMemcpyDeviceToHost));
    GEAR_CUDA_TRY(cudaMemcpy(weights.data(), out.weights().data(), b * 4, cudaMemcpyDeviceToHost));
    // Filled once: the trajectory of ticket i is in slot i.
    for (std::size_t r = 0; r < b; ++r)
      if (keys[r].ticket >= static_cast<std::uint64_t>(n) || ids[r] != keys[r].ticket << 32 ||
          keys[r].shard != 0 || keys[r].incarnation != buf.owner().incarnation || mask[r] != 1 ||
          std::abs(double(probabilities[r]) * double(n) - 1) > 1e-3 || weights[r] != 1.0f)
        return fail(state, "row " + std::to_string(r) + ": key ticket " +
                               std::to_string(keys[r].ticket) + " shard " +
                               std::to_string(keys[r].shard) + ", data " + std::to_string(ids[r]) +
                               ", mask " + std::to_string(mask[r]) + ", probability " +
                               std::to_string(probabilities[r]) + ", weight " +
                               std::to_string(weights[r]) +
                               " (expected: data = ticket << 32, probability 1/N, weight 1)");
  }
  const double us = 1e6 * time_gpu(state, 100, [&] { buf.sample_async(out, w, g, c.stream); });
  state.counters["us_per_sample"] = us;
  state.counters["us_per_row"] = us / double(batch);
  state.counters["N"] = double(n);
  const std::string policy_key = policy_name(policy);
  if (n == select_smallest_n) g_select_base_us[policy_key] = us;
  table_row row("", us, "", 0, "", 0);
  row.unit = "us";
  if (const auto base = g_select_base_us.find(policy_key); base != g_select_base_us.end()) {
    row.limit_name = "N = 2^12, same policy";
    row.limit = base->second;
  }
  char note[64];
  std::snprintf(note, sizeof note, "%.4f us per row", us / double(batch));
  row.note = note;
  record(state, row);
}

// ---- prioritized selection and update (P3, P3u) -------------------------------------------------

/// Median microseconds of `reps` timed calls of f on the benchmark clock's stream, after 3 warm-up
/// calls; each call timed on its own (events around it), as PERF.md's GPU time.
template <class F>
double median_call_us(int reps, F&& f) {
  auto& c = clock_();
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    c.begin();
    f();
    t.push_back(1e6 * c.end());
  }
  return median(t);
}

/// Median microseconds of `reps` calls of f on the CPU.
template <class F>
double median_cpu_us(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

/// P3 and P3u on gear's prioritized device state (the part of replay_buffer they are about), with
/// their PERF.md baselines in the same run: N = 2^24 trajectories with random priorities, B = 4096.
///   select:  one sample's selection with importance weights (one launch; and the same with the
///            weights in a second launch, alternately), against
///            thrust inclusive_scan + upper_bound over all N (fp64, like the tree) and gear's
///            one-thread CPU sum tree (the host state, the same 16-ary tree Reverb's design uses);
///   update:  4096 pairs, every tenth naming the key before it again (last write wins), from host
///            spans (checked on the CPU, staged, copied) and from device memory (checked on the
///            GPU), against the CPU sum tree's update.
/// Checked once: selected rows carry p_i^alpha / sum p^alpha, and updated priorities are the last
/// written.
void bm_prioritized(benchmark::State& state) {
  release_cached_tables();
  const std::int64_t n = std::int64_t{1} << 24, batch = 4096;
  const gear::select::prioritized policy{0.6, 0.4};
  auto& c = clock_();
  gear::select::prioritized::state<gear::exec::device> dev(policy, n);
  gear::select::prioritized::state<gear::exec::host> host(policy, n);
  // Slot metadata as a full buffer of first-time inserts would publish it: every slot committed,
  // slot i holding ticket i (updates check their keys against it on the GPU).
  gear::detail::allocation lengths(gear::memory_kind::device, static_cast<std::size_t>(n) * 8);
  gear::detail::allocation tickets(gear::memory_kind::device, static_cast<std::size_t>(n) * 8);
  {
    const std::vector<std::int64_t> ones(static_cast<std::size_t>(n), 1);
    GEAR_CUDA_TRY(cudaMemcpy(lengths.data(), ones.data(), lengths.size(), cudaMemcpyHostToDevice));
    std::vector<std::uint64_t> first(static_cast<std::size_t>(n));
    std::iota(first.begin(), first.end(), std::uint64_t{0});
    GEAR_CUDA_TRY(cudaMemcpy(tickets.data(), first.data(), tickets.size(), cudaMemcpyHostToDevice));
  }
  gear::slot_table t;
  t.lengths = lengths.as<std::int64_t>();
  t.tickets = tickets.as<std::uint64_t>();
  t.capacity = t.occupied = t.live = n;
  t.next_ticket = static_cast<std::uint64_t>(n);
  dev.on_commit(t, 0, n, c.stream);
  host.on_commit(t, 0, n, gear::detail::no_stream());
  // Random priorities (log-uniform over [0.05, 20]) on every slot, 2^20 keys per update.
  std::mt19937_64 gen(2026);
  std::uniform_real_distribution<double> log_p(std::log(0.05), std::log(20.0));
  std::vector<float> raw(static_cast<std::size_t>(n));
  for (auto& p : raw) p = static_cast<float>(std::exp(log_p(gen)));
  {
    std::vector<gear::key> keys(std::size_t{1} << 20);
    for (std::int64_t at = 0; at < n; at += static_cast<std::int64_t>(keys.size())) {
      const auto m = std::min(keys.size(), static_cast<std::size_t>(n - at));
      for (std::size_t i = 0; i < m; ++i) keys[i].ticket = static_cast<std::uint64_t>(at) + i;
      const std::span<const gear::key> k(keys.data(), m);
      const std::span<const float> p(raw.data() + at, m);
      dev.update(t, k, p, c.stream);
      host.update(t, k, p, gear::detail::no_stream());
    }
    GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
  }
  using select_batch_type = gear::batch<select_spec>;
  select_batch_type out(gear::memory_kind::device, gear::batch_size{batch}, gear::window_length{1});
  gear::selection_request r;
  r.batch = batch;
  r.slots = out.slots_data();
  r.probabilities = out.probabilities_data();
  r.weights = out.weights_data();
  out.workspace().lend_to(r);  // one launch: the last block writes the weights
  gear::selection_request two_launches = r;
  two_launches.arrivals = nullptr;
  gear::rng g{7};
  // Check once each way: every row's probability is p^alpha / sum p^alpha of its slot, and its
  // weight (P_min / P_i)^beta over the batch.
  double total = 0;
  for (float p : raw) total += std::pow(double(p), policy.alpha);
  // The buffer's way (with an arrivals word), two launches, and every block after a grid-wide
  // barrier (tuning::select_weights_grid_sync, the buffer's way at B = 4096 now).
  using ways = gear::detail::select_weights;
  const auto select_as = [&](const gear::selection_request& q, int way) {
    if (way == 2) return dev.select(t, q, c.stream, ways::grid_sync) == ways::grid_sync;
    dev.select(t, q, c.stream);
    return true;
  };
  for (int way = 0; way < 3; ++way) {
    const gear::selection_request* q = way == 1 ? &two_launches : &r;
    gear::selection_request once = *q;
    once.draw = g.next();
    GEAR_CUDA_TRY(
        cudaMemsetAsync(once.weights, 0xFF, static_cast<std::size_t>(batch) * 4, c.stream));
    if (!select_as(once, way))
      return fail(state, "the grid-wide barrier's selection did not fit on the GPU at once");
    GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
    std::vector<std::int64_t> slots(static_cast<std::size_t>(batch));
    std::vector<float> probabilities(slots.size()), weights(slots.size());
    GEAR_CUDA_TRY(cudaMemcpy(slots.data(), r.slots, slots.size() * 8, cudaMemcpyDeviceToHost));
    GEAR_CUDA_TRY(cudaMemcpy(probabilities.data(), r.probabilities, slots.size() * 4,
                             cudaMemcpyDeviceToHost));
    GEAR_CUDA_TRY(cudaMemcpy(weights.data(), r.weights, slots.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> want(slots.size());
    double smallest = INFINITY;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      want[i] = slots[i] < 0 || slots[i] >= n
                    ? -1
                    : std::pow(double(raw[slots[i]]), policy.alpha) / total;
      if (!(std::abs(probabilities[i] - want[i]) <= 1e-3 * want[i]))
        return fail(state, "prioritized row " + std::to_string(i) + ": slot " +
                               std::to_string(slots[i]) + " probability " +
                               std::to_string(probabilities[i]) + ", expected " +
                               std::to_string(want[i]));
      smallest = std::min(smallest, want[i]);
    }
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const double w = std::pow(smallest / want[i], policy.beta);
      if (!(std::abs(weights[i] - w) <= 1e-4 * w))
        return fail(state, "prioritized row " + std::to_string(i) + " (" +
                               (way == 0   ? "the buffer's way"
                                : way == 1 ? "two launches"
                                           : "grid sync") +
                               "): weight " + std::to_string(weights[i]) + ", expected " +
                               std::to_string(w));
    }
  }
  // The three ways alternately, 5 rounds of 40 calls each, medians of each way's calls.
  std::vector<double> times[3];
  for (int round = 0; round < 5; ++round)
    for (int way = 0; way < 3; ++way) {
      gear::selection_request* q = way == 1 ? &two_launches : &r;
      times[way].push_back(median_call_us(40, [&] {
        q->draw = g.next();
        (void)select_as(*q, way);
      }));
    }
  for (auto& v : times) std::sort(v.begin(), v.end());
  const double select_us = times[0][2], select_two_us = times[1][2], select_sync_us = times[2][2];
  // Baseline: inclusive_scan + upper_bound over all N (the weights p^alpha already computed).
  double scan_us = 0;
  {
    std::vector<double> w(raw.size()), targets(static_cast<std::size_t>(batch));
    double total = 0;
    for (std::size_t i = 0; i < w.size(); ++i) total += (w[i] = std::pow(double(raw[i]), 0.6));
    for (auto& x : targets) x = gear::detail::unit_interval(gen()) * total;
    thrust::device_vector<double> dw(w.begin(), w.end()), prefix(w.size()),
        dt(targets.begin(), targets.end());
    thrust::device_vector<std::int64_t> found(targets.size());
    scan_us = median_call_us(50, [&] {
      thrust::inclusive_scan(thrust::cuda::par.on(c.stream), dw.begin(), dw.end(), prefix.begin());
      thrust::upper_bound(thrust::cuda::par.on(c.stream), prefix.begin(), prefix.end(), dt.begin(),
                          dt.end(), found.begin());
    });
  }
  // Baseline: the one-thread CPU sum tree, the same draws.
  std::vector<std::int64_t> hs(static_cast<std::size_t>(batch));
  std::vector<float> hp(hs.size()), hw(hs.size());
  gear::selection_request hr = r;
  hr.slots = hs.data();
  hr.probabilities = hp.data();
  hr.weights = hw.data();
  const double cpu_select_us = median_cpu_us(21, [&] {
    hr.draw = g.next();
    host.select(t, hr, gear::detail::no_stream());
  });

  // Updates: 4096 pairs, about 10% naming the key before them again.
  std::vector<gear::key> uk(static_cast<std::size_t>(batch));
  std::vector<float> up(uk.size());
  for (std::size_t i = 0; i < uk.size(); ++i) {
    uk[i].ticket = i % 10 == 9 ? uk[i - 1].ticket : gen() % static_cast<std::uint64_t>(n);
    up[i] = static_cast<float>(gen() % 1000 + 1) * 0.01f;
  }
  gear::detail::allocation device_pairs(gear::memory_kind::device,
                                        uk.size() * (sizeof(gear::key) + sizeof(float)));
  auto* device_keys = device_pairs.as<gear::key>();
  auto* device_priorities = reinterpret_cast<float*>(device_keys + uk.size());
  GEAR_CUDA_TRY(
      cudaMemcpy(device_keys, uk.data(), uk.size() * sizeof(gear::key), cudaMemcpyHostToDevice));
  GEAR_CUDA_TRY(
      cudaMemcpy(device_priorities, up.data(), up.size() * sizeof(float), cudaMemcpyHostToDevice));
  const double update_host_us = median_call_us(200, [&] { dev.update(t, uk, up, c.stream); });
  const std::span<const gear::key> dk(device_keys, uk.size());
  const std::span<const float> dp(device_priorities, up.size());
  const double update_device_us =
      median_call_us(200, [&] { dev.update_from_device(t, gear::key_owner{}, dk, dp, c.stream); });
  GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
  try {
    dev.raise_update_failures();  // every pair is good
  } catch (const gear::error& e) {
    return fail(state, std::string("an update from device memory failed: ") + e.what());
  }
  {
    const std::vector<float> now = dev.priorities(c.stream);
    std::map<std::uint64_t, float> last;                                     // last write wins
    for (std::size_t i = 0; i < uk.size(); ++i) last[uk[i].ticket] = up[i];  // ticket = slot
    for (const auto& [slot, p] : last)
      if (now[slot] != p)
        return fail(state, "after the updates slot " + std::to_string(slot) + " has priority " +
                               std::to_string(now[slot]) + ", expected " + std::to_string(p));
  }
  const double cpu_update_us =
      median_cpu_us(21, [&] { host.update(t, uk, up, gear::detail::no_stream()); });
  for (auto _ : state) state.SetIterationTime(select_us * 1e-6);

  state.counters["select_us"] = select_us;
  state.counters["select_two_launches_us"] = select_two_us;
  state.counters["select_grid_sync_us"] = select_sync_us;
  state.counters["scan_baseline_us"] = scan_us;
  state.counters["cpu_tree_select_us"] = cpu_select_us;
  state.counters["update_host_spans_us"] = update_host_us;
  state.counters["update_device_memory_us"] = update_device_us;
  state.counters["cpu_tree_update_us"] = cpu_update_us;
  const std::string name = g_name;
  char note[160];
  auto row = [&](const std::string& what, double us, const std::string& base_name, double base_us) {
    table_row r(name + "/" + what, us, base_name, base_us, "", 0);
    r.unit = "us";
    return r;
  };
  // P3 (issue 13): <= 10 us; PERF.md: >= 3x the scan, >= 50x the CPU tree.
  table_row p3 = row("select", select_us, "thrust scan + upper_bound", scan_us);
  p3.target = "P3 <= 10 us";
  p3.met =
      select_us <= 10 && scan_us >= 3 * select_us && cpu_select_us >= 50 * select_us ? "yes" : "NO";
  std::snprintf(note, sizeof note,
                "%s; %.1fx faster than the scan (>= 3x), %.0fx the CPU tree (>= 50x)",
                batch <= gear::detail::tuning::select_fused_weights_max_rows ? "one launch"
                : gear::detail::tuning::select_weights_grid_sync ? "one cooperative launch"
                                                                 : "two launches",
                scan_us / select_us, cpu_select_us / select_us);
  p3.note = note;
  record(state, p3);
  table_row two =
      row("select/two_launches", select_two_us, "select with an arrivals word", select_us);
  two.note = "the weights in a second launch (no arrivals word; batches over 2048 rows)";
  record(state, two);
  table_row sync =
      row("select/grid_sync", select_sync_us, "select with an arrivals word", select_us);
  sync.note = "one cooperative launch: every block writes its rows' weights after a grid barrier";
  record(state, sync);
  record(state, row("baseline/cpu_sum_tree_select", cpu_select_us, "", 0));
  for (auto [what, us, target] : {std::tuple{"update/host_spans", update_host_us, 15.0},
                                  std::tuple{"update/device_memory", update_device_us, 10.0}}) {
    table_row u = row(what, us, "CPU sum tree update", cpu_update_us);
    u.target = "P3u <= " + std::to_string(static_cast<int>(target)) + " us";
    u.met = us <= target ? "yes" : "NO";
    std::snprintf(note, sizeof note, "%.1fx faster than the CPU tree", cpu_update_us / us);
    u.note = note;
    record(state, u);
  }
}

// ---- capacity (P6) -----------------------------------------------------------------------------

/// Step size of the capacity buffers (an Atari frame stack): few, large slots.
constexpr std::int64_t capacity_step_bytes = 28672;

/// The first word of a one-line file (cgroup limits) as a number; -1 if absent or "max".
double read_number(const char* path) {
  std::ifstream f(path);
  std::string word;
  if (!(f >> word) || word == "max") return -1;
  char* end = nullptr;
  const double v = std::strtod(word.c_str(), &end);
  return end != nullptr && *end == '\0' ? v : -1;
}

/// The value of `key` in a file of "key value [unit]" lines, times `scale`; -1 if absent.
double read_keyed(const char* path, const std::string& key, double scale) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.compare(0, key.size(), key) != 0 || line.size() == key.size() ||
        (line[key.size()] != ' ' && line[key.size()] != ':'))
      continue;
    return std::strtod(line.c_str() + key.size() + 1, nullptr) * scale;
  }
  return -1;
}

/// Host memory in bytes: physical, and what this process may still take (MemAvailable, capped by
/// the cgroup's limit where there is one, counting its page cache as free).
struct host_memory_info {
  double total = 0, available = 0;
};
host_memory_info host_memory() {
  host_memory_info m;
  const double page = double(sysconf(_SC_PAGESIZE));
  m.total = double(sysconf(_SC_PHYS_PAGES)) * page;
  m.available = read_keyed("/proc/meminfo", "MemAvailable", 1024);
  if (m.available < 0) m.available = double(sysconf(_SC_AVPHYS_PAGES)) * page;
  struct cgroup_files {
    const char *limit, *usage, *stat, *cache;
  };
  for (const cgroup_files& cg :
       {cgroup_files{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
                     "/sys/fs/cgroup/memory.stat", "file"},
        cgroup_files{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                     "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                     "/sys/fs/cgroup/memory/memory.stat", "cache"}}) {
    const double limit = read_number(cg.limit), used = read_number(cg.usage);
    if (limit <= 0 || limit >= m.total || used < 0) continue;
    const double cache = std::max(0.0, read_keyed(cg.stat, cg.cache, 1));
    m.total = limit;
    m.available = std::min(m.available, limit - used + cache);
    break;
  }
  return m;
}

std::string format(const char* fmt, double a, double b, double c) {
  char text[256];
  std::snprintf(text, sizeof text, fmt, a, b, c);
  return text;
}

/// P6: a replay_buffer of at least target_gib GiB of Storage (28 KiB steps, trajectories of 1000
/// steps), every slot filled from device memory and checked, then sample_async of 256 windows of
/// 64 steps timed against the in-run limit. Skips, with the reason, where the machine lacks the
/// memory; frees everything before it returns.
template <class Storage>
void bm_capacity(benchmark::State& state, std::int64_t target_gib) {
  release_cached_tables();  // the sampled tables of the earlier benchmarks
  constexpr bool device = std::is_same_v<Storage, gear::storage::device>;
  constexpr std::int64_t step = capacity_step_bytes;
  constexpr std::int64_t trajectory_bytes = step * trajectory_steps;
  using buffer_type = gear::replay_buffer<step_spec<step>, Storage>;
  const std::int64_t slots = (target_gib * gib + trajectory_bytes - 1) / trajectory_bytes;
  const double stored = double(slots) * trajectory_bytes;
  const std::int64_t batch = 256, chunk = 256 * mib / trajectory_bytes;
  const std::string name = g_name, target = "P6 >= " + std::to_string(target_gib) + " GiB";
  state.counters["target_GiB"] = double(target_gib);
  auto give_up = [&](const std::string& why, const char* met, bool has_figure) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), why.c_str());
    table_row row("", stored / gib, "", 0, target, 0);
    row.unit = "GiB";
    row.met = met;
    row.note = why;
    row.has_figure = has_figure;
    record(state, row);
    state.counters["met"] = 0;
  };
  try {
    // The memory first: a buffer this size must not take the machine (or the run) down.
    std::size_t gpu_free = 0, gpu_total = 0;
    GEAR_CUDA_TRY(cudaMemGetInfo(&gpu_free, &gpu_total));
    // Staging for the fill, the sampled batch, metadata and slack.
    const double gpu_extra = double(chunk * trajectory_bytes + batch * window_steps * step) + gib;
    const double gpu_need = (device ? stored : 0.0) + gpu_extra;
    if (gpu_need > double(gpu_free)) {
      const std::string why =
          format("skipped: needs %.1f GiB of GPU memory, the GPU has %.1f GiB free of %.1f GiB",
                 gpu_need / gib, double(gpu_free) / gib, double(gpu_total) / gib);
      give_up(why, "n/a", false);
      return state.SkipWithError(why.c_str());
    }
    if (!device) {
      const host_memory_info host = host_memory();
      const double host_need = stored + 4.0 * gib;  // and room for everything else
      if (host_need > host.available) {
        const std::string why = format(
            "skipped: needs %.1f GiB of host memory, the machine has %.1f GiB available "
            "of %.1f GiB",
            host_need / gib, host.available / gib, host.total / gib);
        give_up(why, "n/a", false);
        return state.SkipWithError(why.c_str());
      }
    }

    std::fprintf(stderr, "%s: allocating %lld slots of %.1f MiB, %.1f GiB\n", name.c_str(),
                 static_cast<long long>(slots), double(trajectory_bytes) / mib, stored / gib);
    const double t0 = wall_seconds();
    buffer_type buf{gear::capacity{slots}, gear::max_length{trajectory_steps}};
    const double build_s = wall_seconds() - t0;
    std::fprintf(stderr, "%s: allocated in %.1f s; filling from device memory\n", name.c_str(),
                 build_s);
    auto& c = clock_();
    {
      gear::detail::allocation staging(gear::memory_kind::device,
                                       static_cast<std::size_t>(chunk * trajectory_bytes));
      std::vector<std::int64_t> lengths(static_cast<std::size_t>(chunk), trajectory_steps);
      std::vector<gear::key> keys(static_cast<std::size_t>(chunk));
      std::int64_t report_at = slots / 8;
      for (std::int64_t first = 0; first < slots; first += chunk) {
        const std::int64_t n = std::min(chunk, slots - first);
        fill_device(staging.as<std::uint8_t>(), first, n, step, c.stream);
        buf.insert_async(
            {std::span<const std::int64_t>(lengths.data(), static_cast<std::size_t>(n)),
             {gear::input(staging.as<const std::uint8_t>(), {step})},
             gear::memory_kind::device},
            keys, c.stream);
        if (first + n >= report_at) {
          GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
          std::fprintf(stderr, "%s: filled %lld of %lld slots (%.1f GiB) in %.1f s\n", name.c_str(),
                       static_cast<long long>(first + n), static_cast<long long>(slots),
                       double(first + n) * trajectory_bytes / gib, wall_seconds() - t0 - build_s);
          report_at += slots / 8;
        }
      }
      GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
    }
    const double fill_s = wall_seconds() - t0 - build_s;

    // Every slot holds its own trajectory: the headers of its first and last step, and every
    // byte of those steps in the first, middle and last slot ...
    const auto ref = buf.ref(gear::op::write_steps{});
    const auto* base = reinterpret_cast<const std::uint8_t*>(ref.template step<0>(0, 0));
    const std::int64_t stride =
        reinterpret_cast<const std::uint8_t*>(ref.template step<0>(1, 0)) - base;
    std::vector<std::uint64_t> headers(static_cast<std::size_t>(slots));
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(step));
    for (const std::int64_t t : {std::int64_t{0}, trajectory_steps - 1}) {
      GEAR_CUDA_TRY(cudaMemcpy2D(headers.data(), 8, base + t * step,
                                 static_cast<std::size_t>(stride), 8,
                                 static_cast<std::size_t>(slots), cudaMemcpyDefault));
      for (std::int64_t s = 0; s < slots; ++s)
        if (headers[static_cast<std::size_t>(s)] !=
            ((static_cast<std::uint64_t>(s) << 32) | static_cast<std::uint64_t>(t))) {
          give_up("wrong output: slot " + std::to_string(s) + " step " + std::to_string(t), "NO",
                  true);
          return fail(state, "slot " + std::to_string(s) + " step " + std::to_string(t) +
                                 " does not hold its pattern");
        }
      for (const std::int64_t s : {std::int64_t{0}, slots / 2, slots - 1}) {
        GEAR_CUDA_TRY(cudaMemcpy(bytes.data(), base + s * stride + t * step, bytes.size(),
                                 cudaMemcpyDefault));
        for (std::int64_t b = 0; b < step; ++b)
          if (bytes[static_cast<std::size_t>(b)] != pattern_byte(s, t, b)) {
            give_up("wrong output: slot " + std::to_string(s) + " step " + std::to_string(t), "NO",
                    true);
            return fail(state, "slot " + std::to_string(s) + " step " + std::to_string(t) +
                                   " byte " + std::to_string(b) + " differs from the pattern");
          }
      }
    }
    // ... and a sampled batch (every 8th row checked in full).
    const double limit = device ? d2d_limit() : h2d_limit();
    auto out = buf.make_batch(gear::batch_size{batch}, gear::window_length{window_steps});
    gear::rng g{2026};
    const gear::window w{.length = window_steps, .offset = 0, .from = gear::anchor::random};
    buf.sample(out, w, g, c.stream);
    const auto* data =
        reinterpret_cast<const std::uint8_t*>(out.template column<0>().data_handle());
    if (auto e = check_device_batch(out, data, step, slots, 8); !e.empty()) {
      give_up("wrong output: " + e, "NO", true);
      return fail(state, e);
    }
    const double moved = (device ? 2.0 : 1.0) * double(batch) * window_steps * step;
    const double sec = time_gpu(state, reps_for(moved / (limit * 1e9)),
                                [&] { buf.sample_async(out, w, g, c.stream); });
    std::fprintf(stderr, "%s: built, filled and verified; releasing %.1f GiB\n", name.c_str(),
                 stored / gib);
    state.counters["capacity_GiB"] = stored / gib;
    state.counters["met"] = 1;
    state.counters["build_s"] = build_s;
    state.counters["fill_s"] = fill_s;
    state.counters["us_per_sample"] = sec * 1e6;
    table_row built("", stored / gib, "", 0, target, 0);
    built.unit = "GiB";
    built.met = "yes";
    built.note = format(
        "%.0f slots of 28 KiB x 1000 steps; allocated in %.1f s, filled in %.1f s, "
        "verified",
        double(slots), build_s, fill_s);
    record(state, built);
    record(state, {name + "/sample/window:64/batch:256", moved / sec / 1e9,
                   device ? "D2D copy (r+w)" : "H2D pinned copy", limit, "", 0});
  } catch (const std::exception& e) {
    const std::string why = std::string("could not build or sample: ") + e.what();
    give_up(why, "NO", false);
    state.SkipWithError(why.c_str());
  }
}

// ---- host storage (runs without a GPU; the CI smoke test) -------------------------------------

using host_spec = step_spec<256>;
using host_buffer = gear::replay_buffer<host_spec, gear::storage::host>;
constexpr std::int64_t host_slots = 64;  // 16 MiB

host_buffer make_host_table() {
  host_buffer buf{gear::capacity{host_slots}, gear::max_length{trajectory_steps}};
  std::vector<std::uint8_t> src(static_cast<std::size_t>(host_slots * trajectory_steps * 256));
  fill_host(src.data(), 0, host_slots, 256);
  std::vector<std::int64_t> lengths(host_slots, trajectory_steps);
  std::vector<gear::key> keys(host_slots);
  buf.insert({lengths, {gear::input(src.data(), {256})}}, keys);
  return buf;
}

void bm_host_sample(benchmark::State& state) {
  const std::int64_t batch = state.range(0);
  host_buffer buf = make_host_table();
  auto out = buf.make_batch(gear::batch_size{batch}, gear::window_length{window_steps});
  gear::rng g{1};
  const gear::window w{.length = window_steps, .offset = 0, .from = gear::anchor::random};
  buf.sample(out, w, g);
  if (auto e =
          check_rows(reinterpret_cast<const std::uint8_t*>(out.column<0>().data_handle()), batch,
                     256, window_steps, out.keys().data(), out.mask().data_handle(), host_slots);
      !e.empty())
    return fail(state, e);
  for (auto _ : state) {
    buf.sample(out, w, g);
    benchmark::DoNotOptimize(out.column<0>().data_handle());
  }
  const double bytes = double(batch) * window_steps * 256;
  state.counters["GBps"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void bm_host_insert(benchmark::State& state) {
  host_buffer buf{gear::capacity{host_slots}, gear::max_length{trajectory_steps}};
  constexpr std::int64_t count = 16;
  std::vector<std::uint8_t> src(static_cast<std::size_t>(count * trajectory_steps * 256));
  fill_host(src.data(), 0, count, 256);
  std::vector<std::int64_t> lengths(count, trajectory_steps);
  std::vector<gear::key> keys(count);
  const gear::trajectories<host_spec> in{lengths, {gear::input(src.data(), {256})}};
  for (auto _ : state) buf.insert(in, keys);
  const auto ref = buf.ref(gear::op::write_steps{});
  if (std::memcmp(ref.step<0>(keys.back().slot(buf.capacity()), 0),
                  src.data() + (count - 1) * trajectory_steps * 256, trajectory_steps * 256) != 0)
    return fail(state, "stored trajectory differs from its source");
  state.counters["GBps"] =
      benchmark::Counter(double(src.size()) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- registration -----------------------------------------------------------------------------

/// Registers fn under `name`, remembering the name (with its argument) for the table.
benchmark::internal::Benchmark* add(const std::string& name,
                                    std::function<void(benchmark::State&)> fn,
                                    bool batch_arg = false) {
  return benchmark::RegisterBenchmark(
      name.c_str(), [name, fn = std::move(fn), batch_arg](benchmark::State& s) {
        g_name = batch_arg ? name + "/batch:" + std::to_string(s.range(0)) : name;
        fn(s);
      });
}

template <std::int64_t StepBytes, class Storage>
void register_sample_family() {
  const std::string tag =
      std::string(storage_name(Storage{})) + "/step:" + std::to_string(StepBytes);
  // Small steps also at batch 32 (latency-bound) and 4096, where launch latency no longer
  // dominates.
  auto at_batch = [](benchmark::internal::Benchmark* b, std::int64_t batch) {
    b->Arg(batch)->ArgName("batch")->UseManualTime()->MinTime(gpu_min_time)->Unit(
        benchmark::kMicrosecond);
  };
  for (std::int64_t batch : {32, 256, 1024, 4096}) {
    if ((batch == 4096 || batch == 32) && StepBytes > 1024) continue;
    at_batch(add(
                 "sample/" + tag,
                 [](benchmark::State& s) { bm_sample<StepBytes, Storage>(s, window_steps, true); },
                 true),
             batch);
    at_batch(add("naive_gather/" + tag, bm_naive_gather<StepBytes, Storage>, true), batch);
    at_batch(add("split_gather/" + tag, bm_split_gather<StepBytes, Storage>, true), batch);
    if constexpr (std::is_same_v<Storage, gear::storage::pinned_host>)
      at_batch(add("cpu_pipeline/" + tag, bm_cpu_pipeline<StepBytes>, true), batch);
  }
}

/// The window-length axis: 4 KiB steps, B = 256 (no PERF.md target).
template <class Storage>
void register_window_axis() {
  const std::string tag = std::string("sample/") + storage_name(Storage{}) + "/step:4096/window:";
  for (std::int64_t length : {1, 16, 64, 256})
    add(
        tag + std::to_string(length),
        [length](benchmark::State& s) { bm_sample<4096, Storage>(s, length, false); }, true)
        ->Arg(256)
        ->ArgName("batch")
        ->UseManualTime()
        ->MinTime(gpu_min_time)
        ->Unit(benchmark::kMicrosecond);
}

template <std::int64_t StepBytes>
void register_insert() {
  add("insert/device_from_device/step:" + std::to_string(StepBytes),
      [](benchmark::State& st) { bm_insert_device<StepBytes>(st, false); })
      ->UseManualTime()
      ->MinTime(gpu_min_time)
      ->Unit(benchmark::kMicrosecond);
  add("insert/device_from_device/uneven/step:" + std::to_string(StepBytes),
      [](benchmark::State& st) { bm_insert_device<StepBytes>(st, true); })
      ->UseManualTime()
      ->MinTime(gpu_min_time)
      ->Unit(benchmark::kMicrosecond);
  add("insert/pinned_host_from_host/step:" + std::to_string(StepBytes), bm_insert_pinned<StepBytes>)
      ->UseManualTime()
      ->MinTime(gpu_min_time)
      ->Unit(benchmark::kMicrosecond);
}

/// Selection cost against capacity: N = 2^12 .. 2^24, B = select_batch. Fixed iterations: each
/// run builds and fills its own buffer.
template <class Policy>
void register_select_axis() {
  for (int log_n : {12, 16, 20, 24}) {
    const std::int64_t n = std::int64_t{1} << log_n;
    add(
        "select/device/" + std::string(policy_name(Policy{})) + "/N:" + std::to_string(n),
        [n](benchmark::State& s) { bm_select<Policy>(s, n); }, true)
        ->Arg(select_batch)
        ->ArgName("batch")
        ->UseManualTime()
        ->Iterations(30)
        ->Unit(benchmark::kMicrosecond);
  }
}

// ---- sharded_buffer on one GPU ---------------------------------------------------------------

/// Seconds per call of f on the bench stream: the median of 9 timings of 20 calls each, after 3
/// calls of warm-up.
template <class F>
double median_per_call(F&& f) {
  auto& c = clock_();
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int k = 0; k < 9; ++k) {
    c.begin();
    for (int i = 0; i < 20; ++i) f();
    t.push_back(c.end() / 20);
  }
  return median(t);
}

/// `count` trajectories of `len` steps of StepBytes in device memory (every byte 1, set on
/// `stream`) as one insert's input, with room for its keys. Not movable: `in` points into it.
template <std::int64_t StepBytes>
struct device_input {
  gear::detail::allocation src;
  std::vector<std::int64_t> lengths;
  std::vector<gear::key> keys;
  gear::trajectories<step_spec<StepBytes>> in;
  device_input(std::int64_t count, std::int64_t len, cudaStream_t stream)
      : src(gear::memory_kind::device, static_cast<std::size_t>(count * len * StepBytes)),
        lengths(static_cast<std::size_t>(count), len),
        keys(static_cast<std::size_t>(count)),
        in{lengths,
           {gear::input(src.as<const std::uint8_t>(), {StepBytes})},
           gear::memory_kind::device} {
    GEAR_CUDA_TRY(cudaMemsetAsync(src.data(), 1, src.size(), stream));
  }
  device_input(const device_input&) = delete;
  device_input& operator=(const device_input&) = delete;
};

/// Inserts `total` trajectories of `len` steps of 4 KiB into every buffer of `bufs`, from device
/// memory, 64 per insert, on the bench stream.
template <class... Buffers>
void fill_4k(std::int64_t total, std::int64_t len, Buffers&... bufs) {
  constexpr std::int64_t chunk = 64;
  auto& c = clock_();
  device_input<4096> d(chunk, len, c.stream);
  for (std::int64_t at = 0; at < total; at += chunk) (bufs.insert(d.in, d.keys, c.stream), ...);
}

/// Sampling from a sharded_buffer of `Shards` shards on this GPU against one replay_buffer of the
/// same trajectories, in the same run: uniform, B = 256 windows of 16 steps of 4 KiB (16 MiB per
/// sample). The ratio is what the split, the fork and join of the shards' streams and the launch
/// that makes probabilities global cost on one GPU (median of 9 timings of 20 calls each).
template <int Shards>
void bm_sharded(benchmark::State& state) {
  constexpr std::int64_t total = 4096, len = 16, batch = 256;
  auto& c = clock_();
  int here = 0;
  GEAR_CUDA_TRY(cudaGetDevice(&here));
  gear::sharded_buffer<step_spec<4096>, gear::storage::device> sharded(
      std::vector<int>(Shards, here), gear::capacity{total / Shards}, gear::max_length{len}, {},
      gear::insert_route::round_robin);
  gear::replay_buffer<step_spec<4096>, gear::storage::device> single{gear::capacity{total},
                                                                     gear::max_length{len}};
  fill_4k(total, len, sharded, single);  // the same trajectories in both
  auto out = sharded.make_batch(gear::batch_size{batch}, gear::window_length{len});
  auto out1 = single.make_batch(gear::batch_size{batch}, gear::window_length{len});
  gear::rng g{3}, g1{3};
  const gear::window w{.length = len};
  double sharded_s = 0, single_s = 0;
  for (auto _ : state) {
    single_s = median_per_call([&] { single.sample_async(out1, w, g1, c.stream); });
    sharded_s = median_per_call([&] { sharded.sample_async(out, w, g, c.stream); });
    state.SetIterationTime(sharded_s);
  }
  const double bytes = static_cast<double>(batch * len * 4096);
  record(state, table_row{"", bytes / sharded_s / 1e9, "one replay_buffer, same run",
                          bytes / single_s / 1e9, "", 0});
}

/// One step of `Ranks` ranks through a rank_sampler (the joint draw of Ranks x 64 rows without
/// replacement, then each rank's copy of its rows) against the sharded sample of the same Ranks x
/// 64 rows into one batch, in the same run: what the ranks' copies and the draw's own stream cost.
/// Two shards on this GPU, windows of 16 steps of 4 KiB; the ranks' calls share the bench stream.
template <int Ranks>
void bm_rank_sampler(benchmark::State& state) {
  constexpr std::int64_t total = 4096, len = 16, rows = 64;
  using shards = gear::sharded_buffer<step_spec<4096>, gear::storage::device>;
  auto& c = clock_();
  int here = 0;
  GEAR_CUDA_TRY(cudaGetDevice(&here));
  shards buf({here, here}, gear::capacity{total / 2}, gear::max_length{len},
             gear::select::uniform{.replacement = false}, gear::insert_route::round_robin);
  fill_4k(total, len, buf);
  const gear::window w{.length = len};
  gear::rank_sampler<shards> sampler(buf, gear::rank_count{Ranks}, gear::batch_size{rows}, w,
                                     gear::rng{5});
  std::vector<shards::batch_type> outs;
  for (int r = 0; r < Ranks; ++r) outs.push_back(sampler.make_batch());
  auto joint = buf.make_batch(gear::batch_size{Ranks * rows}, gear::window_length{len});
  gear::rng g{5};
  double step_s = 0, joint_s = 0;
  for (auto _ : state) {
    joint_s = median_per_call([&] { buf.sample_async(joint, w, g, c.stream); });
    step_s = median_per_call([&] {
      for (int r = 0; r < Ranks; ++r) sampler.sample_async(r, outs[std::size_t(r)], c.stream);
    });
    state.SetIterationTime(step_s);
  }
  const double bytes = static_cast<double>(Ranks * rows * len * 4096);
  record(state, table_row{"", bytes / step_s / 1e9, "sharded sample of the joint rows, same run",
                          bytes / joint_s / 1e9, "", 0});
}

// ---- CUDA graphs ------------------------------------------------------------------------------

/// One sample captured into a CUDA graph (gear::device_rng) against the same sample enqueued
/// eagerly (gear::rng), in the same run: uniform, B = 256 windows of `Len` steps of 4 KiB from
/// 4096 trajectories. Two rows: GPU time per sample (median of 9 timings of 20 back-to-back calls,
/// so a call whose host enqueue is slower than its GPU work is timed by its enqueue), and host time
/// per call (the enqueue alone: 200 calls, no synchronisation inside, median of 9); and the same
/// eager call drawing from the device_rng without a graph. Checked once:
/// the first replay returns the keys of the first eager call of the same seed.
template <std::int64_t Len>
void bm_graph(benchmark::State& state) {
  constexpr std::int64_t total = 4096, batch = 256;
  auto& c = clock_();
  gear::replay_buffer<step_spec<4096>, gear::storage::device> buf{gear::capacity{total},
                                                                  gear::max_length{16}};
  fill_4k(total, 16, buf);
  auto out = buf.make_batch(gear::batch_size{batch}, gear::window_length{Len});
  const gear::window w{.length = Len, .from = gear::anchor::random};
  gear::rng eager{21};
  gear::device_rng draws{21};
  buf.sample(out, w, eager, c.stream);
  std::vector<gear::key> first(batch), replayed(batch);
  GEAR_CUDA_TRY(
      cudaMemcpy(first.data(), out.keys_data(), batch * sizeof(gear::key), cudaMemcpyDeviceToHost));
  cudaGraph_t graph{};
  cudaGraphExec_t exec{};
  GEAR_CUDA_TRY(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeGlobal));
  buf.sample_async(out, w, draws, c.stream);
  GEAR_CUDA_TRY(cudaStreamEndCapture(c.stream, &graph));
  GEAR_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  const auto replay = [&] { GEAR_CUDA_TRY(cudaGraphLaunch(exec, c.stream)); };
  replay();
  GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
  GEAR_CUDA_TRY(cudaMemcpy(replayed.data(), out.keys_data(), batch * sizeof(gear::key),
                           cudaMemcpyDeviceToHost));
  if (replayed != first) fail(state, "the first replay's keys differ from the first eager call's");
  const auto host_per_call = [&](auto&& f) {
    std::vector<double> t;
    for (int k = 0; k < 9; ++k) {
      const double t0 = wall_seconds();
      for (int i = 0; i < 200; ++i) f();
      t.push_back((wall_seconds() - t0) / 200);
      GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
    }
    return median(t);
  };
  const auto sample = [&] { buf.sample_async(out, w, eager, c.stream); };
  const auto device_drawn = [&] { buf.sample_async(out, w, draws, c.stream); };
  double eager_s = 0, graph_s = 0, eager_host = 0, graph_host = 0, device_drawn_s = 0;
  for (auto _ : state) {
    eager_s = median_per_call(sample);
    device_drawn_s = median_per_call(device_drawn);
    graph_s = median_per_call(replay);
    eager_host = host_per_call(sample);
    graph_host = host_per_call(replay);
    state.SetIterationTime(graph_s);
  }
  GEAR_CUDA_TRY(cudaGraphExecDestroy(exec));
  GEAR_CUDA_TRY(cudaGraphDestroy(graph));
  table_row rate("", 1 / graph_s, "sample_async, same run", 1 / eager_s, "", 0);
  rate.unit = "/s";
  record(state, rate);
  // What drawing from device memory costs on its own (the gather's last-block count and the
  // counter reads), without a graph.
  table_row eager_device(g_name + " eager with device_rng", 1 / device_drawn_s,
                         "sample_async, same run", 1 / eager_s, "", 0);
  eager_device.unit = "/s";
  record(state, eager_device);
  table_row host(g_name + " host us per call", 1e6 * graph_host, "sample_async, same run",
                 1e6 * eager_host, "<= 5 us (issue 13)", 0);
  host.unit = "us";
  host.met = graph_host <= 5e-6 ? "yes" : "no";
  record(state, host);
}

/// Issue 13's P7: host time of one sample_async with policy `policy`, B = 256 windows of 16 steps
/// of 256 B from a device buffer of 16384 trajectories: the median of rounds of calls, each round
/// timed on the host from the first call's start to the last call's return (the GPU work runs on
/// afterwards, untimed). A consuming policy's buffer is filled up again between rounds, and its
/// rounds are of 4 calls, as many as its staging areas (a fifth call would wait for the first
/// one's copies: GPU time, not the enqueue's). `work` says what each call enqueues, for the note.
template <class Policy>
void bm_enqueue(benchmark::State& state, Policy policy, const char* work) {
  constexpr std::int64_t total = 16384, len = 16, batch = 256, chunk = 1024;
  constexpr bool consuming = gear::consuming_policy<Policy>;
  constexpr std::int64_t calls = consuming ? 4 : 40;
  constexpr int rounds = consuming ? 45 : 9;
  auto& c = clock_();
  gear::replay_buffer<step_spec<256>, gear::storage::device, Policy> buf{
      gear::capacity{total}, gear::max_length{len}, policy};
  device_input<256> d(chunk, len, c.stream);
  const auto fill_up = [&] {
    while (buf.size() + chunk <= total) buf.insert(d.in, d.keys, c.stream);
    GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
  };
  fill_up();
  auto out = buf.make_batch(gear::batch_size{batch}, gear::window_length{len});
  const gear::window w{.length = len};
  gear::rng g{31};
  buf.sample(out, w, g, c.stream);  // warm: staging and events made
  std::vector<double> t;
  std::vector<std::vector<double>> by_place(4);  // each call's own time, by its place in a round
  for (auto _ : state) {
    t.clear();
    for (auto& v : by_place) v.clear();
    for (int round = 0; round < rounds; ++round) {
      fill_up();
      const double t0 = wall_seconds();
      double at = t0;
      for (std::int64_t i = 0; i < calls; ++i) {
        buf.sample_async(out, w, g, c.stream);
        const double now = wall_seconds();
        if (i < 4) by_place[static_cast<std::size_t>(i)].push_back(now - at);
        at = now;
      }
      t.push_back((at - t0) / calls);
      GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
    }
    state.SetIterationTime(median(t));
  }
  // Beside it, what one launch alone costs the host in the same run.
  table_row row("", 1e6 * median(t), "one empty launch, host", empty_launch_host_us(), "P7 <= 5 us",
                0);
  row.unit = "us";
  row.met = median(t) <= 5e-6 ? "yes" : "NO";
  // Where a round's time goes: a first call that pays for the refill shows here.
  char places[96];
  std::snprintf(places, sizeof places, "; calls 1-4 of a round: %.1f / %.1f / %.1f / %.1f us",
                1e6 * median(by_place[0]), 1e6 * median(by_place[1]), 1e6 * median(by_place[2]),
                1e6 * median(by_place[3]));
  row.note = std::string(work) + places;
  record(state, row);
}

void register_gpu_benchmarks() {
  add("limit/d2d_copy", bm_limit_d2d)->UseManualTime()->Iterations(3);
  add("limit/h2d_pinned_copy", bm_limit_h2d)->UseManualTime()->Iterations(3);
  add("limit/memcpy_mt", bm_limit_memcpy)->UseManualTime()->Iterations(3);
  // Each sample family, and the window axis right after its own, uses one cached table.
  register_sample_family<64, gear::storage::device>();
  register_sample_family<256, gear::storage::device>();
  register_sample_family<1024, gear::storage::device>();
  register_sample_family<4096, gear::storage::device>();
  register_window_axis<gear::storage::device>();
  register_sample_family<28672, gear::storage::device>();
  // 1 MiB steps: 4 trajectories of 1000 MiB; 16 windows of 64 steps move 1 GiB per call.
  add(
      "sample/device/step:1048576",
      [](benchmark::State& s) { bm_sample<1048576, gear::storage::device>(s, window_steps, true); },
      true)
      ->Arg(16)
      ->ArgName("batch")
      ->UseManualTime()
      ->MinTime(gpu_min_time)
      ->Unit(benchmark::kMicrosecond);
  register_sample_family<64, gear::storage::pinned_host>();
  register_sample_family<256, gear::storage::pinned_host>();
  register_sample_family<1024, gear::storage::pinned_host>();
  register_sample_family<4096, gear::storage::pinned_host>();
  register_window_axis<gear::storage::pinned_host>();
  register_sample_family<28672, gear::storage::pinned_host>();
  register_insert<1024>();
  register_insert<28672>();
  // Rows that repeat and time their calls themselves: one iteration, in microseconds.
  const auto add_once = [](const std::string& name, void (*f)(benchmark::State&)) {
    add(name, f)->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
  };
  add_once("prioritized/device/N:16777216/batch:4096", bm_prioritized);
  add_once("sharded/device/shards:2/step:4096/batch:256", bm_sharded<2>);
  add_once("sharded/device/shards:4/step:4096/batch:256", bm_sharded<4>);
  add_once("rank_sampler/device/ranks:2/step:4096/rows:64", bm_rank_sampler<2>);
  add_once("rank_sampler/device/ranks:4/step:4096/rows:64", bm_rank_sampler<4>);
  add_once("graph/device/step:4096/batch:256/window:1", bm_graph<1>);
  add_once("graph/device/step:4096/batch:256/window:16", bm_graph<16>);
  // P7: host time per sample_async, one row per policy.
  add_once("enqueue/device/uniform/batch:256", [](benchmark::State& s) {
    bm_enqueue(s, gear::select::uniform{}, "1 launch: rows drawn in the gather");
  });
  add_once("enqueue/device/uniform_without_replacement/batch:256", [](benchmark::State& s) {
    bm_enqueue(s, gear::select::uniform{.replacement = false},
               "1 launch: rows claimed in the gather, its last block clears the claims");
  });
  add_once("enqueue/device/prioritized/batch:256", [](benchmark::State& s) {
    bm_enqueue(s, gear::select::prioritized{},
               "1 launch: rows drawn in the gather, its last block writes the weights");
  });
  add_once("enqueue/device/recency/batch:256", [](benchmark::State& s) {
    bm_enqueue(s, gear::select::recency{.newest = 4096}, "1 launch: rows drawn in the gather");
  });
  add_once("enqueue/device/fifo/batch:256", [](benchmark::State& s) {
    bm_enqueue(s, gear::select::fifo{},
               "1 launch: the gather reads the host-chosen rows, its last block applies the "
               "removal");
  });
  register_select_axis<gear::select::uniform>();
  register_select_axis<gear::select::prioritized>();
  register_select_axis<gear::select::recency>();
  // P6 last: the largest allocations of the run (device first: the host pinning is the riskier).
  add("capacity/device", [](benchmark::State& s) { bm_capacity<gear::storage::device>(s, 120); })
      ->UseManualTime()
      ->Iterations(20)
      ->Unit(benchmark::kMillisecond);
  add("capacity/pinned_host",
      [](benchmark::State& s) { bm_capacity<gear::storage::pinned_host>(s, 64); })
      ->UseManualTime()
      ->Iterations(20)
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  add("host/sample/step:256", bm_host_sample, true)->Arg(64)->ArgName("batch")->MinTime(0.05);
  add("host/insert/step:256", bm_host_insert)->MinTime(0.05);
  const bool gpu = gear::detail::gpu_available();
  if (gpu) {
    cudaDeviceProp prop{};
    GEAR_CUDA_TRY(cudaGetDeviceProperties(&prop, 0));
    std::printf("GPU: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount,
                prop.l2CacheSize / 1e6);
    benchmark::AddCustomContext("gpu", prop.name);
    register_gpu_benchmarks();
  } else {
    std::printf("no GPU: only the host/ benchmarks are registered\n");
  }
  try {
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gear_bench: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  print_table();
  release_cached_tables();
  if (g_failed) {
    std::fprintf(stderr, "gear_bench: a benchmark's output was wrong\n");
    return 1;
  }
  return 0;
}
