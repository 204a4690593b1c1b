#pragma once
// gear::transport::shard_server: serves one local replay buffer to remote actors and learners
// (remote_actor.hpp, remote_learner.hpp) over a fabric endpoint (transport/libfabric.hpp). The
// buffer stays the caller's: it may sample, update and insert locally at the same time.
//
// A progress thread owns the control endpoint and the actors' intakes, and acts on what
// completes, outside the poll (entries are inserted by the inserter thread, a learner's replies
// packed by the packer thread and written by a thread of that learner's: entry_inserter.hpp,
// reply_packer.hpp, reply_writer.hpp):
//   hello          a welcome: an actor gets its own staging ring (a registered region only it may
//                  write; on shm, on an intake endpoint of its own), a learner's slice (its
//                  memory for replies) is recorded and a channel endpoint opened for its replies,
//                  written to the learner's inlet for this shard (remote_client.hpp) where it
//                  gives one (shard_peer.hpp);
//   insert entry   published by remote CQ data (through its actor's intake where it has one; one
//                  naming another actor is refused): checked against the layout computed here
//                  (never the sender's; detail/remote/entry.hpp), inserted into the buffer,
//                  acknowledged with its key, which frees its blocks (the actor's credits; an
//                  actor's acknowledgements of one round go in one bundle); an entry the buffer
//                  refuses is acknowledged with no ticket;
//   sample request queued per learner (several may come in a bundle: frame.hpp), up to 8
//                  replies in flight each (fewer, down to 2, above 8 MiB): selected and gathered
//                  by the buffer's policy, its columns written into the learner's batch, the rest
//                  into its slice (shard_operations.hpp);
//   update, erase  pairs of this incarnation applied (or removed), the others counted stale;
//   status request the buffer's size and selection mass.
// Whatever a peer sends that does not hold up is refused and counted (stats()); it serves on.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <gear/detail/remote/blob.hpp>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/fingerprint.hpp>
#include <gear/detail/remote/hmac.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/insert.hpp>
#include <gear/priority_update.hpp>
#include <gear/transport/entry_inserter.hpp>
#include <gear/transport/fabric_memory.hpp>
#include <gear/transport/libfabric.hpp>
#include <gear/transport/reply_packer.hpp>
#include <gear/transport/reply_writer.hpp>
#include <gear/transport/shard_operations.hpp>
#include <gear/transport/shard_peer.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gear::transport {

/// The largest slice a learner may grant a shard (its replies' size bound).
inline constexpr std::uint64_t max_slice_bytes = std::uint64_t{1} << 32;
/// Sample requests of one learner a shard queues before it refuses more.
inline constexpr std::size_t max_deferred_requests = 64;

template <class Buffer>
class shard_server {
 public:
  using spec = typename Buffer::spec_type;

  struct options {
    libfabric_config fabric;
    std::uint32_t shard = 0;
    std::uint32_t max_ring_blocks = 256;    ///< per actor: it asks, up to this
    std::uint32_t block_bytes = 64 * 1024;  ///< a power of two in [4 KiB, 16 MiB]
    std::uint32_t max_peers = 64;
    /// Per control message: past it, the message is dropped and counted (a peer that died with
    /// the provider's queue to it full must not stall the others for long).
    std::chrono::milliseconds send_deadline{1000};
    /// The handshake token: a client must prove it knows the same one (detail/remote/hmac.hpp).
    std::string token;
    /// The buffer's keys name this shard (a distributed shard's): else it draws an incarnation.
    bool buffer_names_shard = false;
  };
  struct counters {
    /// Entries inserted (or refused by the buffer) and acknowledged.
    std::uint64_t inserted = 0, refused_inserts = 0, peers = 0;
    std::uint64_t failed_transfers = 0;  ///< completions in error (a peer gone, a refused access)
    std::uint64_t dropped_sends = 0;     ///< control messages not accepted by the deadline
    std::uint64_t bundles = 0;           ///< messages of several sample requests (frame.hpp)
    detail::remote::refusal_counts refused;  ///< messages and entries, by reason
    /// Seconds the shard's threads spent working rather than waiting: the progress thread on
    /// what came in, the packer on packing replies, the learners' writers (together) on posting
    /// and completing them, the inserter on inserting entries. Against wall time they say which
    /// thread bounds the shard.
    double progress_busy_s = 0, packer_busy_s = 0, writers_busy_s = 0, inserter_busy_s = 0;
  };

  /// Opens the endpoint and starts serving. Throws errc::transport_error (no provider, ...).
  shard_server(Buffer& buffer, options o)
      : buffer_(buffer),
        options_(std::move(o)),
        inbox_(1 << 20),
        ep_(std::make_unique<fabric::endpoint>(options_.fabric)),
        outbox_(*ep_, 64, detail::remote::default_max_message) {
    GEAR_REQUIRE(options_.shard < detail::remote::max_peers, errc::invalid_argument,
                 "shard ids go up to " + std::to_string(detail::remote::max_peers - 1) +
                     " (the completion data's 12 bits), got " + std::to_string(options_.shard));
    const bool named = options_.buffer_names_shard;
    GEAR_REQUIRE(!named || local_.shard == options_.shard, errc::invalid_argument,
                 "the buffer is shard " + std::to_string(local_.shard) + ", the options say " +
                     std::to_string(options_.shard));
    incarnation_ = named ? local_.incarnation : detail::remote::draw_incarnation();
    std::random_device seed;
    inbox_region_ = ep_->register_memory(inbox_.data(), inbox_.size(), FI_RECV);
    ep_->receive_into(inbox_region_, detail::remote::default_max_message);
    detail::remote::address_blob b;
    b.provider = ep_->provider();
    b.address_format = ep_->address_format();
    b.address = ep_->name();
    b.shard = options_.shard;
    b.incarnation = incarnation_;
    b.pid = static_cast<std::uint32_t>(getpid());
    do b.nonce = (std::uint64_t{seed()} << 32) | seed();
    while (b.nonce == 0);
    b.hostname = detail::remote::host_name();
    b.capacity = buffer.capacity();
    b.max_length = buffer.max_length();
    b.spec_fingerprint = detail::remote::spec_fingerprint<spec>();
    b.selection_fingerprint =
        detail::remote::selection_fingerprint<typename Buffer::selection_type>();
    blob_ = b;
    address_ = detail::remote::encode(b);
    packer_ = std::make_unique<reply_packer<Buffer>>(buffer_, owner());
    inserter_ = std::make_unique<entry_inserter<Buffer>>(buffer_, owner());
    thread_ = std::thread([this] { run(); });
  }
  ~shard_server() {
    stop();
    packer_.reset();    // its last job done: it writes into the peers' reply memory
    inserter_.reset();  // it reads from the peers' rings
    ep_.reset();        // closes every registration before the memory under them is freed
  }
  shard_server(const shard_server&) = delete;
  shard_server& operator=(const shard_server&) = delete;

  /// The address blob to hand to actors and learners (any channel).
  [[nodiscard]] const std::vector<std::byte>& address() const noexcept { return address_; }
  [[nodiscard]] std::uint32_t incarnation() const noexcept { return incarnation_; }
  [[nodiscard]] counters stats() const {
    const std::lock_guard held(stats_mutex_);
    counters c = stats_;
    c.failed_transfers += failed_replies_.load(std::memory_order_relaxed);
    c.progress_busy_s = 1e-9 * double(progress_busy_ns_.load(std::memory_order_relaxed));
    c.packer_busy_s = 1e-9 * double(packer_->busy_ns());
    c.inserter_busy_s = 1e-9 * double(inserter_->busy_ns());
    c.inserted = inserter_->inserted();
    c.refused_inserts = inserter_->refused();
    c.writers_busy_s = 1e-9 * double(writers_busy_ns_.load(std::memory_order_relaxed));
    return c;
  }
  /// Stops serving (the progress thread ends within a poll; entries checked by then are
  /// inserted, and not acknowledged).
  void stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
    if (inserter_) inserter_->stop();
    for (auto& w : writers_) w->stop();  // the progress thread, which adds them, is done
  }

 private:
  using peer = shard_peer;
  /// A completion to act on: a control message (copied out of the receive buffer) or an entry
  /// (from the intake of peer `from`).
  struct work {
    std::vector<std::byte> message;
    std::uint64_t entry = 0;
    std::uint32_t from = 0;
  };

  void run() {
    std::uint64_t idle = 0;  // polls in a row that found nothing
    while (!stopping_) {
      try {
        const auto start = std::chrono::steady_clock::now();
        const std::size_t n = poll();
        while (!work_.empty()) {  // acted on outside the poll: handlers send, and sends poll
          const work w = std::move(work_.front());
          work_.pop_front();
          if (w.message.empty())
            on_entry(detail::remote::cq_data::decode(w.entry), w.from);
          else
            on_message(w.message);
        }
        for (auto& p : peers_)
          if (p.role == detail::remote::peer_role::learner) serve(p);
        const std::size_t acked = acknowledge_inserted();
        if (n > 0 || acked > 0) count_busy(progress_busy_ns_, start);
        // Idle: yield at first (a busy peer's next message is microseconds away), then sleep
        // 50 us at a time, so that an idle shard does not hold a core; never sleep while the
        // inserter has entries to acknowledge.
        idle = n == 0 && work_.empty() && !replies_pending() ? idle + 1 : 0;
        if (idle > 0 && (idle < 2000 || inserter_->busy()))
          std::this_thread::yield();
        else if (idle >= 2000)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      } catch (const std::exception&) {  // a failed call or allocation: counted, serve on
        bump(&counters::failed_transfers);
      }
    }
  }

  /// Polls the control endpoint and every actor's intake; returns how many completions came.
  std::size_t poll() {
    std::size_t n = 0;
    for (std::size_t i = 0; i < peers_.size(); ++i)
      if (peers_[i].intake)
        n += peers_[i].intake->poll([&](const fabric::completion& c) {
          if (c.what == fabric::completion::kind::remote_write)
            work_.push_back({{}, c.data, static_cast<std::uint32_t>(i + 1)});
        });
    return n + ep_->poll([this](const fabric::completion& c) {
      using kind = fabric::completion::kind;
      if (c.what == kind::received) {
        if (!c.message.empty()) work_.push_back({{c.message.begin(), c.message.end()}, 0, 0});
      } else if (c.what == kind::remote_write) {  // an entry of an actor with no intake
        work_.push_back({{}, c.data, 0});
      } else if (c.what == kind::sent || c.what == kind::written || c.what == kind::failed) {
        (void)outbox_.completed(c.context);
        if (c.what == kind::failed) bump(&counters::failed_transfers);
      }
    });
  }

  void count(detail::remote::refusal r) {
    const std::lock_guard held(stats_mutex_);
    stats_.refused.add(r);
  }
  void bump(std::uint64_t counters::*counter) {
    const std::lock_guard held(stats_mutex_);
    ++(stats_.*counter);
  }
  void send(std::span<const std::byte> message, fi_addr_t to) {
    const auto until = std::chrono::steady_clock::now() + options_.send_deadline;
    if (!outbox_.send(*ep_, message, to, until, [this] { (void)poll(); }))
      bump(&counters::dropped_sends);  // not accepted in time: dropped
  }
  [[nodiscard]] detail::remote::message_limits limits() const {
    detail::remote::message_limits l;
    l.capacity = buffer_.capacity();
    l.max_length = buffer_.max_length();
    l.max_ring_blocks = detail::remote::max_cq_index;  // what an actor asks is clamped below
    return l;
  }

  void on_message(std::span<const std::byte> message) {
    namespace remote = detail::remote;
    const auto info = remote::frame_type(message, remote::default_max_message);
    if (!info) return count(info.why);
    if (info.value.type == remote::message_type::hello) return on_hello(message);
    if (info.value.type == remote::message_type::bundle) {  // requests, taken one by one
      const auto b = remote::split_bundle(message, remote::default_max_message,
                                          remote::message_type::sample_request, bundled_);
      if (!b) return count(b.why);
      bump(&counters::bundles);
      for (const auto frame : bundled_) {
        try {  // each as if it came alone: a failure ends that one, not the others
          on_message(frame);
        } catch (const std::exception&) {
          bump(&counters::failed_transfers);
        }
      }
      return;
    }
    const std::uint32_t sender = info.value.sender;
    if (sender == 0 || sender > peers_.size()) return count(remote::refusal::mismatch);
    const peer& from = peers_[sender - 1];
    switch (info.value.type) {
      case remote::message_type::status_request: {
        const auto r = remote::parse_status_request(message, limits());
        if (!r) return count(r.why);
        const counters now = stats();
        auto bytes =
            remote::encode(remote::status{.incarnation = incarnation_,
                                          .size = buffer_.size(),
                                          .mass = selection_mass(buffer_, stream_),
                                          .inserted = now.inserted,
                                          .refused = now.refused.total() + now.refused_inserts});
        remote::stamp_sender(bytes, 0);
        return send(bytes, from.address);
      }
      case remote::message_type::update:
      case remote::message_type::erase: {
        const auto u = remote::parse_update(message, limits());
        if (!u) return count(u.why);
        auto bytes = remote::encode(apply_update(buffer_, stream_, u.value, owner(), local_));
        return send(bytes, from.address);
      }
      case remote::message_type::sample_request: {
        const auto r = remote::parse_sample_request(message, limits());
        if (!r) return count(r.why);
        if (!from.reply || r.value.incarnation != incarnation_ ||
            r.value.request >= remote::max_cq_index)
          return count(remote::refusal::mismatch);
        auto fits = remote::check_request_fits(r.value, spec::step_bytes, from.grant);
        if (!fits) return count(fits.why);
        if (peers_[sender - 1].deferred.size() >= max_deferred_requests)
          return count(remote::refusal::oversized);
        peers_[sender - 1].deferred.push_back({r.value, std::move(fits.value)});
        return serve(peers_[sender - 1]);
      }
      default:
        return count(remote::refusal::wrong_type);
    }
  }

  void on_hello(std::span<const std::byte> message) {
    namespace remote = detail::remote;
    const auto h = remote::parse_hello(message, limits());
    if (!h) return count(h.why);
    if (h.value.spec_fingerprint != blob_.spec_fingerprint ||
        (h.value.role != remote::peer_role::actor &&
         h.value.selection_fingerprint != blob_.selection_fingerprint) ||
        peers_.size() >= options_.max_peers || peers_.size() + 1 >= remote::max_peers)
      return count(remote::refusal::mismatch);
    const remote::digest expected = remote::token_proof(
        options_.token, blob_.nonce, static_cast<std::uint8_t>(h.value.role), h.value.pid);
    if (!remote::same_proof(expected, h.value.token_proof))
      return count(remote::refusal::mismatch);  // another job's token, or none
    peer p;
    const auto& a = h.value.address;
    const auto& inlet = h.value.reply_address.empty() ? a : h.value.reply_address;
    if (!ep_->fits_address(a) || !ep_->fits_address(inlet))
      return count(remote::refusal::out_of_range);
    const auto slot_bytes = static_cast<std::uint64_t>(
        remote::layout_reply(spec::step_bytes, h.value.max_rows, h.value.max_window).total_bytes);
    if (h.value.role == remote::peer_role::learner &&
        (h.value.slice_key.size() != sizeof(std::uint64_t) || h.value.slice_bytes == 0 ||
         h.value.slice_bytes > max_slice_bytes || h.value.max_rows < 1 || h.value.max_window < 1 ||
         slot_bytes * replies_in_flight(slot_bytes) > max_slice_bytes))
      return count(remote::refusal::out_of_range);  // no slice it could answer into
    p.address = ep_->insert_peer(inlet);  // where its messages go: its inlet for us, if any
    p.role = h.value.role;
    remote::welcome w;
    w.peer_index = static_cast<std::uint32_t>(peers_.size() + 1);
    w.incarnation = incarnation_;
    w.block_bytes = options_.block_bytes;
    if (p.role == remote::peer_role::learner) {
      p.slice_address = h.value.slice_address;
      std::memcpy(&p.slice_key, h.value.slice_key.data(), sizeof(p.slice_key));
      p.grant = {h.value.slice_bytes, h.value.max_rows, h.value.max_window};
      p.slot_bytes = slot_bytes;
      p.slots = replies_in_flight(slot_bytes);
      p.reply = std::make_unique<fabric::host_region>(slot_bytes * p.slots);
      p.channel = std::make_unique<fabric::endpoint>(options_.fabric);
      p.reply_region = p.channel->register_memory(p.reply->data(), p.reply->size(), FI_WRITE);
      p.reply_to = p.channel->insert_peer(inlet);  // the learner's inlet for this shard
    }
    if (p.role == remote::peer_role::actor && h.value.ring_blocks > 0) {
      p.ring_blocks =
          std::min({h.value.ring_blocks, options_.max_ring_blocks, remote::max_cq_index});
      p.ring =
          std::make_unique<fabric::host_region>(std::size_t{p.ring_blocks} * options_.block_bytes);
      if (intake_per_actor(ep_->provider())) {
        p.intake = std::make_unique<fabric::endpoint>(options_.fabric);
        w.intake = p.intake->name();
      }
      fabric::endpoint& on = p.intake ? *p.intake : *ep_;
      p.ring_region = on.register_memory(p.ring->data(), p.ring->size(), FI_REMOTE_WRITE);
      w.ring_address = p.ring_region.remote_address;
      w.ring_key.resize(sizeof(p.ring_region.key));
      std::memcpy(w.ring_key.data(), &p.ring_region.key, sizeof(p.ring_region.key));
      w.ring_blocks = p.ring_blocks;
    }
    const fi_addr_t to = p.address;
    peers_.push_back(std::move(p));
    if (peers_.back().role == remote::peer_role::learner) {
      try {
        writers_.push_back(std::make_unique<reply_writer>(
            peers_.back(), options_.shard, spec::step_bytes, failed_replies_, writers_busy_ns_));
      } catch (...) {  // no thread or no memory: not welcomed, and no peer left half there
        peers_.pop_back();
        throw;
      }
    }
    bump(&counters::peers);
    send(remote::encode(w), to);
  }

  /// An entry published on the intake of peer `from_peer`, or on the control endpoint (0): only
  /// an actor with no intake publishes there.
  void on_entry(const detail::remote::cq_data& d, std::uint32_t from_peer) {
    namespace remote = detail::remote;
    if (d.kind != remote::write_kind::insert_entry || d.peer == 0 || d.peer > peers_.size() ||
        (from_peer != 0 ? d.peer != from_peer : peers_[d.peer - 1].intake != nullptr))
      return count(remote::refusal::mismatch);
    peer& from = peers_[d.peer - 1];
    if (!from.ring) return count(remote::refusal::mismatch);
    const std::span<const std::byte> ring(from.ring->data(), from.ring->size());
    const remote::entry_expectation expect{
        d.peer,           from.next_sequence,   d.index,
        from.ring_blocks, options_.block_bytes, buffer_.max_length(),
        spec::step_bytes};
    const auto e = remote::check_entry(ring, expect);
    if (!e) return count(e.why);
    const std::uint64_t sequence = e.value.sequence;
    if (from.ahead.count(sequence) != 0 || sequence >= from.next_sequence + from.ring_blocks)
      return count(remote::refusal::mismatch);  // a duplicate, or past what the ring can hold
    // Into the buffer, from the ring (the columns at the layout computed here), on the
    // inserter's thread; acknowledged when it is done (acknowledge_inserted).
    inserter_->push(entry_inserter<Buffer>::job_for(
        d.peer, ring.data() + std::size_t{d.index} * options_.block_bytes, e.value.length,
        options_.block_bytes, {d.index, e.value.blocks, sequence, {}}));
    from.ahead.insert(sequence);
    while (from.ahead.count(from.next_sequence) != 0) from.ahead.erase(from.next_sequence++);
  }
  /// Acknowledges the entries the inserter is done with (their keys, or no ticket), in one
  /// message per actor; returns how many.
  std::size_t acknowledge_inserted() {
    return inserter_->acknowledge([&](std::span<const std::byte> message, std::uint32_t peer) {
      send(message, peers_[peer - 1].address);
    });
  }

  /// The keys this shard's peers use: its id and incarnation.
  [[nodiscard]] key_owner owner() const noexcept { return {options_.shard, incarnation_}; }

  /// Serves `to`'s sample requests, oldest first, without ever waiting: the packer
  /// (reply_packer.hpp) selects, gathers and packs each once, off this thread, and the learner's
  /// writer (reply_writer.hpp) writes it; up to replies_in_flight (shard_peer.hpp) replies per
  /// learner are packed or on the wire.
  /// A learner that died with a reply in flight (its write may never complete, on shm) holds up
  /// only its own requests. A buffer that cannot sample answers with a header of no rows.
  void serve(peer& to) {
    while (!to.deferred.empty()) {  // hand queued requests to the packer, oldest first
      const std::optional<std::size_t> slot = to.slot_for_next();
      if (!slot) return;
      auto& d = to.deferred.front();
      auto& w = (*to.writes)[*slot];
      w.request = std::move(d.request);
      w.layout = std::move(d.layout);
      w.to_post = w.posted = w.completed = 0;
      w.state = reply_state::packing;
      try {
        packer_->push({&w.request,
                       &w.layout,
                       {to.reply->data() + *slot * to.slot_bytes,
                        static_cast<std::size_t>(w.layout.total_bytes)},
                       &w.state});
      } catch (...) {  // not queued (out of memory): the write is free again, the request waits
        w.state = reply_state::idle;
        d.request = std::move(w.request);
        d.layout = std::move(w.layout);
        throw;
      }
      to.deferred.pop_front();
    }
  }
  /// A request that a reply slot is free for: the run loop keeps polling to hand it on. (One
  /// waiting for a slot still being written leaves the loop to its yield and sleep: a dead
  /// learner's write on shm never completes.)
  [[nodiscard]] bool replies_pending() const {
    for (const auto& p : peers_)
      if (!p.deferred.empty() && p.slot_for_next()) return true;
    return false;
  }

  Buffer& buffer_;
  key_owner local_ = buffer_.owner();  // the keys the buffer issues
  options options_;
  fabric::host_region inbox_;
  // Grown by the progress thread alone; a deque, so that a peer stays put while others join (a
  // learner's writer thread uses its channel, staging and reply slots: reply_writer.hpp).
  // Their rings outlive the endpoint.
  std::deque<peer> peers_;
  // A writer per learner, which posts its replies and polls its channel (reply_writer.hpp);
  // stopped before the peers they write for go.
  std::deque<std::unique_ptr<reply_writer>> writers_;
  std::atomic<std::uint64_t> failed_replies_{0};                         // counted by the writers
  std::atomic<std::uint64_t> progress_busy_ns_{0}, writers_busy_ns_{0};  // stats()
  std::unique_ptr<fabric::endpoint> ep_;
  fabric::region inbox_region_{};
  fabric::outbox outbox_;
  std::uint32_t incarnation_ = 0;
  detail::remote::address_blob blob_;
  std::vector<std::byte> address_;
  std::deque<work> work_;                            // the progress thread's alone
  std::vector<std::span<const std::byte>> bundled_;  // a bundle's frames (the same)
  mutable std::mutex stats_mutex_;
  counters stats_;
  shard_stream stream_;  // GPU buffers are called on it, by the progress thread alone
  std::unique_ptr<reply_packer<Buffer>> packer_;      // packs replies off the progress thread
  std::unique_ptr<entry_inserter<Buffer>> inserter_;  // inserts entries off it
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace gear::transport
