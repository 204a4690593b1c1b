#pragma once
// What a GPU buffer keeps of a host insert that lands (landing.hpp), and the pieces a publish of
// such inserts places (landing_publish.cuh).

#include <cstddef>
#include <cstdint>
#include <gear/detail/buffer/staging.hpp>
#include <gear/detail/cuda.hpp>
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

/// One column of one trajectory a publish places: `bytes` from the device staging at `src` into
/// its slot at `dst`.
struct landing_piece {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  std::int64_t bytes = 0;
};

}  // namespace gear::detail
