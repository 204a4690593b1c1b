#pragma once
// gear::transport::reply_slice: what a remote learner (remote_learner.hpp) keeps for one shard: a
// slice of its registered memory that only that shard writes, with a reply area per sample in
// flight (the meta part of a sample reply: header, mask, keys, probabilities, footer), the
// request each area awaits, and which of that reply's writes have come (detail/remote/entry.hpp:
// writes of columns into the batch, the last one also carrying the meta part into the slice,
// each naming the request in its CQ data).

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/frame.hpp>
#include <gear/transport/fabric_memory.hpp>
#include <memory>

namespace gear::transport {

/// Samples a learner may have in flight at once (sample_begin ... sample_end). With more than two,
/// a shard finds the next request queued when it finishes a reply: small shares, whose transfer
/// is shorter than a round trip, keep the shard busy (64 KiB shares: 8 in flight move 11 points
/// more of raw bandwidth than 4 on the H200, over tcp and shm).
inline constexpr std::size_t max_samples_in_flight = 8;

struct reply_slice {
  std::unique_ptr<fabric::host_region> memory;  // max_samples_in_flight areas of area_bytes
  fabric::region region{};
  std::size_t area_bytes = 0;
  std::array<std::uint32_t, max_samples_in_flight> request{};
  std::array<bool, max_samples_in_flight> arrived{};         // the meta part
  std::array<std::size_t, max_samples_in_flight> columns{};  // writes of columns alone in

  /// Allocates the slice, an area of `bytes` per sample in flight, and registers it on `on` (the
  /// inlet its shard writes into) for that shard's writes. Throws errc::transport_error.
  void open(fabric::endpoint& on, std::size_t bytes) {
    memory = std::make_unique<fabric::host_region>(bytes * max_samples_in_flight);
    area_bytes = bytes;
    region = on.register_memory(memory->data(), memory->size(), FI_REMOTE_WRITE);
  }

  [[nodiscard]] std::byte* area(std::size_t a) const { return memory->data() + a * area_bytes; }

  /// Area a awaits the reply to `r` from now on: nothing of it has come.
  void expect(std::size_t a, std::uint32_t r) noexcept {
    arrived[a] = false;
    columns[a] = 0;
    request[a] = r;
  }
  /// Counts a write of this shard's (CQ data `d`) toward the area awaiting its request, if any.
  void note(const detail::remote::cq_data& d) noexcept {
    using kind = detail::remote::write_kind;
    for (std::size_t a = 0; a < max_samples_in_flight; ++a)
      if (request[a] == d.index) {
        if (d.kind == kind::sample_reply) arrived[a] = true;
        if (d.kind == kind::sample_column) ++columns[a];
      }
  }
  /// True once area a's reply is all in: the write with its meta part, and as many writes of
  /// columns alone as its header counts (none when it holds no rows: a shard that could not
  /// sample). finish() checks the header.
  [[nodiscard]] bool reply_in(std::size_t a) const noexcept {
    if (!arrived[a]) return false;
    detail::remote::reply_header h;
    std::memcpy(&h, area(a), sizeof h);
    return columns[a] == h.column_writes;
  }
};

}  // namespace gear::transport
