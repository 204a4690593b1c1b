#pragma once
// gear::transport::shard_peer: what a shard (shard_server.hpp) keeps of one actor or learner it
// welcomed. Peers have endpoints of their own at the shard, beside the shard's control endpoint:
//   a learner's channel where the shard writes its sample replies from;
//   an actor's intake   on shm, where it writes its insert entries, into its staging ring
//                       (registered there alone, so it can write nowhere else).
// On shm a write whose peer died in the middle never completes, and an endpoint takes a peer's
// writes in order with everyone else's, through its one shared region (without cross-memory
// attach through bounce buffers there, filled under the region's lock and emptied by the
// receiving side): with one endpoint for all, one dead peer would stall every other. Providers with a
// connection per peer (tcp, verbs, efa) have no such queue, and there actors write into the
// control endpoint: a progress thread polling an intake per actor there paid for it (8 actors
// over tcp;ofi_rxm inserted 45% less). Each endpoint is declared after the memory registered on
// it, so that it closes first.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/transport/fabric_memory.hpp>
#include <gear/transport/libfabric.hpp>
#include <gear/transport/reply_packer.hpp>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>

namespace gear::transport {

/// Replies to one learner a shard packs or has on the wire at once: it packs the next while
/// others are written. Small shares want several: a share's transfer is then shorter than the
/// time a write takes to complete back at the shard.
inline constexpr std::size_t max_replies_in_flight = 8;
/// The staging a shard gives one learner's replies, unless two of its largest shares need more.
inline constexpr std::uint64_t reply_staging_bytes = std::uint64_t{64} << 20;

/// Replies in flight for a learner whose largest share packs into `slot_bytes`: as many as fit
/// reply_staging_bytes, at least 2 and at most max_replies_in_flight.
inline std::size_t replies_in_flight(std::uint64_t slot_bytes) noexcept {
  const std::uint64_t fit =
      slot_bytes == 0 ? max_replies_in_flight : reply_staging_bytes / slot_bytes;
  return static_cast<std::size_t>(std::clamp<std::uint64_t>(fit, 2, max_replies_in_flight));
}

/// True when a shard on `provider` gives each actor an intake endpoint (see the top of this file).
inline bool intake_per_actor(const std::string& provider) noexcept {
  return fabric::shared_region(provider);
}

struct shard_peer {
  fi_addr_t address = FI_ADDR_UNSPEC;  // its inlet for this shard, else its control endpoint
  detail::remote::peer_role role{};

  // An actor's staging ring, and its intake (null where the control endpoint takes entries).
  std::unique_ptr<fabric::host_region> ring;
  std::uint32_t ring_blocks = 0;
  std::uint64_t next_sequence = 0;  // every sequence below it was accepted
  std::set<std::uint64_t> ahead;    // accepted ones above it
  std::unique_ptr<fabric::endpoint> intake;
  fabric::region ring_region{};

  // A learner's slice for the meta part of sample replies and the largest share it asks for,
  // and the registered staging replies are packed in: a slot of slot_bytes per reply in flight.
  // A reply is packed by the packer, then written by the learner's writer thread, whose alone
  // the channel is (reply_writer.hpp: its columns into the batch region its request names and
  // its meta part into the slice, as few writes as the provider allows; the writes' context is
  // its state), and busy until every write completes.
  std::uint64_t slice_address = 0, slice_key = 0;
  detail::remote::reply_grant grant;
  std::uint64_t slot_bytes = 0;
  std::size_t slots = 0;  // replies in flight: the first `slots` of `writes`
  std::unique_ptr<fabric::host_region> reply;
  struct reply_write {
    std::atomic<reply_state> state{reply_state::idle};
    detail::remote::sample_request request;  // what it answers
    detail::remote::reply_layout layout;
    std::uint32_t to_post = 0, posted = 0, completed = 0;  // its writes
    std::uint32_t segments = 0;                            // its columns, then its meta part
  };
  std::unique_ptr<std::array<reply_write, max_replies_in_flight>> writes =
      std::make_unique<std::array<reply_write, max_replies_in_flight>>();
  std::unique_ptr<fabric::endpoint> channel;
  fabric::region reply_region{};
  fi_addr_t reply_to = FI_ADDR_UNSPEC;
  /// A request not yet packed, with the layout its check computed (check_request_fits).
  struct deferred_request {
    detail::remote::sample_request request;
    detail::remote::reply_layout layout;
  };
  std::deque<deferred_request> deferred;  // oldest first

  /// Posts what the packer has sealed, from shard `shard` (columns of `step_bytes`): its
  /// segments (each column into the learner's batch, then the meta part into its slice) as few
  /// writes as the channel allows, the header first counting the writes before the meta part's;
  /// a provider that asks to retry is retried next time. Returns the replies that could not go
  /// (dropped).
  std::uint64_t post_replies(std::uint32_t shard, std::span<const std::int64_t> step_bytes) {
    namespace remote = detail::remote;
    using segment = fabric::endpoint::write_segment;
    std::uint64_t failed = 0;
    const std::size_t per_write = channel->write_segments();
    for (std::size_t i = 0; i < slots; ++i) {
      reply_write& w = (*writes)[i];
      if (w.state.load(std::memory_order_acquire) != reply_state::packed) continue;
      const remote::sample_request& r = w.request;
      const std::uint64_t staging = i * slot_bytes;
      if (w.to_post == 0) {  // an empty reply (the buffer could not sample) has no columns
        remote::reply_header h;
        std::memcpy(&h, reply->data() + staging, sizeof h);
        w.segments = 1 + (h.rows > 0 ? static_cast<std::uint32_t>(step_bytes.size()) : 0);
        h.column_writes = remote::reply_column_writes(w.segments - 1, per_write);
        std::memcpy(reply->data() + staging, &h, sizeof h);
        w.to_post = h.column_writes + 1u;
      }
      // Segment k of the reply: column k, or the meta part after the last column.
      const auto segment_of = [&](std::size_t k) -> segment {
        if (k + 1 == w.segments)
          return {staging, r.reply_bytes, slice_address + r.reply_offset, slice_key};
        return {staging + static_cast<std::uint64_t>(w.layout.column_at[k]),
                static_cast<std::size_t>(r.rows * r.win.length * step_bytes[k]),
                r.column_address[k], r.batch_key};
      };
      try {
        while (w.posted < w.to_post) {
          const std::size_t first = w.posted * per_write,
                            end = std::min<std::size_t>(first + per_write, w.segments);
          std::array<segment, fabric::endpoint::max_write_segments> these{};
          for (std::size_t k = first; k < end; ++k) these[k - first] = segment_of(k);
          const remote::cq_data data{end == w.segments ? remote::write_kind::sample_reply
                                                       : remote::write_kind::sample_column,
                                     shard, r.request};
          if (!channel->try_writemsg(reply_region, std::span(these.data(), end - first), reply_to,
                                     data.encode(), &w.state))
            break;
          ++w.posted;
        }
        if (w.posted == w.to_post) w.state = reply_state::writing;  // until its completions
      } catch (const error&) {  // this learner's reply cannot go: the rest is dropped
        w.to_post = w.posted;
        w.state = w.posted == w.completed ? reply_state::idle : reply_state::writing;
        ++failed;
      }
    }
    return failed;
  }
  /// The reply slot the oldest deferred request may be packed into: a free one, unless a slot in
  /// use still writes over the range of the slice the request names (a learner reuses a reply
  /// area once its reply arrived or it gave up on it; a rogue one's requests wait). None while
  /// it must wait. The progress thread's: it alone fills slots and defers requests.
  [[nodiscard]] std::optional<std::size_t> slot_for_next() const noexcept {
    if (deferred.empty()) return std::nullopt;
    const detail::remote::sample_request& r = deferred.front().request;
    std::optional<std::size_t> slot;
    for (std::size_t i = 0; i < slots; ++i) {
      const reply_write& w = (*writes)[i];
      const bool in_use = w.state.load(std::memory_order_acquire) != reply_state::idle;
      if (in_use && w.request.reply_offset < r.reply_offset + r.reply_bytes &&
          r.reply_offset < w.request.reply_offset + w.request.reply_bytes)
        return std::nullopt;
      if (!in_use && !slot) slot = i;
    }
    return slot;
  }
  /// What this learner's replies wait for: the packer, posting, their writes' completions.
  struct activity {
    bool packing = false, packed = false, writing = false;
  };
  [[nodiscard]] activity replies_activity() const noexcept {
    activity a;
    for (std::size_t i = 0; i < slots; ++i) {
      const reply_state st = (*writes)[i].state.load(std::memory_order_acquire);
      a.packing = a.packing || st == reply_state::packing;
      a.packed = a.packed || st == reply_state::packed;
      a.writing = a.writing || st == reply_state::writing;
    }
    return a;
  }
  /// Counts a completion of one of the writes of reply_write `w` (its context): the last frees it.
  static void completed(reply_write& w) noexcept {
    if (++w.completed == w.to_post) w.state = reply_state::idle;
  }
};

}  // namespace gear::transport
