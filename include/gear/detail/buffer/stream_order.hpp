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
// stream, and no slot is overwritten while a gather that may read it has not finished. Calls are
// serialised by the buffer's mutex; positions are events recorded after each access. While one
// stream is all a buffer has seen, nothing is recorded or waited for: the first call on a second
// stream waits once, on the host, for the whole device (the first stream may be gone by then).
// A stream may be destroyed while the buffer lives: its events stay valid.

#include <cstdint>
#include <gear/detail/cuda.hpp>
#include <memory>
#include <vector>

namespace gear::detail {

class stream_order {
 public:
  enum class access { read, write };

  /// Makes `s` wait for what an access of kind `a` must follow. Throws errc::cuda_error (then
  /// nothing was enqueued on `s` that a retry would repeat wrongly: waits are idempotent).
  void before(cudaStream_t s, access a) {
    lane& self = lane_of(s);
    if (last_writer_ != nullptr && last_writer_ != &self)
      GEAR_CUDA_TRY(cudaStreamWaitEvent(s, last_writer_->write.get(), 0));
    if (a == access::write)
      for (auto& l : lanes_)
        if (l.get() != &self && l->read_pending)
          GEAR_CUDA_TRY(cudaStreamWaitEvent(s, l->read.get(), 0));
  }

  /// True when some stream has a read no write has followed yet.
  [[nodiscard]] bool reads_pending() const noexcept {
    for (const auto& l : lanes_)
      if (l->read_pending) return true;
    return false;
  }

  /// True while no stream but `s` (or none) has used the buffer.
  [[nodiscard]] bool only_lane(cudaStream_t s) const noexcept {
    return lanes_.empty() || (lanes_.size() == 1 && lanes_.front()->stream == s);
  }

  /// Records the position of an access just enqueued on `s` (it must follow before(s, a)).
  void after(cudaStream_t s, access a) {
    lane& self = lane_of(s);
    if (a == access::write) {
      // This write followed every pending read: later writes follow them through it.
      for (auto& l : lanes_) l->read_pending = false;
      last_writer_ = &self;
      if (lanes_.size() > 1) GEAR_CUDA_TRY(cudaEventRecord(self.write.get(), s));
    } else {
      self.read_pending = true;
      if (lanes_.size() > 1) GEAR_CUDA_TRY(cudaEventRecord(self.read.get(), s));
    }
  }

 private:
  struct lane {
    cudaStream_t stream{};
    event read, write;
    bool read_pending = false;  // a read since the last write that has not been waited for
  };

  lane& lane_of(cudaStream_t s) {
    for (auto& l : lanes_)
      if (l->stream == s) return *l;
    auto fresh = std::make_unique<lane>();
    fresh->stream = s;
    fresh->read = event::make();
    fresh->write = event::make();
    if (lanes_.size() == 1) {
      // A second stream: the first one's accesses were not recorded, and that stream may no
      // longer exist. Waiting once for the whole device covers them.
      GEAR_CUDA_TRY(cudaDeviceSynchronize());
      lanes_.front()->read_pending = false;
      last_writer_ = nullptr;
    }
    lanes_.push_back(std::move(fresh));
    return *lanes_.back();
  }

  std::vector<std::unique_ptr<lane>> lanes_;
  lane* last_writer_ = nullptr;
};

}  // namespace gear::detail
