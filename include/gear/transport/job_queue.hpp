#pragma once
// gear::transport::job_queue: the queue between a shard's progress thread and one of its worker
// threads (reply_packer.hpp, entry_inserter.hpp). Jobs come out in the order pushed. A worker
// that finds none looks again for a while before it sleeps: the next job of a busy peer is often
// microseconds away, and a wake-up from sleep costs tens.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>

namespace gear::transport {

template <class Job>
class job_queue {
 public:
  /// Queues `j` (throws std::bad_alloc, queuing nothing); false, queuing nothing, once stopped.
  bool push(const Job& j) {
    {
      const std::lock_guard held(mutex_);
      if (stopping_) return false;
      jobs_.push_back(j);
    }
    queued_.fetch_add(1, std::memory_order_release);
    wake_.notify_one();
    return true;
  }
  /// The next job into `j`, waiting for one; false once stopped with none left.
  bool pop(Job& j) {
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    while (queued_.load(std::memory_order_acquire) == 0 &&
           !stopping_flag_.load(std::memory_order_relaxed) &&
           std::chrono::steady_clock::now() < spin_until)
      std::this_thread::yield();
    std::unique_lock held(mutex_);
    wake_.wait(held, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return false;
    j = jobs_.front();
    jobs_.pop_front();
    queued_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }
  /// Jobs queued and not yet taken, from any thread.
  [[nodiscard]] std::size_t size() const noexcept {
    return queued_.load(std::memory_order_acquire);
  }
  /// Refuses later pushes; pop hands out what is queued, then returns false.
  void stop() {
    {
      const std::lock_guard held(mutex_);
      stopping_ = true;
    }
    stopping_flag_.store(true, std::memory_order_relaxed);
    wake_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> jobs_;
  std::atomic<std::size_t> queued_{0};  // jobs_.size(), read without the mutex
  bool stopping_ = false;
  std::atomic<bool> stopping_flag_{false};  // stopping_, read without the mutex
};

}  // namespace gear::transport
