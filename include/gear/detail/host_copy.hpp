#pragma once
// Host-side copies of packed trajectories into slots, spread over several threads when large:
// one CPU thread cannot saturate host memory bandwidth, which host-to-pinned inserts need. The
// threads are the process's copy workers, started once (copy_pool).

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

namespace gear::detail {

/// Bytes below which a host copy stays on the calling thread, and bytes per extra thread.
inline constexpr std::int64_t parallel_copy_grain = std::int64_t{4} << 20;
/// Most threads one host copy uses.
inline constexpr unsigned max_copy_threads = 16;

/// The machine's hardware threads (at least 1), asked of the system once: the query is a system
/// call, and copies ask for every host-data insert.
inline unsigned hardware_threads() noexcept {
  static const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

/// Threads worth using for a copy of `bytes` bytes.
inline unsigned copy_threads_for(std::int64_t bytes) noexcept {
  const unsigned hardware = hardware_threads();
  const auto wanted =
      static_cast<unsigned>(std::min<std::int64_t>(bytes / parallel_copy_grain, 64));
  return std::clamp(wanted, 1u, std::min(hardware, max_copy_threads));
}

/// Worker threads that host copies share, started once for the process (one fewer than the
/// cores, up to max_copy_threads - 1) and kept: a large copy hands parts of itself to them
/// rather than starting threads of its own, and callers on many threads at once (actors
/// inserting) share them instead of each starting its own. A caller works on its own job's parts
/// too and waits only for parts a worker has taken, so a job finishes with every worker busy, with
/// none started (threads refused), or in a child process after fork(), where the parent's
/// workers do not exist (a child runs its parts on the caller alone).
class copy_pool {
 public:
  static copy_pool& instance() {
    static copy_pool pool;
    return pool;
  }
  copy_pool(const copy_pool&) = delete;
  copy_pool& operator=(const copy_pool&) = delete;
  ~copy_pool() {
    {
      const std::lock_guard held(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    workers_.clear();  // joins
  }

  /// Runs f(t) once for every t in [0, n), on the calling thread and the workers, and returns
  /// when all have run. f must not throw.
  template <class F>
  void run(unsigned n, F& f) {
    job j{[](void* g, unsigned t) { (*static_cast<F*>(g))(t); }, &f, n};
    if (n <= 1 || getpid() != owner_) {  // (a child of fork: no workers)
      for (unsigned t = 0; t < n; ++t) f(t);
      return;
    }
    std::unique_lock held(mutex_);
    start_workers(n - 1);
    jobs_.push_back(&j);
    held.unlock();
    wake_.notify_all();
    held.lock();
    while (j.next < j.n) {  // the caller's share: what no worker has taken
      const unsigned t = j.next++;
      if (j.next == j.n) std::erase(jobs_, &j);
      held.unlock();
      j.call(j.f, t);
      held.lock();
      ++j.done;
    }
    std::erase(jobs_, &j);
    finished_.wait(held, [&] { return j.done == j.n; });
  }

  /// Workers started so far.
  [[nodiscard]] std::size_t workers() const {
    const std::lock_guard held(mutex_);
    return workers_.size();
  }

 private:
  struct job {
    void (*call)(void*, unsigned);
    void* f;
    unsigned n;
    unsigned next = 0, done = 0;  // parts taken, parts run (under the mutex)
  };
  copy_pool() = default;

  void start_workers(unsigned wanted) {  // with the mutex held
    const unsigned cores = hardware_threads();
    const unsigned most = std::min({wanted, cores - 1, max_copy_threads - 1});
    while (workers_.size() < most && !refused_) {
      try {
        workers_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {
        refused_ = true;  // the callers do the work
      }
    }
  }
  void work() {
    std::unique_lock held(mutex_);
    for (;;) {
      wake_.wait(held, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job& j = *jobs_.front();
      const unsigned t = j.next++;
      if (j.next == j.n) jobs_.pop_front();  // every part taken: the caller no longer waits on it
      held.unlock();
      j.call(j.f, t);
      held.lock();
      if (++j.done == j.n) finished_.notify_all();  // j may go once the mutex is let go
    }
  }

  const pid_t owner_ = getpid();
  mutable std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::deque<job*> jobs_;  // jobs with parts no thread has taken
  std::vector<std::jthread> workers_;
  bool stopping_ = false, refused_ = false;
};

/// Runs f(t) for t in [0, n): t = 0 on the calling thread and the others on the process's copy
/// workers where they are free (copy_pool), else on the calling thread. f must not throw.
template <class F>
void parallel_for(unsigned n, F&& f) {
  if (n <= 1) {
    f(0u);
    return;
  }
  copy_pool::instance().run(n, f);
}

/// Copies share `part` of `parts` of one packed column into slots: the bytes
/// [total * part / parts, total * (part + 1) / parts) of the packed source, where trajectory i
/// (lengths[i] steps of step_bytes) goes to dst_of(i).
template <class DstOf>
void copy_packed_share(const std::byte* src, std::span<const std::int64_t> lengths,
                       std::int64_t step_bytes, DstOf&& dst_of, unsigned part, unsigned parts) {
  std::int64_t total = 0;
  for (std::int64_t l : lengths) total += l * step_bytes;
  const std::int64_t lo = total * part / parts, hi = total * (part + 1) / parts;
  std::int64_t at = 0;
  for (std::size_t i = 0; i < lengths.size() && at < hi; ++i) {
    const std::int64_t bytes = lengths[i] * step_bytes;
    const std::int64_t from = std::max(lo, at), to = std::min(hi, at + bytes);
    if (from < to)
      std::memcpy(dst_of(i) + (from - at), src + from, static_cast<std::size_t>(to - from));
    at += bytes;
  }
}

}  // namespace gear::detail
