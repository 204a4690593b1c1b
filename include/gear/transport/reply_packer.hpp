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
#include <cstdint>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/key.hpp>
#include <gear/transport/job_queue.hpp>
#include <gear/transport/shard_operations.hpp>
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
    jobs_.stop();  // its last jobs done first
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
  void push(const job& j) { (void)jobs_.push(j); }

 private:
  void run() {
    for (job j; jobs_.pop(j);) {
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
  job_queue<job> jobs_;
  std::atomic<std::uint64_t> busy_ns_{0};
  std::thread thread_;  // last: it starts once everything above is built
};

}  // namespace gear::transport
