#pragma once
// The streams of a sharded_buffer's shards and how a call's work on them is ordered with the
// caller's stream (fork: the shard's stream waits for an event recorded on the caller's; join: the
// caller's waits for one recorded on the shard's), the read-back of each shard's selection mass,
// the rows each shard wrote into a sample with their global factor (shard_parts), and the updates
// from device memory that may still run (updates_in_flight). For storage::host every stream is
// the null stream and nothing is recorded.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cuda/stream_ref>
#include <deque>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>
#include <gear/detail/remote/split.hpp>
#include <gear/error.hpp>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace gear::detail {

/// The most shards of one sharded_buffer.
inline constexpr std::size_t max_local_shards = 64;

/// The rows of a sample each shard wrote, [first, first + rows), and its factor M_s / M.
struct shard_parts {
  std::int64_t first[max_local_shards] = {};
  std::int64_t rows[max_local_shards] = {};
  double factor[max_local_shards] = {};
  int count = 0;
  void add(std::int64_t f, std::int64_t r, double x) noexcept {
    first[count] = f;
    rows[count] = r;
    factor[count] = x;
    ++count;
  }
};

/// P_i = factor * local for each part's rows; with beta > 0, weights (P_min / P_i)^beta, which is
/// the union's (N P_i)^-beta normalised by the batch maximum (0 where P_i is 0).
inline void globalize_on_host(float* probabilities, float* weights, const shard_parts& parts,
                              double beta) {
  double smallest = INFINITY;
  for (int k = 0; k < parts.count; ++k)
    for (std::int64_t i = parts.first[k]; i < parts.first[k] + parts.rows[k]; ++i) {
      const double p = remote::global_probability(parts.factor[k], 1.0, probabilities[i]);
      if (p > 0 && p < smallest) smallest = p;
    }
  for (int k = 0; k < parts.count; ++k)
    for (std::int64_t i = parts.first[k]; i < parts.first[k] + parts.rows[k]; ++i) {
      const double p = remote::global_probability(parts.factor[k], 1.0, probabilities[i]);
      if (beta > 0) weights[i] = p > 0 ? static_cast<float>(std::pow(smallest / p, beta)) : 0.0f;
      probabilities[i] = static_cast<float>(p);
    }
}

/// Throws errc::invalid_argument unless `device` is a CUDA device of this machine.
inline void check_device_ordinal(int device) {
  int count = 0;
  GEAR_REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess && device >= 0 && device < count,
               errc::invalid_argument,
               "device " + std::to_string(device) + " is not one of this machine's " +
                   std::to_string(count) + " CUDA devices");
}

inline int current_device_ordinal() {
  int d = 0;
  GEAR_CUDA_TRY(cudaGetDevice(&d));
  return d;
}

/// Lets kernels on device `from` access memory of device `to` (peer access, enabled here unless
/// it is already). Returns false where the two devices have no peer access. Throws
/// errc::cuda_error.
inline bool enable_peer_access(int from, int to) {
  int can = 0;
  GEAR_CUDA_TRY(cudaDeviceCanAccessPeer(&can, from, to));
  if (can == 0) return false;
  const device_scope scope(from);
  const cudaError_t enabled = cudaDeviceEnablePeerAccess(to, 0);
  if (enabled == cudaErrorPeerAccessAlreadyEnabled)
    (void)cudaGetLastError();
  else
    GEAR_CUDA_TRY(enabled);
  return true;
}

/// The updates from device memory that may still run: an event after each, on its caller's
/// stream, dropped once seen reached and kept for the next update on its device.
class updates_in_flight {
 public:
  /// Records the event of an update just enqueued on `stream` (nothing if that fails: a broken
  /// context fails every later call anyway).
  void note(cuda::stream_ref stream) noexcept {
    try {
      const int here = current_device_ordinal();
      const auto spare = std::find_if(spare_.begin(), spare_.end(),
                                      [&](const noted& n) { return n.device == here; });
      noted n = spare != spare_.end() ? std::move(*spare) : noted{here, event::make()};
      if (spare != spare_.end()) spare_.erase(spare);
      GEAR_CUDA_TRY(cudaEventRecord(n.done.get(), stream.get()));
      events_.push_back(std::move(n));
    } catch (...) {
    }
  }
  /// True once every update noted has finished (with `wait`, waits for them).
  bool finished(bool wait) {
    while (!events_.empty()) {
      if (wait)
        GEAR_CUDA_TRY(cudaEventSynchronize(events_.front().done.get()));
      else if (!event_reached(events_.front().done.get()))
        return false;
      spare_.push_back(std::move(events_.front()));
      events_.pop_front();
    }
    return true;
  }

 private:
  struct noted {
    int device;
    event done;  // made on `device`, where a stream records it
  };
  std::deque<noted> events_;
  std::vector<noted> spare_;
};

class shard_streams {
 public:
  shard_streams() = default;
  /// A stream per shard on its device (none for host storage, gpu false).
  shard_streams(const std::vector<int>& devices, bool gpu) : devices_(devices) {
    if (!gpu) return;
    int count = 0;
    GEAR_CUDA_TRY(cudaGetDeviceCount(&count));
    forks_.resize(static_cast<std::size_t>(count));
    try {
      for (const int d : devices_) {
        const device_scope scope(d);
        cudaStream_t made{};
        GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking));
        streams_.push_back(made);
        joins_.push_back(event::make());
        mass_events_.push_back(event::make());
        masses_.emplace_back(memory_kind::pinned_host, sizeof(double));
      }
    } catch (...) {  // the streams made so far go with the half-built object
      destroy();
      throw;
    }
    mass_sent_.assign(devices_.size(), false);
  }
  shard_streams(shard_streams&& o) noexcept { *this = std::move(o); }
  shard_streams& operator=(shard_streams&& o) noexcept {
    destroy();
    devices_ = std::move(o.devices_);
    streams_ = std::move(o.streams_);
    forks_ = std::move(o.forks_);
    joins_ = std::move(o.joins_);
    mass_events_ = std::move(o.mass_events_);
    masses_ = std::move(o.masses_);
    mass_sent_ = std::move(o.mass_sent_);
    peers_ = std::move(o.peers_);
    started_ = o.started_;
    o.streams_.clear();
    return *this;
  }
  ~shard_streams() { destroy(); }

  [[nodiscard]] cuda::stream_ref of(std::size_t s) const noexcept {
    return gpu() ? cuda::stream_ref{streams_[s]} : no_stream();
  }
  [[nodiscard]] std::mutex& mutex() noexcept { return mutex_; }
  /// GPU shards: a stream each (none for host storage).
  [[nodiscard]] bool gpu() const noexcept { return !streams_.empty(); }

  /// Records the caller's point: shards started after this wait for its earlier work.
  void fork(cuda::stream_ref caller) {
    if (!gpu()) return;
    event& e = forks_.at(static_cast<std::size_t>(current_device_ordinal()));
    if (e.get() == nullptr) e = event::make();
    GEAR_CUDA_TRY(cudaEventRecord(e.get(), caller.get()));
    fork_ = e.get();
  }
  /// Shard s's stream waits for the last fork.
  void start(std::size_t s) {
    started_ = s;
    if (gpu()) GEAR_CUDA_TRY(cudaStreamWaitEvent(streams_[s], fork_, 0));
  }
  /// Shard s's work of this call is enqueued: the caller will wait for it at join.
  void finish(std::size_t s) {
    if (!gpu()) return;
    GEAR_CUDA_TRY(cudaEventRecord(joins_[s].get(), streams_[s]));
    joined_.push_back(s);
  }
  /// Shard `started`'s work so far, for a call that failed between start and finish: the last
  /// shard started.
  void finish_any() {
    if (gpu() && started_ < streams_.size()) finish(started_);
  }
  /// The caller's stream waits for every shard finished since the last join.
  void join(cuda::stream_ref caller) {
    for (const std::size_t s : joined_)
      GEAR_CUDA_TRY(cudaStreamWaitEvent(caller.get(), joins_[s].get(), 0));
    joined_.clear();
  }
  /// Runs f with the stream shard s's work goes on: the caller's own when the shard is on the
  /// current device (or host storage), else the shard's, forked from and joined to the caller's.
  template <class F>
  void run(std::size_t s, cuda::stream_ref caller, F&& f) {
    if (!gpu() || devices_[s] == current_device_ordinal()) return f(caller);
    const std::lock_guard<std::mutex> held(mutex_);
    run_held(s, caller, std::forward<F>(f));
  }
  /// run, by a caller that holds mutex().
  template <class F>
  void run_held(std::size_t s, cuda::stream_ref caller, F&& f) {
    if (!gpu() || devices_[s] == current_device_ordinal()) return f(caller);
    fork(caller);
    start(s);
    try {
      f(of(s));
    } catch (...) {
      try {
        finish(s);
        join(caller);
      } catch (...) {  // a broken context: the shard that failed is unusable already
      }
      throw;
    }
    finish(s);
    join(caller);
  }

  /// Makes sure kernels on device `from` can write memory of device `to` (peer access, enabled
  /// here the first time a pair is asked for, remembered after). Throws errc::wrong_memory where
  /// the devices cannot reach each other, before anything is enqueued.
  void reach(int from, int to) {
    if (!gpu() || from == to) return;
    const auto count = forks_.size();
    if (peers_.size() != count * count) peers_.assign(count * count, 0);
    signed char& known =
        peers_.at(static_cast<std::size_t>(from) * count + static_cast<std::size_t>(to));
    if (known == 0) known = enable_peer_access(from, to) ? 1 : -1;
    GEAR_REQUIRE(known > 0, errc::wrong_memory,
                 "a shard on device " + std::to_string(from) + " cannot reach memory of device " +
                     std::to_string(to) +
                     ": the devices have no peer access (use memory on the shard's device, or "
                     "memory both reach)");
  }

  /// Makes sure every shard's device reaches `p` where it is device memory (reach; other memory
  /// needs nothing, and a pointer the runtime does not know is left to the shards' checks).
  void reach_pointer(const void* p) {
    const std::lock_guard<std::mutex> held(mutex_);
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (a.type == cudaMemoryTypeDevice)
      for (const int d : devices_) reach(d, a.device);
  }

  void synchronize(cuda::stream_ref caller) const {
    if (!gpu()) return;
    refuse_capture(caller);
    GEAR_CUDA_TRY(cudaStreamSynchronize(caller.get()));
  }
  /// Throws errc::invalid_argument while `caller` captures a CUDA graph (no sharded_buffer call
  /// may be captured: the shards' streams and read-backs would not replay).
  void refuse_capture(cuda::stream_ref caller) const {
    if (gpu()) detail::refuse_capture(caller);
  }
  void synchronize_all() const {
    for (cudaStream_t s : streams_) GEAR_CUDA_TRY(cudaStreamSynchronize(s));
  }
  /// synchronize_all for destructors: errors are ignored (a broken context has nothing left to
  /// wait for).
  void synchronize_all_noexcept() const noexcept {
    for (cudaStream_t s : streams_) (void)cudaStreamSynchronize(s);
  }

  /// Copies the double at `device_value` (shard s's root) to the host after shard s's work so far.
  void read_back(std::size_t s, const double* device_value) {
    GEAR_CUDA_TRY(cudaMemcpyAsync(masses_[s].data(), device_value, sizeof(double),
                                  cudaMemcpyDeviceToHost, streams_[s]));
    GEAR_CUDA_TRY(cudaEventRecord(mass_events_[s].get(), streams_[s]));
    mass_sent_[s] = true;
  }
  [[nodiscard]] bool mass_sent(std::size_t s) const noexcept { return gpu() && mass_sent_[s]; }
  /// The value the last read_back of shard s brought, if it has arrived.
  bool mass_read(std::size_t s, double& mass) const {
    if (!mass_sent_[s] || !event_reached(mass_events_[s].get())) return false;
    mass = *masses_[s].as<const double>();
    return true;
  }

 private:
  void destroy() noexcept {
    for (cudaStream_t s : streams_) {
      (void)cudaStreamSynchronize(s);
      (void)cudaStreamDestroy(s);
    }
    streams_.clear();
  }

  std::vector<int> devices_;
  std::vector<cudaStream_t> streams_;
  std::vector<event> forks_;  // by device ordinal, made when first used
  cudaEvent_t fork_ = nullptr;
  std::vector<event> joins_;
  std::vector<std::size_t> joined_;
  std::size_t started_ = ~std::size_t{0};  // the last shard started
  std::vector<event> mass_events_;
  std::vector<allocation> masses_;  // pinned: each shard's last root read back
  std::vector<bool> mass_sent_;
  std::vector<signed char> peers_;  // [from * devices + to]: 0 not asked, 1 enabled, -1 impossible
  std::mutex mutex_;
};

}  // namespace gear::detail
