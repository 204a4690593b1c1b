#pragma once
// gear::transport::reply_packer: a shard's worker thread that selects, gathers and packs sample
// replies (pack_sample_reply, shard_operations.hpp) while the shard's progress thread goes on
// polling its endpoint. Providers with manual progress (tcp;ofi_rxm, shm) move a write's bytes
// only while someone polls: packing on the progress thread would stall the reply already on the
// wire, so a learner with two samples in flight would gain nothing.
//
// A job names its reply memory and a state the packer sets to `packed` once the reply is sealed;
// the learner's writer (reply_writer.hpp) then posts its writes. Jobs run in the order given.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/key.hpp>
#include <gear/transport/shard_operations.hpp>
#include <mutex>
#include <optional>
#include <span>
#include <thread>

namespace gear::transport {

/// Adds the time since `start` to `busy_ns`: a shard thread's work, for its stats.
inline void count_busy(std::atomic<std::uint64_t>& busy_ns,
                       std::chrono::steady_clock::time_point start) noexcept {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now() - start);
  busy_ns.fetch_add(static_cast<std::uint64_t>(ns.count()), std::memory_order_relaxed);
}

/// Where one reply write of a shard to a learner stands.
enum class reply_state : int { idle, packing, packed, writing };

template <class Buffer>
class reply_packer {
 public:
  /// What to pack, where: the request and its layout stay put (in the reply's slot) until the
  /// job's state says packed.
  struct job {
    const detail::remote::sample_request* request = nullptr;
    const detail::remote::reply_layout* layout = nullptr;
    std::span<std::byte> out;
    std::atomic<reply_state>* state = nullptr;
  };

  reply_packer(Buffer& buffer, key_owner owner)
      : buffer_(buffer), owner_(owner), thread_([this] { run(); }) {}
  ~reply_packer() {
    {
      const std::lock_guard held(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  reply_packer(const reply_packer&) = delete;
  reply_packer& operator=(const reply_packer&) = delete;

  /// Nanoseconds spent packing, from any thread.
  [[nodiscard]] std::uint64_t busy_ns() const noexcept {
    return busy_ns_.load(std::memory_order_relaxed);
  }
  /// Queues a job; its state becomes reply_state::packed once its reply is sealed (a reply of no
  /// rows when the buffer could not sample).
  void push(const job& j) {
    {
      const std::lock_guard held(mutex_);
      jobs_.push_back(j);
    }
    queued_.fetch_add(1, std::memory_order_release);
    wake_.notify_one();
  }

 private:
  void run() {
    for (;;) {
      // The next job often comes within microseconds (a learner with samples in flight), and a
      // wake-up from sleep costs tens: look for one a while before sleeping.
      const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
      while (queued_.load(std::memory_order_acquire) == 0 &&
             std::chrono::steady_clock::now() < spin_until)
        std::this_thread::yield();
      job j;
      {
        std::unique_lock held(mutex_);
        wake_.wait(held, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, nothing left
        j = jobs_.front();
        jobs_.pop_front();
      }
      queued_.fetch_sub(1, std::memory_order_relaxed);
      const auto start = std::chrono::steady_clock::now();
      pack_sample_reply(buffer_, stream_, *j.request, *j.layout, owner_, j.out,
                        scratch_);  // never throws
      count_busy(busy_ns_, start);
      j.state->store(reply_state::packed, std::memory_order_release);
    }
  }

  Buffer& buffer_;
  key_owner owner_;
  shard_stream stream_;  // the packer's own: the progress thread calls the buffer on another
  std::optional<typename Buffer::batch_type> scratch_;  // the last reply's batch, reused
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<job> jobs_;
  std::atomic<std::size_t> queued_{0};  // jobs_.size(), read without the mutex
  std::atomic<std::uint64_t> busy_ns_{0};
  bool stopping_ = false;
  std::thread thread_;  // last: it starts once everything above is built
};

}  // namespace gear::transport
