#pragma once
// A shard of a distributed buffer: replay_buffer<Spec, Storage, Selection, transport::libfabric>
// with real storage. It is the local buffer of that storage (every call of replay_buffer, same
// semantics, from any thread) and serves it to remote actors and learners while it lives
// (shard_server.hpp), on a progress thread of its own.
//
// Its keys name it: key.shard is the transport's shard id and key.incarnation a random number
// drawn when it starts, never 0, so that a key from before a restart is stale rather than
// confused with a new trajectory. Local calls and remote peers use the same keys: a key a local
// sample returns may go to a remote learner's update, and the other way round.
//
// It cannot be moved (its server holds it); build it where it lives, or behind a unique_ptr.

#include <cstdint>
#include <gear/replay_buffer.hpp>
#include <gear/transport/libfabric.hpp>
#include <gear/transport/shard_server.hpp>
#include <memory>
#include <utility>
#include <vector>

namespace gear {

template <trajectory_spec Spec, class Storage, class Selection>
class replay_buffer<Spec, Storage, Selection, transport::libfabric>
    : public replay_buffer<Spec, Storage, Selection, transport::shard_view> {
 public:
  /// The local buffer this shard is (every call but the ones below is its).
  using local_type = replay_buffer<Spec, Storage, Selection, transport::shard_view>;
  using transport_type = transport::libfabric;
  using server_type = transport::shard_server<local_type>;
  using counters = typename server_type::counters;

  /// Allocates the storage as a local buffer does (its slots from `memory`'s resources where
  /// given: memory_resource.hpp), opens the fabric endpoint and starts serving.
  /// Throws as the local buffer does, and errc::invalid_argument (a shard id past 4095, a block
  /// size that is not a power of two in [4 KiB, 16 MiB]), errc::transport_error (no such
  /// provider, the endpoint cannot open).
  replay_buffer(gear::capacity slots, gear::max_length length, Selection selection,
                transport::libfabric t, const memory_resources& memory = {})
      : local_type(slots, length, selection,
                   transport::shard_view{{t.shard, detail::remote::draw_incarnation()}}, memory),
        transport_(std::move(t)) {
    const std::uint32_t b = transport_.block_bytes;
    GEAR_REQUIRE(b >= 4096 && b <= (16u << 20) && (b & (b - 1)) == 0, errc::invalid_argument,
                 "block_bytes must be a power of two in [4 KiB, 16 MiB], got " + std::to_string(b));
    typename server_type::options o;
    o.fabric = transport_.fabric;
    o.shard = transport_.shard;
    o.max_ring_blocks = transport_.max_ring_blocks;
    o.block_bytes = b;
    o.max_peers = transport_.max_peers;
    o.token = transport_.token;
    o.buffer_names_shard = true;
    server_ = std::make_unique<server_type>(static_cast<local_type&>(*this), std::move(o));
  }
  replay_buffer(gear::capacity slots, gear::max_length length, transport::libfabric t,
                const memory_resources& memory = {})
      : replay_buffer(slots, length, Selection{}, std::move(t), memory) {}

  replay_buffer(replay_buffer&&) = delete;
  replay_buffer& operator=(replay_buffer&&) = delete;
  /// Stops serving (the progress thread ends) before the storage goes.
  ~replay_buffer() { server_.reset(); }

  /// The address blob to give actors and learners (transport::libfabric::shards), by any channel.
  [[nodiscard]] const std::vector<std::byte>& address() const noexcept {
    return server_->address();
  }
  [[nodiscard]] const transport::libfabric& transport() const noexcept { return transport_; }
  /// This run's incarnation, which every key of this shard carries.
  [[nodiscard]] std::uint32_t incarnation() const noexcept {
    return local_type::transport().incarnation();
  }
  /// What remote peers did: inserts stored and refused, peers, failed transfers, dropped sends,
  /// messages and entries refused by reason.
  [[nodiscard]] counters stats() const { return server_->stats(); }
  /// The buffer's own sizes and counts (replay_buffer::stats, which stats() above hides): every
  /// call counted, local and remote.
  [[nodiscard]] buffer_stats local_stats() const { return local_type::stats(); }

 private:
  transport::libfabric transport_;
  std::unique_ptr<server_type> server_;
};

}  // namespace gear
