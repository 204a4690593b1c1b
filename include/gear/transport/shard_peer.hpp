#pragma once
// gear::transport::shard_peer: what a shard (shard_server.hpp) keeps of one actor or learner it
// welcomed. Peers have endpoints of their own at the shard, beside the shard's control endpoint:
//   a learner's channel where the shard writes its sample replies from;
//   an actor's intake   on shm, where it writes its insert entries, into its staging ring
//                       (registered there alone, so it can write nowhere else).
// On shm a write whose peer died in the middle never completes, and an endpoint takes a peer's
// writes in order with everyone else's (without cross-memory attach, the receiving side copies
// them): with one endpoint for all, one dead peer would stall every other. Providers with a
// connection per peer (tcp, verbs, efa) have no such queue, and there actors write into the
// control endpoint: a progress thread polling an intake per actor there paid for it (8 actors
// over tcp;ofi_rxm inserted 45% less). Each endpoint is declared after the memory registered on
// it, so that it closes first.

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <gear/detail/remote/messages.hpp>
#include <gear/transport/fabric_memory.hpp>
#include <gear/transport/libfabric.hpp>
#include <gear/transport/reply_packer.hpp>
#include <memory>
#include <set>
#include <string>

namespace gear::transport {

/// Replies to one learner a shard has on the wire at once: it packs the next while one is written.
inline constexpr std::size_t max_replies_in_flight = 2;

/// True when a shard on `provider` gives each actor an intake endpoint (see the top of this file).
inline bool intake_per_actor(const std::string& provider) noexcept {
  return provider.rfind("shm", 0) == 0;
}

struct shard_peer {
  fi_addr_t address = FI_ADDR_UNSPEC;  // on the shard's control endpoint
  detail::remote::peer_role role{};

  // An actor's staging ring, and its intake (null where the control endpoint takes entries).
  std::unique_ptr<fabric::host_region> ring;
  std::uint32_t ring_blocks = 0;
  std::uint64_t next_sequence = 0;  // every sequence below it was accepted
  std::set<std::uint64_t> ahead;    // accepted ones above it
  std::unique_ptr<fabric::endpoint> intake;
  fabric::region ring_region{};

  // A learner's slice for sample replies, and the registered memory replies are packed in, as
  // large as the slice: a reply at offset o of the slice is packed at o here (by the packer),
  // then written (its context is its state) and busy until the write completes.
  std::uint64_t slice_address = 0, slice_key = 0, slice_bytes = 0;
  std::unique_ptr<fabric::host_region> reply;
  struct reply_write {
    std::atomic<reply_state> state{reply_state::idle};
    std::uint64_t offset = 0, bytes = 0;
    std::uint32_t request = 0;
  };
  std::unique_ptr<std::array<reply_write, max_replies_in_flight>> writes =
      std::make_unique<std::array<reply_write, max_replies_in_flight>>();
  std::unique_ptr<fabric::endpoint> channel;
  fabric::region reply_region{};
  fi_addr_t reply_to = FI_ADDR_UNSPEC;
  std::deque<detail::remote::sample_request> deferred;  // not yet packed, oldest first
};

}  // namespace gear::transport
