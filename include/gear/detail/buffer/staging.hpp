#pragma once
// Staging for calls that hand data to the GPU: mapped pinned memory (and, where asked, a device
// twin) leased to one call and reused once the stream work that reads it has finished.
//
// A call acquires its lease before it changes any state (allocation may fail, and then nothing has
// changed), writes its data into the pinned part during the call (a snapshot: the caller may reuse
// its own memory when the call returns), enqueues the work that reads it, and hands the lease back
// with an event recorded after that work. Entries are recycled by cudaEventQuery, so a busy stream
// never makes a later call wait: a new entry is allocated instead, up to max_entries; only past
// that does acquire wait for the oldest lease's work.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>
#include <memory>
#include <vector>

namespace gear::detail {

class staging_pool {
 public:
  /// Entries in flight before acquire waits for the oldest.
  static constexpr std::size_t max_entries = 512;

  /// One call's staging: `host` (CPU address) and `mapped` (its GPU address) of the pinned part,
  /// `device` of the device part (null if none was asked for).
  struct lease {
    std::size_t entry = 0;
    std::byte* host = nullptr;
    std::byte* mapped = nullptr;
    std::byte* device = nullptr;
  };

  /// Leases at least `pinned_bytes` of mapped pinned memory and `device_bytes` of device memory.
  /// Throws errc::out_of_memory or errc::cuda_error, leasing nothing.
  lease acquire(std::size_t pinned_bytes, std::size_t device_bytes) {
    entry* pick = nullptr;
    for (auto& e : entries_) {
      if (e->leased || !finished(*e)) continue;
      pick = e.get();
      if (pick->pinned.size() >= pinned_bytes && pick->device.size() >= device_bytes) break;
    }
    if (pick == nullptr && entries_.size() >= max_entries) {
      // Every entry is leased (open writers hold theirs across calls) or in flight: wait for the
      // oldest in flight, or, with none, make another.
      pick = oldest();
      if (pick != nullptr) GEAR_CUDA_TRY(cudaEventSynchronize(pick->done.get()));
    }
    if (pick == nullptr) {
      auto fresh = std::make_unique<entry>();
      fresh->done = event::make();
      fresh->index = entries_.size();
      entries_.push_back(std::move(fresh));  // the entry outlives a failed growth below, unleased
      pick = entries_.back().get();
    }
    grow(*pick, pinned_bytes, device_bytes);
    pick->leased = true;
    return {pick->index, pick->pinned.data(), pick->pinned.device_data(), pick->device.data()};
  }

  /// Ends a lease whose memory is read by work enqueued on `stream`: the entry is reused once
  /// that work has finished. Throws errc::cuda_error if the event cannot be recorded (the entry
  /// then waits for the whole device before reuse).
  void release_after(const lease& l, cudaStream_t stream) {
    entry& e = *entries_[l.entry];
    e.leased = false;
    e.sequence = ++sequence_;
    const cudaError_t recorded = cudaEventRecord(e.done.get(), stream);
    e.recorded = recorded == cudaSuccess;
    e.unsafe = !e.recorded;
    GEAR_CUDA_TRY(recorded);
  }

  /// Ends a lease whose memory nothing read (the call failed before enqueueing), or whose
  /// readers were all marked (mark()) before it was given back.
  void give_back(const lease& l) noexcept { entries_[l.entry]->leased = false; }

  /// Ends a lease whose memory work enqueued on some stream may still use, with no event to say
  /// when it is done: the entry is reused only after a device-wide wait.
  void give_back_unsafe(const lease& l) noexcept {
    entries_[l.entry]->leased = false;
    entries_[l.entry]->unsafe = true;
  }

  /// Marks the point of `stream` after which the lease's work so far is done (a landing insert's
  /// copy); the lease stays held. Throws errc::cuda_error (then give_back_unsafe).
  void mark(const lease& l, cudaStream_t stream) {
    entry& e = *entries_[l.entry];
    GEAR_CUDA_TRY(cudaEventRecord(e.done.get(), stream));
    e.recorded = true;
  }
  /// True once the work marked by mark() has finished. Throws errc::cuda_error.
  [[nodiscard]] bool reached(const lease& l) { return finished(*entries_[l.entry]); }
  /// The event mark() recorded, for a stream to wait on.
  [[nodiscard]] cudaEvent_t marked(const lease& l) const noexcept {
    return entries_[l.entry]->done.get();
  }

 private:
  struct entry {
    allocation pinned, device;
    event done;
    bool leased = false;
    bool recorded = false;
    bool unsafe = false;  // the event could not be recorded: reuse after a device-wide wait
    std::uint64_t sequence = 0;
    std::size_t index = 0;  // its place in entries_
  };

  /// True when the entry's last reader has finished. Throws errc::cuda_error.
  static bool finished(entry& e) {
    if (e.unsafe) {
      GEAR_CUDA_TRY(cudaDeviceSynchronize());
      e.unsafe = false;
      return true;
    }
    if (!e.recorded) return true;
    const cudaError_t status = cudaEventQuery(e.done.get());
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    GEAR_CUDA_TRY(status);
    return true;
  }

  entry* oldest() noexcept {
    entry* o = nullptr;
    for (auto& e : entries_)
      if (!e->leased && (o == nullptr || e->sequence < o->sequence)) o = e.get();
    return o;
  }

  /// Grows the entry's memory to the sizes asked for (at least doubling); on failure the entry
  /// keeps its old memory.
  static void grow(entry& e, std::size_t pinned_bytes, std::size_t device_bytes) {
    allocation pinned, device;
    if (e.pinned.size() < pinned_bytes)
      pinned = allocation(memory_kind::pinned_host, std::max(pinned_bytes, 2 * e.pinned.size()));
    if (e.device.size() < device_bytes)
      device = allocation(memory_kind::device, std::max(device_bytes, 2 * e.device.size()));
    if (pinned.size() != 0) e.pinned = std::move(pinned);
    if (device.size() != 0) e.device = std::move(device);
  }

  std::vector<std::unique_ptr<entry>> entries_;
  std::uint64_t sequence_ = 0;
};

}  // namespace gear::detail
