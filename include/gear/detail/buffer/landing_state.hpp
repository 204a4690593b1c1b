#pragma once
// What a GPU buffer keeps of a host insert that lands (landing.hpp), how a settle learns which
// uploads have finished, and the pieces a publish of such inserts places (landing_publish.cuh).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <gear/detail/buffer/staging.hpp>
#include <gear/detail/cuda.hpp>
#include <span>
#include <thread>
#include <vector>

namespace gear::detail {

/// A host insert on its way: its tickets are reserved (pending) in the ring; its bytes wait in
/// `lease` (pinned and device parts, each column packed) until a settle places them in the slots.
struct landing_insert {
  staging_pool::lease lease;
  cudaStream_t stream{};   // the caller's: its upload runs there, and a sample there sees it
  std::thread::id thread;  // the caller's: its uploads on one stream finish in its order
  std::uint64_t first_ticket = 0;
  std::int64_t steps = 0;  // all trajectories' steps: the staging's column stride
  std::vector<std::int64_t> lengths;
  bool uploaded = false;  // its upload has finished (seen by an event query)

  /// True when `ticket` is one of this insert's.
  [[nodiscard]] bool names(std::uint64_t ticket) const noexcept {
    return ticket >= first_ticket && ticket - first_ticket < lengths.size();
  }
};

/// Marks the inserts of `landing` (in the order they registered) whose upload has finished
/// (uploaded), asking finished(l) (an event query) as few times as it can: uploads one thread
/// enqueued on one stream finish in the order it made them, which is their order in `landing`
/// (each registers after its upload, before its thread's next), so inserts are asked newest
/// first within each (thread, stream), and a finished one answers for every older one. Another
/// thread's inserts on the same stream answer for none (their uploads and registrations may
/// interleave). Returns the number of questions asked.
template <class Finished>
std::size_t note_finished_uploads(std::span<landing_insert> landing, Finished&& finished) {
  struct origin {
    std::thread::id thread;
    cudaStream_t stream;
  };
  std::vector<origin> done;  // origins whose older inserts are all uploaded
  std::size_t asked = 0;
  for (std::size_t i = landing.size(); i-- > 0;) {
    landing_insert& l = landing[i];
    const auto same = [&](const origin& o) { return o.thread == l.thread && o.stream == l.stream; };
    const bool answered = std::find_if(done.begin(), done.end(), same) != done.end();
    if (!l.uploaded) {
      if (answered) {
        l.uploaded = true;
      } else {
        ++asked;
        l.uploaded = finished(static_cast<const landing_insert&>(l));
      }
    }
    if (l.uploaded && !answered) done.push_back({l.thread, l.stream});
  }
  return asked;
}

/// One column of one trajectory a publish places: `bytes` from the device staging at `src` into
/// its slot at `dst`.
struct landing_piece {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  std::int64_t bytes = 0;
};

/// Bytes a block of the publish copies at a time: the pieces' chunks are dealt to the blocks in
/// turn.
inline constexpr std::int64_t landing_chunk = std::int64_t{16} << 10;

}  // namespace gear::detail
