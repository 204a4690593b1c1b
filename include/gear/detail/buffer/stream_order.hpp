#pragma once
// Orders a GPU buffer's work across the streams its callers use, so that callers need no events
// of their own (the contract at the top of replay_buffer.hpp):
//
//   a read  (a sample: selection and gather) waits for the writes other streams enqueued before it;
//   a write (anything that changes slot bytes, the mirror or the selection state: insert, reserve,
//            commit, erase, removal, priority updates) waits for the reads and the writes other
//            streams enqueued before it.
//
// So each sample sees exactly the writes whose calls returned before it started, whatever their
// stream (a landing insert's once published: landing.hpp), and no slot is overwritten while a
// gather that may read it has not finished. Calls are
// serialised by the buffer's mutex; positions are events recorded after each access. While one
// stream is all a buffer has seen, nothing is recorded or waited for (unless the buffer is
// tracked for the host, below): the first call on a second stream waits once, on the host, for
// the whole device (the first stream may be gone by then). A stream may be destroyed while the
// buffer lives: its events stay valid. Streams are told apart by their handles: a handle that
// names another stream in each thread is refused (check_stream_handle), and a stream destroyed
// with the buffer's work still queued on it must not be followed by a new stream given the same
// handle value before that work finishes (synchronise it first). Events are made only once a
// second stream comes (or, when tracked, on the first): an untracked buffer used from one stream
// has none.
//
// A buffer sampled with a gear::device_rng, or updated inside a CUDA graph capture, is bound to
// that call's stream (bind): CUDA graphs replay such calls, and a replay records and waits for no
// event, so no other stream may use the buffer from then on; a call on another stream throws
// errc::invalid_argument before it changes anything (every operation orders itself, before(),
// before it changes state).
//
// A buffer whose CPU writes slot bytes (host data into host-resident columns: pinned_host, mixed)
// is tracked for the host (track_for_host): its accesses are recorded from the first stream on, so
// an insert waits on the host for the last read of each stream and the last write of slot bytes
// (wait_on_host) rather than for everything queued on its stream, a training step included. Calls
// that bind the buffer (they may be captured) make and record no event; a bound buffer records
// nothing (records() is false) and its host writes wait for its stream.

#include <cstdint>
#include <gear/detail/cuda.hpp>
#include <gear/error.hpp>
#include <memory>
#include <vector>

namespace gear::detail {

/// Throws errc::invalid_argument for a handle that names another stream in each thread
/// (cudaStreamPerThread, or stream 0 in code built with --default-stream per-thread): the buffer
/// tells streams apart by their handles, and two threads' streams taken for one would go
/// unordered. Cheap: no CUDA call.
inline void check_stream_handle(cudaStream_t s) {
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
  const bool per_thread = s == cudaStreamPerThread || s == cudaStream_t{};
#else
  const bool per_thread = s == cudaStreamPerThread;
#endif
  GEAR_REQUIRE(!per_thread, errc::invalid_argument,
               "a per-thread default stream (cudaStreamPerThread, or stream 0 built with "
               "--default-stream per-thread) names another stream in each thread, and a buffer "
               "tells its streams apart by their handles: pass a stream of your own "
               "(cudaStreamCreate)");
}

class stream_order {
 public:
  enum class access { read, write };

  /// Makes `s` wait for what an access of kind `a` must follow. Throws errc::cuda_error (then
  /// nothing was enqueued on `s` that a retry would repeat wrongly: waits are idempotent).
  /// `binding`: the call binds the buffer once it is enqueued (it may be captured): no event is
  /// made for it.
  void before(cudaStream_t s, access a, bool binding = false) {
    lane& self = lane_of(s);
    if (records() && !binding) self.make_events();  // tracked: the first lane has none yet
    if (last_writer_ != nullptr && last_writer_ != &self)
      GEAR_CUDA_TRY(cudaStreamWaitEvent(s, last_writer_->write.get(), 0));
    if (a == access::write)
      for (auto& l : lanes_)
        if (l.get() != &self && l->read_pending && l->read_recorded)
          GEAR_CUDA_TRY(cudaStreamWaitEvent(s, l->read.get(), 0));
  }

  /// Binds the buffer to `s` for good (see the top of this file). Throws errc::invalid_argument,
  /// binding nothing, if another stream has used the buffer.
  void bind(cudaStream_t s) {
    check_bind(s);
    (void)lane_of(s);
    bound_ = true;
  }
  /// Throws errc::invalid_argument unless bind(s) would succeed. Changes nothing.
  void check_bind(cudaStream_t s) const {
    check_bound(s);
    GEAR_REQUIRE(only_lane(s) && !unlaned_, errc::invalid_argument,
                 "a buffer used from several streams can neither sample with a gear::device_rng "
                 "nor be updated inside a CUDA graph capture (replays are unordered with other "
                 "streams); use one stream for every call of this buffer");
  }
  [[nodiscard]] bool bound() const noexcept { return bound_; }
  /// Throws errc::invalid_argument if the buffer is bound to a stream other than `s`.
  void check_bound(cudaStream_t s) const {
    GEAR_REQUIRE(!bound_ || lanes_.front()->stream == s, errc::invalid_argument,
                 "this buffer was sampled with a gear::device_rng or updated inside a CUDA "
                 "graph capture, which binds it to that call's stream (replays are unordered "
                 "with other streams); call it on that stream");
  }
  /// Notes that a stream with no lane of its own has used the buffer (a landing insert records
  /// no access on its stream): the buffer may no longer bind.
  void note_unlaned_stream() noexcept { unlaned_ = true; }

  /// Records every access from the first stream on (see the top of this file).
  void track_for_host() noexcept { tracked_ = true; }
  /// True when accesses are recorded: tracked or used from several streams, and not bound.
  [[nodiscard]] bool records() const noexcept { return (tracked_ || lanes_.size() > 1) && !bound_; }
  /// Waits on the host until every gather that may read a slot and every write of slot bytes
  /// enqueued so far have finished: each stream's last read and the last write of slot bytes
  /// (every access follows the one before it on its stream, and every write the write before it).
  /// Complete only while the buffer is tracked and not bound. Throws errc::cuda_error.
  void wait_on_host() {
    if (unrecorded_) {  // an access went unrecorded: nothing short of the device covers it
      GEAR_CUDA_TRY(cudaDeviceSynchronize());
      unrecorded_ = false;
      return;
    }
    for (const auto& l : lanes_)
      if (l->read_recorded) GEAR_CUDA_TRY(cudaEventSynchronize(l->read.get()));
    if (last_bytes_writer_ != nullptr && last_bytes_writer_->write.get() != nullptr)
      GEAR_CUDA_TRY(cudaEventSynchronize(last_bytes_writer_->write.get()));
  }

  /// True when some stream's last recorded read has not finished (an event query per stream):
  /// a sample is in flight, whatever has been written since.
  /// Throws errc::cuda_error.
  [[nodiscard]] bool reads_in_flight() const {
    for (const auto& l : lanes_)
      if (l->read_recorded && !event_reached(l->read.get())) return true;
    return false;
  }

  /// True while no stream but `s` (or none) has used the buffer.
  [[nodiscard]] bool only_lane(cudaStream_t s) const noexcept {
    return lanes_.empty() || (lanes_.size() == 1 && lanes_.front()->stream == s);
  }

  /// Records the position of an access just enqueued on `s` (it must follow before(s, a)). A
  /// write with `bytes` false changed metadata only (the mirror, the selection state), no slot
  /// bytes: wait_on_host need not wait for it.
  /// `binding` as for before(): nothing is recorded.
  void after(cudaStream_t s, access a, bool bytes = true, bool binding = false) {
    lane& self = lane_of(s);
    const bool record = records() && !binding;
    if (a == access::write) {
      // This write followed every pending read: later writes follow them through it.
      for (auto& l : lanes_) l->read_pending = false;
      last_writer_ = &self;
      // The lane's write event moves on with its later writes: still after its bytes.
      if (bytes) last_bytes_writer_ = &self;
      if (record) record_event(self.write.get(), s);
    } else {
      self.read_pending = true;
      if (record) {
        record_event(self.read.get(), s);
        self.read_recorded = true;
      }
    }
  }

 private:
  struct lane {
    cudaStream_t stream{};
    event read;   // recorded after each read: the lane's last
    event write;  // recorded after each write: the lane's last
    bool read_recorded = false;  // `read` has been recorded
    bool read_pending = false;  // a read since the last write that has not been waited for
    /// Makes the lane's events, unless it has them (both or none: a failure leaves none).
    void make_events() {
      if (read.get() != nullptr) return;
      event r = event::make();
      event w = event::make();
      read = std::move(r);
      write = std::move(w);
    }
  };

  /// Records `e` on `s`; a failure (the access was enqueued, its event not) is remembered, so
  /// that wait_on_host waits for the device instead.
  void record_event(cudaEvent_t e, cudaStream_t s) {
    const cudaError_t status = cudaEventRecord(e, s);
    if (status != cudaSuccess) unrecorded_ = true;
    GEAR_CUDA_TRY(status);
  }

  lane& lane_of(cudaStream_t s) {
    for (auto& l : lanes_)
      if (l->stream == s) return *l;
    check_stream_handle(s);
    check_bound(s);
    auto fresh = std::make_unique<lane>();
    fresh->stream = s;
    if (!lanes_.empty()) {
      fresh->make_events();
      lanes_.front()->make_events();
    }
    if (lanes_.size() == 1) {
      // A second stream: the first one's accesses were not recorded, and that stream may no
      // longer exist. Waiting once for the whole device covers them.
      GEAR_CUDA_TRY(cudaDeviceSynchronize());
      lanes_.front()->read_pending = false;
      last_writer_ = last_bytes_writer_ = nullptr;
    }
    lanes_.push_back(std::move(fresh));
    return *lanes_.back();
  }

  std::vector<std::unique_ptr<lane>> lanes_;
  lane* last_writer_ = nullptr;
  lane* last_bytes_writer_ = nullptr;  // the last write of slot bytes was on it (or later)
  bool bound_ = false;                 // bind(): lanes_ holds one lane, the only one allowed
  bool unlaned_ = false;               // a stream without a lane used the buffer: never bind
  bool tracked_ = false;               // track_for_host(): record from the first stream on
  bool unrecorded_ = false;            // an event record failed since the last wait_on_host
};

}  // namespace gear::detail
