#pragma once
// Host-side copies of packed trajectories into slots, spread over several threads when large:
// one CPU thread cannot saturate host memory bandwidth, which host-to-pinned inserts need. The
// threads are the process's copy workers, started once (copy_pool).

#include <sched.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
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

/// The hardware threads this process may run on (its CPU affinity: a container's cpuset; at
/// least 1), asked of the system once: the query costs system calls, and copies ask for every
/// host-data insert.
inline unsigned hardware_threads() noexcept {
  static const unsigned n = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
      return static_cast<unsigned>(CPU_COUNT(&set));
    return std::max(1u, std::thread::hardware_concurrency());
  }();
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
/// hardware threads, up to max_copy_threads - 1) and kept: a large copy hands parts of itself to
/// them rather than starting threads of its own, and callers on many threads at once (actors
/// inserting) share them instead of each starting its own. A caller works on its own job's parts
/// too and waits only for parts a worker has taken, so a job finishes with every worker busy,
/// with none started (threads refused, memory short), or in a child process after fork(), where
/// the parent's workers do not exist (a child runs its parts on the caller alone). The pool is
/// never destroyed: a thread may still copy while the process exits, and a child of fork exits
/// without touching state copied from its parent.
class copy_pool {
 public:
  static copy_pool& instance() {
    static copy_pool& pool = *new copy_pool;  // never destroyed (above)
    return pool;
  }
  copy_pool(const copy_pool&) = delete;
  copy_pool& operator=(const copy_pool&) = delete;

  /// Runs f(t) once for every t in [0, n), on the calling thread and the workers, and returns
  /// when all have run. f must not throw (it would end the process).
  template <class F>
  void run(unsigned n, F& f) noexcept {
    job j{[](const void* g, unsigned t) noexcept { (*static_cast<F*>(const_cast<void*>(g)))(t); },
          std::addressof(f), n};
    std::unique_lock held(mutex_, std::defer_lock);
    bool shared = n > 1 && getpid() == owner_;  // (a child of fork: no workers)
    if (shared) {
      held.lock();
      start_workers(n - 1);
      try {
        jobs_.push_back(&j);
      } catch (...) {  // no memory to queue it: the caller runs every part
        shared = false;
        held.unlock();
      }
    }
    if (!shared) {
      for (unsigned t = 0; t < n; ++t) f(t);
      return;
    }
    for (std::size_t w = 1; w < n && w <= workers_.size(); ++w) wake_.notify_one();
    while (j.next < j.n) {  // the caller's share: what no worker has taken
      const unsigned t = j.next++;
      if (j.next == j.n) std::erase(jobs_, &j);
      held.unlock();
      j.call(j.f, t);
      held.lock();
      ++j.done;
    }
    j.finished.wait(held, [&] { return j.done == j.n; });
  }

  /// Workers started so far.
  [[nodiscard]] std::size_t workers() const {
    const std::lock_guard held(mutex_);
    return workers_.size();
  }

 private:
  struct job {
    void (*call)(const void*, unsigned) noexcept;
    const void* f;
    unsigned n;
    unsigned next = 0, done = 0;         // parts taken, parts run (under the mutex)
    std::condition_variable finished{};  // done == n; notified under the mutex
  };
  copy_pool() = default;
  ~copy_pool() = delete;

  void start_workers(unsigned wanted) noexcept {  // with the mutex held
    const unsigned most = std::min({wanted, hardware_threads() - 1, max_copy_threads - 1});
    while (workers_.size() < most) {
      try {
        workers_.emplace_back([this] { work(); });
      } catch (...) {  // no thread or no memory now: the callers do the work, a later call tries
        return;
      }
    }
  }
  [[noreturn]] void work() {
    std::unique_lock held(mutex_);
    for (;;) {
      wake_.wait(held, [&] { return !jobs_.empty(); });
      job& j = *jobs_.front();
      const unsigned t = j.next++;
      if (j.next == j.n) jobs_.pop_front();  // every part taken: the caller no longer waits on it
      held.unlock();
      j.call(j.f, t);
      held.lock();
      // Under the mutex: the caller cannot see done == n, return and end j before this is over.
      if (++j.done == j.n) j.finished.notify_one();
    }
  }

  const pid_t owner_ = getpid();
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<job*> jobs_;  // jobs with parts no thread has taken
  std::vector<std::thread> workers_;
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
