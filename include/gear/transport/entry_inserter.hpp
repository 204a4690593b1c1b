#pragma once
// gear::transport::entry_inserter: a shard's worker thread that inserts the entries actors
// published (checked by the progress thread, shard_server.hpp) into the buffer, in the order they
// were checked, while the progress thread goes on polling: an insert copies the entry's bytes out
// of the actor's ring, and with manual progress (tcp;ofi_rxm, shm) nothing else moves on the
// progress thread while it copies. Each insert's outcome (its key, or no ticket when the buffer
// refused it) comes back to the progress thread, which acknowledges it: the actor's blocks stay
// taken until then, so the ring bytes an insert reads cannot be overwritten under it.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <gear/detail/remote/entry.hpp>
#include <gear/error.hpp>
#include <gear/insert.hpp>
#include <gear/key.hpp>
#include <gear/transport/job_queue.hpp>
#include <gear/transport/reply_packer.hpp>
#include <gear/transport/shard_operations.hpp>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

namespace gear::transport {

template <class Buffer>
class entry_inserter {
 public:
  using spec = typename Buffer::spec_type;

  /// A checked entry: its columns in the actor's ring, and what its acknowledgement names.
  struct job {
    std::uint32_t peer = 0;  // the actor (1-based, as in the completion data)
    std::int64_t length = 0;
    std::array<const std::byte*, spec::num_columns> columns{};
    detail::remote::ack ack;  // stored filled in by the insert
  };

  /// The job for an entry of `length` steps checked at `entry` (its header) in peer's ring.
  static job job_for(std::uint32_t peer, const std::byte* entry, std::int64_t length,
                     std::uint32_t block_bytes, const detail::remote::ack& ack) {
    const auto layout = detail::remote::layout_entry(spec::step_bytes, length, block_bytes);
    job j;
    j.peer = peer;
    j.length = length;
    for (std::size_t c = 0; c < spec::num_columns; ++c)
      j.columns[c] = entry + detail::remote::entry_header_bytes + layout.column_at[c];
    j.ack = ack;
    return j;
  }

  entry_inserter(Buffer& buffer, key_owner owner)
      : buffer_(buffer), owner_(owner), thread_([this] { run(); }) {}
  ~entry_inserter() { stop(); }
  entry_inserter(const entry_inserter&) = delete;
  entry_inserter& operator=(const entry_inserter&) = delete;

  /// Inserts what is queued, then ends the thread; later pushes are dropped.
  void stop() {
    jobs_.stop();
    if (thread_.joinable()) thread_.join();
  }

  /// Queues an entry (throws std::bad_alloc, queuing nothing).
  void push(const job& j) {
    {
      const std::lock_guard held(mutex_);  // room for every queued job and the one inserting
      done_.reserve(done_.size() + jobs_.size() + 2);
    }
    if (jobs_.push(j)) outstanding_.fetch_add(1, std::memory_order_release);
  }
  /// On the thread that acknowledges (the shard's progress thread): acknowledges each entry
  /// inserted (or refused: no ticket) and not yet acknowledged, in order, in one message per
  /// actor (a bundle of its acknowledgements, detail/remote/frame.hpp; more where one message
  /// would not hold them): calls send(message, peer). Returns how many. If the messages cannot be
  /// built (memory), none goes and the next call tries again; a send that throws loses its own
  /// acknowledgements only, the others still go, and the first such error is thrown at the end.
  template <class Send>
  std::size_t acknowledge(Send&& send) {
    namespace remote = detail::remote;
    if (done_count_.load(std::memory_order_acquire) != 0) {
      const std::lock_guard held(mutex_);
      taken_.insert(taken_.end(), done_.begin(), done_.end());
      done_.clear();  // its capacity kept: push reserved it
      done_count_.store(0, std::memory_order_relaxed);
    }
    if (taken_.empty()) return 0;
    std::vector<std::pair<std::uint32_t, std::vector<std::byte>>>& ready = ready_;
    ready.clear();
    try {
      for (const job& j : taken_) {
        if (j.peer >= outgoing_.size()) outgoing_.resize(j.peer + 1);
        remote::outgoing_frames& out = outgoing_[j.peer];
        const std::vector<std::byte> frame = remote::encode(j.ack);
        if (out.frames() > 0 && out.bytes() + frame.size() > remote::default_max_message)
          ready.emplace_back(j.peer, take(out));  // full: this message goes as it is
        out.add(frame);
      }
      for (std::uint32_t p = 0; p < outgoing_.size(); ++p)
        if (outgoing_[p].frames() > 0) ready.emplace_back(p, take(outgoing_[p]));
    } catch (...) {  // nothing goes: the next call builds them again
      for (auto& out : outgoing_) out.clear();
      throw;
    }
    const std::size_t acked = taken_.size();
    for (const job& j : taken_)
      (j.ack.stored.ticket != no_ticket ? inserted_ : refused_)
          .fetch_add(1, std::memory_order_relaxed);
    taken_.clear();
    outstanding_.fetch_sub(acked, std::memory_order_release);
    std::exception_ptr failed;
    for (const auto& [peer, message] : ready) {
      try {
        send(std::span<const std::byte>(message), peer);
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
    return acked;
  }
  /// Entries acknowledged as inserted, and as refused by the buffer (no ticket), so far.
  [[nodiscard]] std::uint64_t inserted() const noexcept {
    return inserted_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t refused() const noexcept {
    return refused_.load(std::memory_order_relaxed);
  }
  /// Entries queued, inserting, or inserted and not yet acknowledged.
  [[nodiscard]] bool busy() const noexcept {
    return outstanding_.load(std::memory_order_acquire) != 0;
  }
  /// Nanoseconds spent inserting, from any thread.
  [[nodiscard]] std::uint64_t busy_ns() const noexcept {
    return busy_ns_.load(std::memory_order_relaxed);
  }

 private:
  /// The message `out` holds (its lone frame or a bundle), and `out` emptied.
  static std::vector<std::byte> take(detail::remote::outgoing_frames& out) {
    const std::span<const std::byte> m = out.message(0);
    std::vector<std::byte> message(m.begin(), m.end());
    out.clear();
    return message;
  }

  void run() {
    for (job j; jobs_.pop(j);) {
      const auto start = std::chrono::steady_clock::now();
      insert(j);
      count_busy(busy_ns_, start);
      const std::lock_guard held(mutex_);
      done_.push_back(j);  // never allocates: push reserved room for it
      done_count_.fetch_add(1, std::memory_order_release);
    }
  }

  /// Inserts j's entry; its key, as remote peers name it, or no ticket when the buffer refused.
  void insert(job& j) noexcept {
    const std::int64_t lengths[] = {j.length};
    trajectories<spec> in{lengths, {}, memory_kind::host};
    [&]<std::size_t... C>(std::index_sequence<C...>) {
      ((in.columns[C] = detail::column_input_of<spec, C>(j.columns[C])), ...);
    }
    (std::make_index_sequence<spec::num_columns>{});
    key stored{};
    try {
      buffer_.insert(in, std::span<key>(&stored, 1), stream_.for_buffer(buffer_));
      stored.shard = owner_.shard;  // the local buffer's key, as remote peers name it
      stored.incarnation = owner_.incarnation;
    } catch (...) {  // a gear::error, or out of memory
      stored = key{no_ticket, owner_.shard, owner_.incarnation};
    }
    j.ack.stored = stored;
  }

  Buffer& buffer_;
  key_owner owner_;
  shard_stream stream_;  // the inserter's own: the other threads call the buffer on theirs
  job_queue<job> jobs_;
  std::mutex mutex_;        // done_
  std::vector<job> done_;   // inserted, under mutex_
  std::vector<job> taken_;  // taken from done_ by the acknowledging thread, not yet sent
  // The acknowledging thread's: per actor, the frames of a message being built; the messages
  // built, to send.
  std::vector<detail::remote::outgoing_frames> outgoing_;
  std::vector<std::pair<std::uint32_t, std::vector<std::byte>>> ready_;
  std::atomic<std::uint64_t> inserted_{0}, refused_{0};
  std::atomic<std::size_t> done_count_{0}, outstanding_{0};
  std::atomic<std::uint64_t> busy_ns_{0};
  std::thread thread_;  // last: it starts once everything above is built
};

}  // namespace gear::transport
