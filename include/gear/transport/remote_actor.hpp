#pragma once
// gear::transport::remote_actor: inserts trajectories into remote shards (shard_server.hpp) over a
// fabric endpoint, with no buffer of its own.
//
// At construction it greets every shard (hello) and receives its staging ring (welcome). An
// insert routes each trajectory to a shard (options.route: round robin by default), packs it into
// local registered memory as an insert entry (detail/remote/entry.hpp) at the blocks it will take
// in that shard's ring, writes it there with one one-sided write whose remote CQ data publishes it,
// and returns once every shard has acknowledged its entries with their keys (or, inserting without
// keys, once the writes are posted: later calls read the acknowledgements). Nothing of an entry is
// visible before the shard has checked it; an actor that dies mid-write leaves an entry no one
// reads. Blocks are credits: an entry waits for ring space, freed by acknowledgements, up to the
// deadline (errc::timeout). A shard that does not answer by the deadline is reported as
// errc::peer_lost, named by its id, pid and host. On shm each shard sends its welcome and
// acknowledgements into an inlet endpoint of the actor's for that shard alone (remote_client.hpp),
// so a stalled shard holds up none of the others'. The actor is driven by its caller's thread: its
// calls make the progress.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <gear/detail/mix.hpp>
#include <gear/detail/remote/blob.hpp>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/fingerprint.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/insert.hpp>
#include <gear/key.hpp>
#include <gear/transport/remote_client.hpp>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace gear::transport {

template <class Spec>
class remote_actor : public remote_client {
 public:
  struct options {
    libfabric_config fabric;
    routing route = routing::round_robin;
    std::uint32_t ring_blocks = 64;  ///< staging blocks asked of each shard
    std::chrono::milliseconds deadline{30000};
    std::string token;  ///< the shards' handshake token
  };

  /// Connects to every shard whose address blob is given. Throws errc::peer_mismatch (another
  /// spec or provider), errc::peer_lost (no welcome by the deadline), errc::transport_error.
  remote_actor(std::span<const std::vector<std::byte>> shard_blobs, options o)
      : remote_client(shard_blobs, o.fabric, o.deadline, detail::remote::spec_fingerprint<Spec>(),
                      std::nullopt, o.token),
        options_(std::move(o)),
        shards_(links_.size()) {
    if (options_.route == routing::local_first) {  // the shards on this host, if any
      const std::string host = detail::remote::host_name();
      for (std::size_t s = 0; s < links_.size(); ++s)
        if (links_[s].blob.hostname == host) turns_.push_back(s);
    }
    if (turns_.empty())
      for (std::size_t s = 0; s < links_.size(); ++s) turns_.push_back(s);
    open_inlets(options_.fabric);  // on shm, an endpoint per shard to hear from
    greet([&](std::size_t s) {
      detail::remote::hello h;
      h.role = detail::remote::peer_role::actor;
      h.spec_fingerprint = detail::remote::spec_fingerprint<Spec>();
      h.selection_fingerprint = links_[s].blob.selection_fingerprint;
      h.hostname = "actor";
      h.ring_blocks = options_.ring_blocks;
      return h;
    });
  }

  /// Waits (up to the deadline) for the acknowledgements of inserts without keys, so that their
  /// writes are not cut off by the endpoint's close; refusals and failures go unreported: call
  /// flush() first to see them.
  ~remote_actor() {
    try {
      flush();
    } catch (...) {  // a lost shard, a refusal: unreported here
    }
    close();
  }

  /// Inserts the trajectories (host memory, packed as for replay_buffer::insert), each to the
  /// next shard in turn, and writes their keys (which name the shard) once all are stored.
  /// Throws, sending nothing: errc::invalid_argument (keys_out too small), errc::wrong_memory
  /// (not host memory), errc::null_pointer, errc::wrong_type, errc::wrong_shape,
  /// errc::misaligned_pointer, errc::empty_trajectory, errc::trajectory_too_long; then
  /// errc::timeout (no ring space by the deadline), errc::peer_lost, or errc::invalid_argument
  /// (a shard's buffer refused an entry: the others stay stored, and keys_out holds their keys
  /// and a key of ticket gear::no_ticket for each refused).
  /// Refusals of earlier inserts without keys that came back since are thrown first, sending
  /// nothing (see insert(in)).
  void insert(const trajectories<Spec>& in, std::span<key> keys_out) {
    const std::size_t count = in.lengths.size();
    GEAR_REQUIRE(keys_out.size() >= count, errc::invalid_argument,
                 "keys_out holds " + std::to_string(keys_out.size()) + " keys, need " +
                     std::to_string(count));
    const auto until = clock::now() + options_.deadline;
    const std::size_t first_pending = post(in, until);
    // Every entry of this call acknowledged: its key, or the shard's refusal.
    for (std::size_t p = first_pending; p < pending_.size(); ++p)
      wait_until([&] { return pending_[p].acked; }, until, pending_[p].shard, "acknowledgement");
    for (std::size_t p = first_pending; p < pending_.size(); ++p) {
      const auto& e = pending_[p];
      keys_out[e.index] = e.stored;
    }
    std::vector<pending> mine(pending_.begin() + static_cast<std::ptrdiff_t>(first_pending),
                              pending_.end());
    pending_.resize(first_pending);
    for (const auto& e : mine)
      GEAR_REQUIRE(e.stored.ticket != no_ticket, errc::invalid_argument,
                   "shard " + std::to_string(links_[e.shard].blob.shard) + " refused trajectory " +
                       std::to_string(e.index) + " of the insert");
  }

  /// Inserts without waiting for the shards: returns once every trajectory is packed into this
  /// actor's staging (`in` may be reused) and its write is posted, keeping up to a staging ring
  /// of entries in flight per shard (the credits: a call waits for ring space as insert does).
  /// No keys are reported. A shard that refuses an entry (its buffer's insert failed, or it ran
  /// out of memory) says so in its acknowledgement, which a later call reads: the next insert or
  /// flush of the thread that inserted it throws errc::invalid_argument naming each shard and
  /// how many it refused, sending nothing. Throws as insert(in, keys_out) does, except for
  /// keys_out. The destructor waits for the acknowledgements (up to the deadline) but reports
  /// nothing: flush() before it.
  void insert(const trajectories<Spec>& in) {
    (void)post(in, clock::now() + options_.deadline, true);
  }

  /// Waits until every entry inserted so far is acknowledged, up to the deadline
  /// (errc::peer_lost naming the shard that did not answer); throws errc::invalid_argument for
  /// entries of this thread's insert(in) calls that a shard refused.
  void flush() {
    const auto until = clock::now() + options_.deadline;
    for (std::size_t p = 0; p < pending_.size(); ++p)
      wait_until([&] { return pending_[p].acked; }, until, pending_[p].shard, "acknowledgement");
    collect_acknowledged();
  }

  /// Entries posted and not yet acknowledged.
  [[nodiscard]] std::size_t in_flight() const noexcept {
    return static_cast<std::size_t>(
        std::count_if(pending_.begin(), pending_.end(), [](const pending& p) { return !p.acked; }));
  }

 private:
  using clock = std::chrono::steady_clock;

  /// Checks `in` and every trajectory against its shard, then packs and writes each (taking
  /// staging blocks, waiting for them up to `until`); returns where this call's entries start in
  /// pending_. Entries of calls without keys (`keyless`) are collected by later calls.
  std::size_t post(const trajectories<Spec>& in, clock::time_point until, bool keyless = false) {
    namespace remote = detail::remote;
    const std::size_t count = in.lengths.size();
    GEAR_REQUIRE(in.source == memory_kind::host, errc::wrong_memory,
                 "a remote insert reads its trajectories from host memory");
    [&]<std::size_t... C>(std::index_sequence<C...>) {
      (detail::check_column_input<Spec, C>(in.columns[C]), ...);
    }
    (std::make_index_sequence<Spec::num_columns>{});
    for (std::size_t t = 0; t < count; ++t)
      GEAR_REQUIRE(
          in.lengths[t] >= 1, errc::empty_trajectory,
          "trajectory " + std::to_string(t) + " has length " + std::to_string(in.lengths[t]));
    collect_acknowledged();  // throws earlier refusals, sending nothing
    std::vector<const std::byte*> at(Spec::num_columns);
    for (std::size_t c = 0; c < Spec::num_columns; ++c)
      at[c] = static_cast<const std::byte*>(in.columns[c].data);
    // Check every trajectory against the shard it goes to before anything moves.
    const std::vector<std::size_t> route = routes(in);
    for (std::size_t t = 0; t < count; ++t) {
      const std::int64_t length = in.lengths[t];
      const shard& to = shards_[route[t]];
      const auto& blob = links_[route[t]].blob;
      GEAR_REQUIRE(length <= blob.max_length &&
                       remote::layout_entry(Spec::step_bytes, length, to.block_bytes).blocks <=
                           to.ring_blocks,
                   errc::trajectory_too_long,
                   "trajectory " + std::to_string(t) + " has " + std::to_string(length) +
                       " steps; shard " + std::to_string(blob.shard) + " takes up to " +
                       std::to_string(blob.max_length));
    }
    next_shard_ += count;
    std::size_t first_pending = pending_.size();
    for (std::size_t t = 0; t < count; ++t) {
      const std::int64_t length = in.lengths[t];
      const std::size_t s = route[t];
      shard& to = shards_[s];
      const auto layout = remote::layout_entry(Spec::step_bytes, length, to.block_bytes);
      const std::uint32_t first = take_blocks(s, static_cast<std::uint32_t>(layout.blocks), until);
      remote::entry_header h;
      h.actor = to.peer_index;
      h.sequence = to.next_sequence;  // taken once the write is posted
      h.length = length;
      h.first_block = first;
      const std::size_t offset = std::size_t{first} * to.block_bytes;
      remote::pack_entry_into(
          h, at, Spec::step_bytes, layout,
          {to.staging->data() + offset, static_cast<std::size_t>(layout.blocks) * to.block_bytes});
      for (std::size_t c = 0; c < Spec::num_columns; ++c) at[c] += length * Spec::step_bytes[c];
      // The remote address: inside the ring the shard granted (checked by take_blocks).
      const remote::cq_data data{remote::write_kind::insert_entry, to.peer_index, first};
      try {
        while (!ep_->try_writedata(
            to.staging_region, offset, static_cast<std::size_t>(layout.total_bytes), to.intake,
            to.ring_address + offset, to.ring_key, data.encode(), &write_context_)) {
          if (clock::now() > until) lost(s, "acceptance of a write");
          if (poll() == 0) std::this_thread::yield();
        }
      } catch (...) {  // not posted: its blocks and sequence were never used
        for (std::uint32_t b = first; b < first + layout.blocks; ++b) to.busy[b] = 0;
        to.head = first;
        throw;
      }
      ++to.next_sequence;
      pending_.push_back({s, h.sequence, first, static_cast<std::uint32_t>(layout.blocks), t,
                          false, keyless, {}, caller_id()});
    }
    return first_pending;
  }

  /// Drops acknowledged entries from pending_ (a keyed call's own are taken by that call, which
  /// never overlaps this), keeping the refusals of entries of inserts without keys for the
  /// thread that inserted them; throws errc::invalid_argument when a shard refused entries of
  /// this thread's (an actor shared by threads that take turns: each hears of its own only).
  void collect_acknowledged() {
    std::erase_if(pending_, [&](const pending& p) {
      if (!p.acked) return false;
      if (p.keyless && p.stored.ticket == no_ticket) {
        auto it = std::find_if(refusals_.begin(), refusals_.end(),
                               [&](const refusals& r) { return r.caller == p.caller; });
        if (it == refusals_.end()) it = refusals_.insert(it, {p.caller, {}});
        it->per_shard.resize(links_.size());
        ++it->per_shard[p.shard];
      }
      return true;
    });
    const auto mine = std::find_if(refusals_.begin(), refusals_.end(), [](const refusals& r) {
      return r.caller == caller_id();
    });
    if (mine == refusals_.end()) return;
    const std::vector<std::size_t> refused = std::move(mine->per_shard);
    refusals_.erase(mine);
    std::string which;
    for (std::size_t s = 0; s < refused.size(); ++s)
      if (refused[s] > 0)
        which += (which.empty() ? "shard " : ", shard ") + std::to_string(links_[s].blob.shard) +
                 " refused " + std::to_string(refused[s]);
    throw error(errc::invalid_argument,
                which +
                    " trajectories of earlier inserts without keys (its buffer's insert "
                    "failed, or it ran out of memory)");
  }

  struct shard {  // links_[s]'s ring, once welcomed
    std::uint32_t peer_index = 0;
    fi_addr_t intake = FI_ADDR_UNSPEC;  // the shard's endpoint this actor's ring is on (shm: one
                                        // of its own; else the shard's control endpoint)
    std::uint64_t ring_address = 0, ring_key = 0;
    std::uint32_t ring_blocks = 0, block_bytes = 0;
    std::unique_ptr<fabric::host_region> staging;  // mirrors the shard's ring, block for block
    fabric::region staging_region{};
    std::vector<char> busy;  // per block: holds an entry not yet acknowledged
    std::uint32_t head = 0;
    std::uint64_t next_sequence = 0;
  };
  struct pending {
    std::size_t shard;
    std::uint64_t sequence;
    std::uint32_t first_block, blocks;
    std::size_t index;  // in the insert call
    bool acked;
    bool keyless;  // of insert(in): collected by a later call
    key stored;
    std::uint64_t caller;  // whose insert(in) (caller_id()): its refusal goes to its next call
  };

  void on_welcome(std::size_t s, const detail::remote::welcome& w) override {
    GEAR_REQUIRE(w.ring_key.size() == sizeof(std::uint64_t) && w.ring_blocks > 0 &&
                     w.ring_blocks <= options_.ring_blocks && w.peer_index >= 1 &&
                     w.peer_index < detail::remote::max_peers &&
                     (w.intake.empty() || ep_->fits_address(w.intake)),
                 errc::peer_mismatch,
                 "shard " + std::to_string(links_[s].blob.shard) +
                     " granted no usable staging ring or intake, or named this actor out of range");
    shard& to = shards_[s];
    to.intake = w.intake.empty() ? links_[s].address : ep_->insert_peer(w.intake);
    to.peer_index = w.peer_index;
    to.ring_address = w.ring_address;
    std::memcpy(&to.ring_key, w.ring_key.data(), sizeof(to.ring_key));
    to.ring_blocks = w.ring_blocks;
    largest_ring_ = std::max(largest_ring_, w.ring_blocks);
    to.block_bytes = w.block_bytes;
    to.staging = std::make_unique<fabric::host_region>(std::size_t{w.ring_blocks} * w.block_bytes);
    to.staging_region = ep_->register_memory(to.staging->data(), to.staging->size(), FI_WRITE);
    to.busy.assign(w.ring_blocks, 0);
  }

  void on_message(std::span<const std::byte> message, detail::remote::message_type type,
                  std::optional<std::size_t> from) override {
    namespace remote = detail::remote;
    if (type != remote::message_type::ack) return;
    // Parsed once, against the largest ring: the entry it names holds its own blocks.
    const auto a = remote::parse_ack(message, {}, largest_ring_);
    if (!a) return;
    for (auto& p : pending_) {
      if (p.acked) continue;
      if (a.value.sequence != p.sequence || a.value.first_block != p.first_block ||
          a.value.stored.incarnation != links_[p.shard].blob.incarnation ||
          !from_shard(from, p.shard))
        continue;
      p.acked = true;
      p.stored = a.value.stored;
      auto& busy = shards_[p.shard].busy;
      for (std::uint32_t b = p.first_block; b < p.first_block + p.blocks; ++b) busy[b] = 0;
      return;
    }
  }

  /// The shard each trajectory of `in` goes to (options.route), from the turn as it is (insert
  /// advances it once the call is checked: a refused call changes nothing).
  std::vector<std::size_t> routes(const trajectories<Spec>& in) const {
    const std::size_t count = in.lengths.size();
    std::vector<std::size_t> route(count);
    if (options_.route == routing::by_hash) {
      std::vector<std::int64_t> first(Spec::num_columns, 0);  // step offset of trajectory t
      for (std::size_t t = 0; t < count; ++t) {
        std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over every column's bytes
        for (std::size_t c = 0; c < Spec::num_columns; ++c) {
          const auto* p = static_cast<const unsigned char*>(in.columns[c].data) +
                          first[c] * Spec::step_bytes[c];
          const std::int64_t bytes = in.lengths[t] * Spec::step_bytes[c];
          for (std::int64_t b = 0; b < bytes; ++b) h = (h ^ p[b]) * 0x100000001b3ull;
          first[c] += in.lengths[t];
        }
        // Mixed: FNV's low bits depend only on the bytes' low bits, so a count of shards that
        // is a power of two would split by a few bits of each byte.
        route[t] = static_cast<std::size_t>(detail::mix64(h) % shards_.size());
      }
      return route;
    }
    for (std::size_t t = 0; t < count; ++t) route[t] = turns_[(next_shard_ + t) % turns_.size()];
    return route;
  }

  /// The first of `n` consecutive free blocks of shard s's ring, taken in ring order; waits for
  /// acknowledgements while there are none, up to `until` (errc::timeout).
  std::uint32_t take_blocks(std::size_t s, std::uint32_t n, clock::time_point until) {
    shard& to = shards_[s];
    for (;;) {
      std::uint32_t first = to.head + n <= to.ring_blocks ? to.head : 0;
      bool free = true;
      for (std::uint32_t b = first; b < first + n && free; ++b) free = to.busy[b] == 0;
      if (free) {
        for (std::uint32_t b = first; b < first + n; ++b) to.busy[b] = 1;
        to.head = (first + n) % to.ring_blocks;
        return first;
      }
      if (clock::now() > until)
        throw error(errc::timeout, "no staging space at shard " +
                                       std::to_string(links_[s].blob.shard) + " within " +
                                       std::to_string(options_.deadline.count()) +
                                       " ms: it acknowledges no entry");
      if (poll() == 0) std::this_thread::yield();
    }
  }

  options options_;
  std::vector<shard> shards_;  // their staging outlives the endpoint (reset by remote_client)
  std::vector<pending> pending_;
  struct refusals {  // entries of a thread's inserts without keys that shards refused, untold
    std::uint64_t caller;
    std::vector<std::size_t> per_shard;
  };
  std::vector<refusals> refusals_;

  /// This thread's number, never reused in the process (a std::thread::id is, once its thread
  /// has ended: a later thread would be told of an ended one's refusals).
  static std::uint64_t caller_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    thread_local const std::uint64_t mine = next.fetch_add(1, std::memory_order_relaxed);
    return mine;
  }
  std::uint32_t largest_ring_ = 0;  // of shards_' rings
  std::size_t next_shard_ = 0;
  std::vector<std::size_t> turns_;  // the shards inserts take in turn: this host's (local_first)
                                    // where there are any, else all
  int write_context_ = 0;
};

}  // namespace gear::transport
