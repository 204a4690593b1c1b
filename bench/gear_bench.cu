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
// Without a GPU only the host/... benchmarks are registered (the CI smoke test runs them).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <gear/gear.cuh>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
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
  return static_cast<std::uint8_t>(slot * 251 + step * 13 + b * 7 + (b >> 8) * 3 + 1);
}

/// Fills `count` packed trajectories of trajectory_steps steps for slots first_slot, ...
__global__ void fill_kernel(std::uint8_t* out, std::int64_t first_slot, std::int64_t count,
                            std::int64_t step_bytes) {
  const std::int64_t n = count * trajectory_steps * step_bytes;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t traj = i / (trajectory_steps * step_bytes);
    const std::int64_t rest = i % (trajectory_steps * step_bytes);
    out[i] = pattern_byte(first_slot + traj, rest / step_bytes, rest % step_bytes);
  }
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
  std::string operation;
  double figure = 0;  // GB/s
  std::string limit_name;
  double limit = 0;  // GB/s, 0 if none
  std::string target;
  double target_ratio = 0;  // 0: no target
};
std::vector<table_row> g_rows;

void record(benchmark::State& state, table_row row) {
  const double ratio = row.limit > 0 ? row.figure / row.limit : 0;
  state.counters["GBps"] = row.figure;
  if (row.limit > 0) {
    state.counters["limit_GBps"] = row.limit;
    state.counters["ratio"] = ratio;
  }
  if (row.target_ratio > 0) {
    state.counters["target"] = row.target_ratio;
    state.counters["met"] = ratio >= row.target_ratio ? 1 : 0;
  }
  row.operation = g_name;
  // Google Benchmark runs a benchmark several times while it sizes the iteration count; the
  // table keeps the last run, the one it reports.
  if (!g_rows.empty() && g_rows.back().operation == row.operation)
    g_rows.back() = std::move(row);
  else
    g_rows.push_back(std::move(row));
}

void print_table() {
  if (g_rows.empty()) return;
  std::printf("\n%-58s %10s  %-16s %10s %7s  %-12s %s\n", "operation", "GB/s", "limit", "GB/s",
              "ratio", "target", "met");
  for (const auto& r : g_rows) {
    const double ratio = r.limit > 0 ? r.figure / r.limit : 0;
    char lim[32] = "-", rat[16] = "-";
    if (r.limit > 0) {
      std::snprintf(lim, sizeof lim, "%.1f", r.limit);
      std::snprintf(rat, sizeof rat, "%.0f%%", 100 * ratio);
    }
    const char* met = r.target_ratio <= 0 ? "-" : ratio >= r.target_ratio ? "yes" : "NO";
    std::printf("%-58s %10.1f  %-16s %10s %7s  %-12s %s\n", r.operation.c_str(), r.figure,
                r.limit_name.empty() ? "-" : r.limit_name.c_str(), lim, rat,
                r.target.empty() ? "-" : r.target.c_str(), met);
  }
}

// ---- limits, measured in the same process -----------------------------------------------------

struct limit_buffers {
  gear::detail::allocation dev_a{gear::memory_kind::device, limit_bytes};
  gear::detail::allocation dev_b{gear::memory_kind::device, limit_bytes};
  gear::detail::allocation pinned{gear::memory_kind::pinned_host, limit_bytes};
  std::vector<std::uint8_t> pageable = std::vector<std::uint8_t>(limit_bytes);
  limit_buffers() {
    fill_kernel<<<1024, 256, 0, clock_().stream>>>(dev_a.as<std::uint8_t>(), 0,
                                                   limit_bytes / (trajectory_steps * 1024), 1024);
    GEAR_CHECK_LAUNCH("fill_kernel");
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
      fill_kernel<<<2048, 256, 0, c.stream>>>(staging.as<std::uint8_t>(), first, n, StepBytes);
      GEAR_CHECK_LAUNCH("fill_kernel");
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

/// Checks rows of a gathered [B, L, StepBytes] batch (host copy) against the pattern: each row
/// is L consecutive steps of the slot its key (if given) names. Returns "" or what is wrong.
/// Writes the slot and first step of every row checked to slots/starts if given.
std::string check_rows(const std::uint8_t* rows, std::int64_t batch, std::int64_t step_bytes,
                       const gear::key* keys, const std::uint8_t* mask, std::int64_t max_slot,
                       std::int64_t first_row = 0, std::int64_t row_stride = 1) {
  const std::int64_t row_bytes = window_steps * step_bytes;
  for (std::int64_t r = first_row; r < batch; r += row_stride) {
    const std::uint8_t* row = rows + r * row_bytes;
    std::uint64_t header = 0;
    std::memcpy(&header, row, 8);
    const auto slot = static_cast<std::int64_t>(header >> 32);
    const auto start = static_cast<std::int64_t>(header & 0xFFFFFFFFu);
    if (slot >= max_slot || start > trajectory_steps - window_steps)
      return "row " + std::to_string(r) + ": header names slot " + std::to_string(slot) + " step " +
             std::to_string(start);
    if (keys != nullptr && keys[r].slot != static_cast<std::uint64_t>(slot))
      return "row " + std::to_string(r) + ": key slot " + std::to_string(keys[r].slot) +
             ", data of slot " + std::to_string(slot);
    for (std::int64_t t = 0; t < window_steps; ++t) {
      if (mask != nullptr && mask[r * window_steps + t] != 1)
        return "row " + std::to_string(r) + ": mask is not 1 at " + std::to_string(t);
      for (std::int64_t b = 0; b < step_bytes; ++b)
        if (row[t * step_bytes + b] != pattern_byte(slot, start + t, b))
          return "row " + std::to_string(r) + " step " + std::to_string(t) + " byte " +
                 std::to_string(b) + " differs from the pattern";
    }
  }
  return "";
}

/// Copies rows 0, B/2 and B-1 (and keys and mask) of a device batch back and checks them.
template <class Batch>
std::string check_device_batch(const Batch& out, const std::uint8_t* data, std::int64_t step_bytes,
                               std::int64_t max_slot) {
  const std::int64_t b = out.batch_size(), row_bytes = window_steps * step_bytes;
  std::vector<gear::key> keys(static_cast<std::size_t>(b));
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(b * window_steps));
  GEAR_CUDA_TRY(cudaMemcpy(keys.data(), out.keys().data(), keys.size() * sizeof(gear::key),
                           cudaMemcpyDeviceToHost));
  GEAR_CUDA_TRY(
      cudaMemcpy(mask.data(), out.mask().data_handle(), mask.size(), cudaMemcpyDeviceToHost));
  for (std::int64_t r : {std::int64_t{0}, b / 2, b - 1}) {
    std::vector<std::uint8_t> row(static_cast<std::size_t>(row_bytes));
    GEAR_CUDA_TRY(cudaMemcpy(row.data(), data + r * row_bytes, row.size(), cudaMemcpyDeviceToHost));
    std::string e = check_rows(row.data(), 1, step_bytes, keys.data() + r,
                               mask.data() + r * window_steps, max_slot);
    if (!e.empty()) return "row " + std::to_string(r) + ": " + e;
  }
  return "";
}

const char* storage_name(gear::storage::device) { return "device"; }
const char* storage_name(gear::storage::pinned_host) { return "pinned_host"; }

/// The target of sample+gather for a storage and step size, per PERF.md.
std::pair<std::string, double> sample_target(bool device, std::int64_t step) {
  if (device) {
    if (step >= 4096) return {"P1 >= 90%", 0.90};
    if (step <= 256) return {"P1s >= 75%", 0.75};
    return {"", 0};
  }
  if (step >= 1024) return {"P2 >= 90%", 0.90};
  if (step <= 256) return {"P2s >= 60%", 0.60};
  return {"", 0};
}

/// gear's sample_async (selection + fused gather) into a [batch, 64] window batch.
template <std::int64_t StepBytes, class Storage>
void bm_sample(benchmark::State& state) {
  constexpr bool device = std::is_same_v<Storage, gear::storage::device>;
  const std::int64_t batch = state.range(0);
  auto& t = sampled_table<StepBytes, Storage>::get();
  const double limit = device ? d2d_limit() : h2d_limit();
  auto out = t.buf.make_batch(gear::batch_size{batch}, gear::window_length{window_steps});
  gear::rng g{2026};
  const gear::window w{.length = window_steps, .offset = 0, .from = gear::anchor::random};
  auto& c = clock_();
  t.buf.sample(out, w, g, c.stream);
  const auto* data = reinterpret_cast<const std::uint8_t*>(out.template column<0>().data_handle());
  if (auto e = check_device_batch(out, data, StepBytes, t.slots); !e.empty()) return fail(state, e);

  const double gathered = double(batch) * window_steps * StepBytes;  // bytes read
  const double moved = device ? 2 * gathered : gathered;             // as the limit counts
  const int reps = reps_for(moved / (limit * 1e9));
  const double s = time_gpu(state, reps, [&] { t.buf.sample_async(out, w, g, c.stream); });
  state.counters["us_per_sample"] = s * 1e6;
  auto [target, ratio] = sample_target(device, StepBytes);
  record(state, {"", moved / s / 1e9, device ? "D2D copy (r+w)" : "H2D pinned copy", limit, target,
                 ratio});
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
void rows_of_batch(const std::uint8_t* data, std::int64_t batch, std::int64_t step_bytes,
                   std::vector<std::int64_t>& slots, std::vector<std::int64_t>& starts) {
  std::vector<std::uint64_t> headers(static_cast<std::size_t>(batch));
  GEAR_CUDA_TRY(cudaMemcpy2D(headers.data(), 8, data,
                             static_cast<std::size_t>(window_steps * step_bytes), 8,
                             static_cast<std::size_t>(batch), cudaMemcpyDeviceToHost));
  slots.resize(headers.size());
  starts.resize(headers.size());
  for (std::size_t i = 0; i < headers.size(); ++i) {
    slots[i] = static_cast<std::int64_t>(headers[i] >> 32);
    starts[i] = static_cast<std::int64_t>(headers[i] & 0xFFFFFFFFu);
  }
}

/// The naive gather kernel over the same rows gear's sample chose.
template <std::int64_t StepBytes, class Storage>
void bm_naive_gather(benchmark::State& state) {
  constexpr bool device = std::is_same_v<Storage, gear::storage::device>;
  const std::int64_t batch = state.range(0);
  auto& t = sampled_table<StepBytes, Storage>::get();
  const double limit = device ? d2d_limit() : h2d_limit();
  auto out = t.buf.make_batch(gear::batch_size{batch}, gear::window_length{window_steps});
  gear::rng g{7};
  auto& c = clock_();
  t.buf.sample(out, {.length = window_steps, .offset = 0, .from = gear::anchor::random}, g,
               c.stream);
  const auto* ours = reinterpret_cast<const std::uint8_t*>(out.template column<0>().data_handle());
  std::vector<std::int64_t> slots, starts;
  rows_of_batch(ours, batch, StepBytes, slots, starts);
  gear::detail::allocation rows(gear::memory_kind::device, 2 * slots.size() * sizeof(std::int64_t));
  auto* d_slots = rows.as<std::int64_t>();
  GEAR_CUDA_TRY(cudaMemcpy(d_slots, slots.data(), slots.size() * 8, cudaMemcpyHostToDevice));
  GEAR_CUDA_TRY(
      cudaMemcpy(d_slots + batch, starts.data(), starts.size() * 8, cudaMemcpyHostToDevice));
  const std::int64_t row_bytes = window_steps * StepBytes;
  gear::detail::allocation dst(gear::memory_kind::device,
                               static_cast<std::size_t>(batch * row_bytes));
  const auto ref = t.buf.ref(gear::op::write_steps{});
  const auto* base = reinterpret_cast<const std::uint8_t*>(ref.template step<0>(0, 0));
  const std::int64_t stride =
      reinterpret_cast<const std::uint8_t*>(ref.template step<0>(1, 0)) - base;
  const auto blocks = static_cast<unsigned>((batch * row_bytes + 255) / 256);
  auto launch = [&] {
    naive_gather_kernel<<<blocks, 256, 0, c.stream>>>(
        base, stride, StepBytes, d_slots, d_slots + batch, batch, dst.as<std::uint8_t>());
  };
  launch();
  GEAR_CHECK_LAUNCH("naive_gather_kernel");
  GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
  // Same bytes as gear's gather, row by row.
  {
    std::vector<std::uint8_t> a(static_cast<std::size_t>(row_bytes)), b(a.size());
    for (std::int64_t r : {std::int64_t{0}, batch / 2, batch - 1}) {
      GEAR_CUDA_TRY(cudaMemcpy(a.data(), ours + r * row_bytes, a.size(), cudaMemcpyDeviceToHost));
      GEAR_CUDA_TRY(cudaMemcpy(b.data(), dst.as<std::uint8_t>() + r * row_bytes, b.size(),
                               cudaMemcpyDeviceToHost));
      if (a != b)
        return fail(state, "naive gather differs from gear's at row " + std::to_string(r));
      if (auto e = check_rows(b.data(), 1, StepBytes, nullptr, nullptr, t.slots); !e.empty())
        return fail(state, e);
    }
  }
  const double gathered = double(batch) * row_bytes;
  const double moved = device ? 2 * gathered : gathered;
  const int reps = reps_for(moved / (limit * 1e9));
  const double s = time_gpu(state, reps, launch);
  record(state, {"", moved / s / 1e9, device ? "D2D copy (r+w)" : "H2D pinned copy", limit, "", 0});
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
    if (auto e = check_rows(back.data(), batch, StepBytes, nullptr, nullptr, t.slots, 0,
                            std::max<std::int64_t>(1, batch / 4));
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

/// Insert from device memory into device storage: 256 MiB of trajectories per insert_async.
template <std::int64_t StepBytes>
void bm_insert_device(benchmark::State& state) {
  g_table.reset();
  g_table_name.clear();
  using buffer_type = gear::replay_buffer<step_spec<StepBytes>, gear::storage::device>;
  constexpr std::int64_t trajectory_bytes = StepBytes * trajectory_steps;
  const std::int64_t count = std::max<std::int64_t>(1, 256 * mib / trajectory_bytes);
  const double limit = d2d_limit();
  buffer_type buf{gear::capacity{4 * count}, gear::max_length{trajectory_steps}};
  gear::detail::allocation src(gear::memory_kind::device,
                               static_cast<std::size_t>(count * trajectory_bytes));
  auto& c = clock_();
  fill_kernel<<<2048, 256, 0, c.stream>>>(src.as<std::uint8_t>(), 0, count, StepBytes);
  GEAR_CHECK_LAUNCH("fill_kernel");
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(count), trajectory_steps);
  std::vector<gear::key> keys(static_cast<std::size_t>(count));
  const gear::trajectories<step_spec<StepBytes>> in{
      lengths, {gear::input(src.as<const std::uint8_t>(), {StepBytes})}, gear::memory_kind::device};
  const double bytes = double(count) * trajectory_bytes;
  const double s = time_gpu(state, 4, [&] { buf.insert_async(in, keys, c.stream); });
  GEAR_CUDA_TRY(cudaStreamSynchronize(c.stream));
  // The last trajectory of the last insert, byte for byte.
  {
    const auto ref = buf.ref(gear::op::write_steps{});
    std::vector<std::uint8_t> a(static_cast<std::size_t>(trajectory_bytes)), b(a.size());
    GEAR_CUDA_TRY(cudaMemcpy(a.data(),
                             ref.template step<0>(static_cast<std::int64_t>(keys.back().slot), 0),
                             a.size(), cudaMemcpyDeviceToHost));
    GEAR_CUDA_TRY(cudaMemcpy(b.data(), src.as<std::uint8_t>() + (count - 1) * trajectory_bytes,
                             b.size(), cudaMemcpyDeviceToHost));
    if (a != b || b[8] != pattern_byte(count - 1, 0, 8))
      return fail(state, "stored trajectory differs from its source");
  }
  record(state, {"", 2 * bytes / s / 1e9, "D2D copy (r+w)", limit, "P4 >= 85%", 0.85});
}

/// Insert from pageable host memory into pinned_host storage: 256 MiB per insert.
template <std::int64_t StepBytes>
void bm_insert_pinned(benchmark::State& state) {
  g_table.reset();
  g_table_name.clear();
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
      ref.template step<0>(static_cast<std::int64_t>(keys.back().slot), 0));
  if (std::memcmp(stored, src.data() + (count - 1) * trajectory_bytes,
                  static_cast<std::size_t>(trajectory_bytes)) != 0)
    return fail(state, "stored trajectory differs from its source");
  record(state, {"", bytes / median(times) / 1e9, "memcpy, 16 threads", limit, "P4h >= 70%", 0.70});
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
  if (auto e = check_rows(reinterpret_cast<const std::uint8_t*>(out.column<0>().data_handle()),
                          batch, 256, out.keys().data(), out.mask().data_handle(), host_slots);
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
  if (std::memcmp(ref.step<0>(static_cast<std::int64_t>(keys.back().slot), 0),
                  src.data() + (count - 1) * trajectory_steps * 256, trajectory_steps * 256) != 0)
    return fail(state, "stored trajectory differs from its source");
  state.counters["GBps"] =
      benchmark::Counter(double(src.size()) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- registration -----------------------------------------------------------------------------

/// Registers fn under `name`, remembering the name (with its argument) for the table.
benchmark::internal::Benchmark* add(const std::string& name, void (*fn)(benchmark::State&),
                                    bool batch_arg = false) {
  return benchmark::RegisterBenchmark(name.c_str(), [name, fn, batch_arg](benchmark::State& s) {
    g_name = batch_arg ? name + "/batch:" + std::to_string(s.range(0)) : name;
    fn(s);
  });
}

template <std::int64_t StepBytes, class Storage>
void register_sample_family() {
  const std::string tag =
      std::string(storage_name(Storage{})) + "/step:" + std::to_string(StepBytes);
  // Small steps also at batch 4096, where launch latency no longer dominates.
  for (std::int64_t batch : {256, 1024, 4096}) {
    if (batch == 4096 && StepBytes > 1024) continue;
    add("sample/" + tag, bm_sample<StepBytes, Storage>, true)
        ->Arg(batch)
        ->ArgName("batch")
        ->UseManualTime()
        ->MinTime(gpu_min_time)
        ->Unit(benchmark::kMicrosecond);
    add("naive_gather/" + tag, bm_naive_gather<StepBytes, Storage>, true)
        ->Arg(batch)
        ->ArgName("batch")
        ->UseManualTime()
        ->MinTime(gpu_min_time)
        ->Unit(benchmark::kMicrosecond);
    if constexpr (std::is_same_v<Storage, gear::storage::pinned_host>)
      add("cpu_pipeline/" + tag, bm_cpu_pipeline<StepBytes>, true)
          ->Arg(batch)
          ->ArgName("batch")
          ->UseManualTime()
          ->MinTime(gpu_min_time)
          ->Unit(benchmark::kMicrosecond);
  }
}

template <std::int64_t StepBytes>
void register_insert() {
  add("insert/device_from_device/step:" + std::to_string(StepBytes), bm_insert_device<StepBytes>)
      ->UseManualTime()
      ->MinTime(gpu_min_time)
      ->Unit(benchmark::kMicrosecond);
  add("insert/pinned_host_from_host/step:" + std::to_string(StepBytes), bm_insert_pinned<StepBytes>)
      ->UseManualTime()
      ->MinTime(gpu_min_time)
      ->Unit(benchmark::kMicrosecond);
}

void register_gpu_benchmarks() {
  add("limit/d2d_copy", bm_limit_d2d)->UseManualTime()->Iterations(3);
  add("limit/h2d_pinned_copy", bm_limit_h2d)->UseManualTime()->Iterations(3);
  add("limit/memcpy_mt", bm_limit_memcpy)->UseManualTime()->Iterations(3);
  register_sample_family<256, gear::storage::device>();
  register_sample_family<1024, gear::storage::device>();
  register_sample_family<4096, gear::storage::device>();
  register_sample_family<28672, gear::storage::device>();
  register_sample_family<256, gear::storage::pinned_host>();
  register_sample_family<1024, gear::storage::pinned_host>();
  register_sample_family<4096, gear::storage::pinned_host>();
  register_sample_family<28672, gear::storage::pinned_host>();
  register_insert<1024>();
  register_insert<28672>();
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
  g_table.reset();
  if (g_failed) {
    std::fprintf(stderr, "gear_bench: a benchmark's output was wrong\n");
    return 1;
  }
  return 0;
}
