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
//
// Cost: entries handed back wait in a queue. An acquire takes the smallest idle entry large enough
// if it is about the size asked for (pick_from::snug), asking the driver nothing; otherwise it
// first collects the signalled entries whose kernels have finished (below: a read of a word each)
// and looks again, then asks at most `probe` entries at the queue's head whether their work has
// finished (a finished one becomes idle, an unfinished one goes to the back) and takes the
// smallest idle entry that fits, then asks `probe_more` before it makes a new one. A small call
// (at most snug_floor) with no snug entry in flight by event asks nothing: it takes the smallest
// idle entry that fits (staging reserved ahead for larger batches), or makes one of its own, rather
// than query an insert's large entry and take it. So a call makes a bounded number of driver
// queries however many entries are in flight, and none while snug idle entries wait (staging
// reserved ahead, collected by an earlier call, or signalled finished: a consuming sample's lease
// is found that way even behind an insert's, whose event would be queried first).
//
// Signals: a lease read only by one of gear's kernels can be handed back without an event. The
// kernel's last block, once nothing of the launch reads the lease any more, writes the lease's
// number into the entry's word of mapped pinned memory (signal_of), and the pool sees the entry
// finished by reading that word: no event record when the call ends, no driver query when the
// entry is collected (a fifo sample's chosen rows and removal records; the leases a publish of
// landing inserts reads: release_on_signal).
//
// Threads: the pool has a mutex of its own, so that a landing insert (landing.hpp) can lease its
// staging without holding the buffer's; every member takes it. A lease belongs to its holder.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>
#include <gear/detail/tuning.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gear::detail {

class staging_pool {
 public:
  /// Entries in flight before acquire waits for the oldest.
  static constexpr std::size_t max_entries = 512;
  /// Entries in flight an acquire asks about, oldest first: `probe` first, and `probe_more`
  /// before it makes a new entry (driver queries are what many threads calling at once share).
  static constexpr std::size_t probe = 2;
  static constexpr std::size_t probe_more = 8;

  /// One call's staging: `host` (CPU address) and `mapped` (its GPU address) of the pinned part,
  /// `device` of the device part (null if none was asked for).
  struct lease {
    std::size_t entry = 0;
    std::uint64_t generation = 0;  // the entry's lease count when leased: a stale copy of this
                                   // lease (handed on already) cannot end a later one
    std::byte* host = nullptr;
    std::byte* mapped = nullptr;
    std::byte* device = nullptr;
  };

  /// Where a kernel says that it has finished with a lease: it writes `value` to `word` (the
  /// GPU's address of mapped pinned memory) once it reads the lease no more.
  struct signal {
    std::uint64_t* word = nullptr;
    std::uint64_t value = 0;
  };

  /// Leases at least `pinned_bytes` of mapped pinned memory and `device_bytes` of device memory.
  /// Throws errc::out_of_memory or errc::cuda_error, leasing nothing.
  lease acquire(std::size_t pinned_bytes, std::size_t device_bytes) {
    const std::lock_guard held(mutex_);
    make_words();
    // An idle entry of about the size asked for is taken without a driver query; a much larger
    // one only after the queries, so that small calls do not take the entries reserved for
    // inserts while their own are finished but not yet collected.
    entry* pick = take_idle(pinned_bytes, device_bytes, pick_from::snug);
    if (pick == nullptr) {
      collect_signalled();
      pick = take_idle(pinned_bytes, device_bytes, pick_from::snug);
    }
    // A small call with no snug entry in flight but signalled ones (which collect_signalled has
    // read) asks the driver nothing: it takes an idle entry that fits (one reserved ahead for a
    // larger batch: reserve_staging's promise), else makes one of its own, rather than query an
    // entry far larger than it needs and take it: a sample beside inserts keeps its own entry.
    if (pick == nullptr) {
      const bool asks_nothing = pinned_bytes + device_bytes <= snug_floor &&
                                entries_.size() < max_entries &&
                                !snug_in_flight(pinned_bytes, device_bytes);
      pick = asks_nothing ? take_idle(pinned_bytes, device_bytes)
                          : take_after_queries(pinned_bytes, device_bytes);
    }
    if (pick == nullptr) {
      // Every entry is in one of leased, idle_ or in_flight_: with room for all of them in both
      // lists, handing entries back never allocates.
      idle_.reserve(entries_.size() + 1);
      in_flight_.reserve(entries_.size() + 1);
      auto fresh = std::make_unique<entry>();
      fresh->done = event::make();
      fresh->index = entries_.size();
      entries_.push_back(std::move(fresh));  // the entry outlives a failed growth below, idle
      pick = entries_.back().get();
    }
    try {
      grow(*pick, pinned_bytes, device_bytes);
    } catch (...) {
      idle_.push_back(pick->index);
      throw;
    }
    pick->leased = true;
    ++pick->generation;
    return {pick->index, pick->generation, pick->pinned.data(), pick->pinned.device_data(),
            pick->device.data()};
  }

  /// Makes sure the pool holds at least `count` entries of at least `pinned_bytes` and
  /// `device_bytes`, making the missing ones now, idle, so that calls whose staging fits lease
  /// them without allocating (replay_buffer::reserve_staging). All or nothing: throws
  /// errc::out_of_memory or errc::cuda_error with the pool as it was, errc::invalid_argument past
  /// max_entries.
  void reserve(std::size_t count, std::size_t pinned_bytes, std::size_t device_bytes) {
    std::size_t missing = count;
    {
      const std::lock_guard held(mutex_);
      make_words();
      for (const auto& e : entries_)
        if (missing > 0 && e->pinned.size() >= pinned_bytes && e->device.size() >= device_bytes)
          --missing;
      GEAR_REQUIRE(entries_.size() + missing <= max_entries, errc::invalid_argument,
                   "staging of " + std::to_string(entries_.size() + missing) +
                       " entries asked for; a buffer holds at most " + std::to_string(max_entries));
    }
    std::vector<std::unique_ptr<entry>> fresh(missing);
    for (auto& e : fresh) {  // allocated without the mutex: leases go on meanwhile
      e = std::make_unique<entry>();
      e->done = event::make();
      grow(*e, pinned_bytes, device_bytes);
    }
    const std::lock_guard held(mutex_);
    idle_.reserve(entries_.size() + missing);
    in_flight_.reserve(entries_.size() + missing);
    entries_.reserve(entries_.size() + missing);
    for (auto& e : fresh) {
      e->index = entries_.size();
      idle_.push_back(e->index);
      entries_.push_back(std::move(e));
    }
  }

  /// Ends a lease whose memory is read by work enqueued on `stream`: the entry is reused once
  /// that work has finished. Throws errc::cuda_error if the event cannot be recorded (the entry
  /// then waits for the whole device before reuse).
  void release_after(const lease& l, cudaStream_t stream) {
    const std::lock_guard held(mutex_);
    entry& e = *entries_[l.entry];
    e.leased = false;
    e.marked = false;
    const cudaError_t recorded = cudaEventRecord(e.done.get(), stream);
    if (recorded != cudaSuccess) e.unsafe = true;
    in_flight_.push_back(e.index);
    GEAR_CUDA_TRY(recorded);
  }

  /// The signal a kernel that reads lease `l` writes once it reads it no more (see signal); a
  /// null word for an entry past max_entries (made while every entry was leased), which has
  /// none: its lease is ended with release_after.
  [[nodiscard]] signal signal_of(const lease& l) const noexcept {
    const std::lock_guard held(mutex_);
    if (l.entry >= max_entries) return {};
    return {reinterpret_cast<std::uint64_t*>(words_.device_data()) + l.entry, l.generation};
  }

  /// Ends a lease whose memory only kernels that write its signal (signal_of, a word not null)
  /// read, once they are enqueued: the entry is reused once the signal is written. Records
  /// nothing, never throws.
  void release_on_signal(const lease& l) noexcept {
    const std::lock_guard held(mutex_);
    entry& e = *entries_[l.entry];
    e.leased = false;
    e.marked = false;
    e.signalled = true;
    in_flight_.push_back(e.index);
  }

  /// Ends a lease whose memory nothing read (the call failed before enqueueing), or whose
  /// readers were all marked (note_marked) before it was given back. A no-op for a lease handed
  /// back already, even if another thread has leased the entry since.
  void give_back(const lease& l) noexcept {
    const std::lock_guard held(mutex_);
    entry& e = *entries_[l.entry];
    if (!e.leased || e.generation != l.generation) return;  // not this lease's to end any more
    e.leased = false;
    if (e.marked)
      in_flight_.push_back(e.index);
    else
      idle_.push_back(e.index);
    e.marked = false;
  }

  /// Ends a lease whose memory work enqueued on some stream may still use, with no event to say
  /// when it is done: the entry is reused only after a device-wide wait.
  void give_back_unsafe(const lease& l) noexcept {
    const std::lock_guard held(mutex_);
    entry& e = *entries_[l.entry];
    if (e.generation != l.generation) return;  // leased again since: its work was waited for
    if (!e.leased) {  // given back already (and listed): only make its reuse wait for the device
      e.unsafe = true;
      return;
    }
    e.leased = false;
    e.marked = false;
    e.unsafe = true;
    in_flight_.push_back(e.index);
  }

  /// Says that the caller recorded, on some stream, the lease's event (marked()) after the work
  /// so far that uses the lease (a landing insert's upload); the lease stays held.
  void note_marked(const lease& l) noexcept {
    const std::lock_guard held(mutex_);
    entries_[l.entry]->marked = true;
  }
  /// True once the work note_marked() names has finished (or nothing was marked). Throws
  /// errc::cuda_error.
  [[nodiscard]] bool reached(const lease& l) {
    const std::lock_guard held(mutex_);
    entry& e = *entries_[l.entry];
    return !e.marked || finished(e);
  }
  /// The lease's event: for the holder to record (then note_marked) and for streams to wait on.
  [[nodiscard]] cudaEvent_t marked(const lease& l) const noexcept {
    const std::lock_guard held(mutex_);
    return entries_[l.entry]->done.get();
  }

 private:
  struct entry {
    allocation pinned, device;
    event done;
    bool leased = false;
    bool marked = false;  // leased, its event recorded by the holder (note_marked)
    bool unsafe = false;  // the event could not be recorded: reuse after a device-wide wait
    bool signalled = false;  // in flight until its word holds its generation (release_on_signal)
    std::uint64_t generation = 0;  // leases so far
    std::size_t index = 0;         // its place in entries_
  };

  /// True once the entry, handed back by signal (and not unsafe), has its signal: a read of its
  /// word, no driver query. The entry then waits for nothing any more.
  bool signal_seen(entry& e) noexcept {
    if (!e.signalled || e.unsafe || !signalled(e)) return false;
    e.signalled = false;
    return true;
  }

  /// True when the entry's last recorded work has finished. Throws errc::cuda_error.
  bool finished(entry& e) {
    if (e.signalled && !e.unsafe) return signal_seen(e);
    if (e.unsafe) {
      e.signalled = false;
      GEAR_CUDA_TRY(cudaDeviceSynchronize());
      e.unsafe = false;
      return true;
    }
    return event_reached(e.done.get());
  }

  /// True once the kernel that reads the signalled entry `e` has written its lease's number.
  bool signalled(const entry& e) const noexcept {
    auto* word = reinterpret_cast<std::uint64_t*>(words_.data()) + e.index;
    return std::atomic_ref<std::uint64_t>(*word).load(std::memory_order_acquire) >= e.generation;
  }
  /// Waits on the host for the signal of `e` (every entry is in flight): polls its word for up
  /// to a second, then waits for the whole device (after which the kernel has run, or never
  /// will: its launch failed). Throws errc::cuda_error.
  void wait_for_signal(entry& e) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!signalled(e) && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    if (!signalled(e)) GEAR_CUDA_TRY(cudaDeviceSynchronize());
    e.signalled = false;
  }

  /// Makes the signal words, one per entry there may be, on first use (the pool of a buffer
  /// that stages nothing allocates nothing). Throws errc::out_of_memory or errc::cuda_error,
  /// changing nothing.
  void make_words() {
    if (words_.size() != 0) return;
    allocation words(memory_kind::pinned_host, max_entries * sizeof(std::uint64_t));
    std::memset(words.data(), 0, words.size());  // below every lease's number: none finished
    words_ = std::move(words);
  }

  /// Makes idle every signalled entry in flight whose word says it is finished: a read each, no
  /// driver query. The others keep their order.
  void collect_signalled() noexcept {
    std::size_t kept = 0;
    for (const std::size_t e : in_flight_) {
      if (signal_seen(*entries_[e]))
        idle_.push_back(e);  // never allocates: both lists have room for every entry
      else
        in_flight_[kept++] = e;
    }
    in_flight_.resize(kept);
  }

  /// Asks `probe`, then `probe_more` of the oldest entries in flight whether their work has
  /// finished, and takes the smallest idle entry that fits; past max_entries, waits for the
  /// oldest in flight and takes any idle entry (acquire grows it if small). Null: make a new one.
  entry* take_after_queries(std::size_t pinned_bytes, std::size_t device_bytes) {
    collect(probe);
    entry* pick = take_idle(pinned_bytes, device_bytes);
    if (pick == nullptr) {
      collect(probe_more);
      pick = take_idle(pinned_bytes, device_bytes);
    }
    if (pick == nullptr && entries_.size() >= max_entries) {
      // Every entry is leased (open writers and landing inserts hold theirs across calls), in
      // flight or too small: wait for the oldest in flight, then take an idle one; with none,
      // make another.
      if (!in_flight_.empty()) {
        entry& oldest = *entries_[in_flight_.front()];
        if (!finished(oldest)) {  // an unsafe entry is waited for by finished() itself
          if (oldest.signalled)
            wait_for_signal(oldest);
          else
            GEAR_CUDA_TRY(cudaEventSynchronize(oldest.done.get()));
        }
        in_flight_.erase(in_flight_.begin());
        idle_.push_back(oldest.index);
      }
      pick = take_idle(pinned_bytes, device_bytes, pick_from::any);
    }
    return pick;
  }

  /// Asks the `count` oldest entries in flight whether their work has finished: the finished
  /// ones become idle, the others go to the back, so that an entry on a slow stream does not
  /// hide finished ones behind it.
  void collect(std::size_t count) {
    for (std::size_t asked = 0; asked < count && asked < in_flight_.size(); ++asked) {
      const std::size_t e = in_flight_.front();
      const bool done = finished(*entries_[e]);  // may throw: the lists are unchanged then
      in_flight_.erase(in_flight_.begin());
      (done ? idle_ : in_flight_).push_back(e);
    }
  }

  /// Which idle entries take_idle may pick: `snug` ones fit and hold at most twice the bytes
  /// asked for (or snug_floor); `fitting` ones fit; with `any`, if none fits, the largest.
  enum class pick_from { snug, fitting, any };
  static constexpr std::size_t snug_floor = std::size_t{64} << 10;

  /// Takes the smallest idle entry with room for the sizes (see pick_from); null if none.
  entry* take_idle(std::size_t pinned_bytes, std::size_t device_bytes,
                   pick_from from = pick_from::fitting) {
    auto size_of = [&](std::size_t i) {
      const entry& e = *entries_[idle_[i]];
      return e.pinned.size() + e.device.size();
    };
    std::size_t best = idle_.size();
    for (std::size_t i = 0; i < idle_.size(); ++i) {
      const entry& e = *entries_[idle_[i]];
      if (e.pinned.size() >= pinned_bytes && e.device.size() >= device_bytes &&
          (best == idle_.size() || size_of(i) < size_of(best)))
        best = i;
    }
    if (from == pick_from::snug && best != idle_.size() &&
        size_of(best) > std::max(2 * (pinned_bytes + device_bytes), snug_floor))
      return nullptr;
    if (best == idle_.size() && from == pick_from::any)
      for (std::size_t i = 0; i < idle_.size(); ++i)
        if (best == idle_.size() || size_of(i) > size_of(best)) best = i;
    if (best == idle_.size()) return nullptr;
    entry* e = entries_[idle_[best]].get();
    idle_[best] = idle_.back();
    idle_.pop_back();
    return e;
  }

  /// True if an entry handed back by event (not by signal) is in flight that would be snug for
  /// the sizes (take_idle's pick_from::snug): a probe may find it finished.
  [[nodiscard]] bool snug_in_flight(std::size_t pinned_bytes, std::size_t device_bytes) const {
    const std::size_t most = std::max(2 * (pinned_bytes + device_bytes), snug_floor);
    for (const std::size_t i : in_flight_) {
      const entry& e = *entries_[i];
      if (!e.signalled && e.pinned.size() >= pinned_bytes && e.device.size() >= device_bytes &&
          e.pinned.size() + e.device.size() <= most)
        return true;
    }
    return false;
  }

  /// Grows the entry's memory to the sizes asked for (at least doubling); on failure the entry
  /// keeps its old memory.
  static void grow(entry& e, std::size_t pinned_bytes, std::size_t device_bytes) {
    allocation pinned, device;
    if (e.pinned.size() < pinned_bytes)
      pinned = allocation(memory_kind::pinned_host, std::max(pinned_bytes, 2 * e.pinned.size()),
                          tuning::staging_write_combined);
    if (e.device.size() < device_bytes)
      device = allocation(memory_kind::device, std::max(device_bytes, 2 * e.device.size()));
    if (pinned.size() != 0) e.pinned = std::move(pinned);
    if (device.size() != 0) e.device = std::move(device);
  }

  mutable std::mutex mutex_;
  allocation words_;  // pinned, mapped: [max_entries] signals, one per entry, by its index
  std::vector<std::unique_ptr<entry>> entries_;
  std::vector<std::size_t> idle_;       // entries free to lease now
  std::vector<std::size_t> in_flight_;  // entries handed back, in release order
};

}  // namespace gear::detail
