#pragma once
// gear::transport::reply_writer: a shard's thread for one learner, which posts the replies the
// packer (reply_packer.hpp) has sealed, on that learner's channel endpoint (shard_peer.hpp), and
// polls the channel until their writes complete. Providers with manual progress (tcp;ofi_rxm,
// shm) move a write's bytes only while its endpoint is polled: on the shard's progress thread,
// a reply's transfer took turns with every control message and every other peer's poll, and
// small shares (a request, a pack and two writes per share) were bound by that one thread.
//
// The channel is this thread's alone once it starts (an endpoint is used by one thread at a
// time). A reply's slot passes between threads through its state alone: the progress thread
// fills an idle slot and marks it packing, the packer seals it (packed), this thread posts it
// (writing) and frees it (idle) once every write completed.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <gear/transport/libfabric.hpp>
#include <gear/transport/shard_peer.hpp>
#include <span>
#include <thread>

namespace gear::transport {

class reply_writer {
 public:
  /// Starts writing `learner`'s replies from shard `shard` (columns of `step_bytes`); failed
  /// writes are added to `failed`, nanoseconds spent posting and completing to `busy_ns`. They
  /// and `learner` outlive this writer.
  reply_writer(shard_peer& learner, std::uint32_t shard, std::span<const std::int64_t> step_bytes,
               std::atomic<std::uint64_t>& failed, std::atomic<std::uint64_t>& busy_ns)
      : learner_(learner),
        shard_(shard),
        step_bytes_(step_bytes),
        failed_(failed),
        busy_ns_(busy_ns),
        thread_([this] { run(); }) {}
  ~reply_writer() { stop(); }
  reply_writer(const reply_writer&) = delete;
  reply_writer& operator=(const reply_writer&) = delete;

  /// Stops within a poll; replies not yet posted stay unposted.
  void stop() {
    stopping_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    using clock = std::chrono::steady_clock;
    std::uint64_t idle = 0;             // rounds in a row with nothing to do
    auto last_progress = clock::now();  // a post or a completion
    while (!stopping_.load(std::memory_order_relaxed)) {
      std::size_t n = 0;
      const auto start = clock::now();
      const bool posting = learner_.replies_activity().packed;
      try {
        if (const std::uint64_t lost = learner_.post_replies(shard_, step_bytes_))
          failed_.fetch_add(lost, std::memory_order_relaxed);
        n = learner_.channel->poll([&](const fabric::completion& c) {
          for (auto& w : *learner_.writes)
            if (&w.state == c.context) shard_peer::completed(w);
          if (c.what == fabric::completion::kind::failed)
            failed_.fetch_add(1, std::memory_order_relaxed);
        });
      } catch (const std::exception&) {  // a failed poll: counted, write on
        failed_.fetch_add(1, std::memory_order_relaxed);
      }
      // A reply to post, or writes that made progress within the last second: stay on them.
      // A reply with the packer: yield, and look again. Nothing: yield at first (the next reply
      // of a learner with samples in flight is microseconds away), then sleep 50 us at a time,
      // so that an idle writer does not hold a core; so does one whose writes have made no
      // progress for a second (on shm, a write to a learner that died never completes).
      const auto now = clock::now();
      if (posting || n > 0) {
        last_progress = now;
        count_busy(busy_ns_, start);
      }
      const shard_peer::activity a = learner_.replies_activity();
      const bool hot = a.packed || (a.writing && now - last_progress < std::chrono::seconds(1));
      idle = hot || n > 0 || a.packing ? 0 : idle + 1;
      if (hot || n > 0) continue;
      if (idle < 2000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  shard_peer& learner_;
  std::uint32_t shard_;
  std::span<const std::int64_t> step_bytes_;
  std::atomic<std::uint64_t>& failed_;
  std::atomic<std::uint64_t>& busy_ns_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;  // last: it starts once everything above is built
};

}  // namespace gear::transport
