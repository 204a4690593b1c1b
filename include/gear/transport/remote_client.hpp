#pragma once
// What remote actors and learners (remote_actor.hpp, remote_learner.hpp) share: a fabric
// endpoint for control messages, its inbox and outbox (and its inlets on shm, below), one link
// per shard (its address blob, its welcome, its last status), the handshake, deadlines, and
// progress driven by the caller's thread.
// A shard that does not answer by the deadline is reported as errc::peer_lost, named by its id,
// pid, host and provider.
//
// A learner's shards write their replies into its memory one-sided. On shm a shard posts a write
// into the shared region of the endpoint it names, under that region's lock (without cross-memory
// attach it fills bounce buffers there holding it, up to 2 MiB of a write, and takes it again to
// hand them back). A shard stopped holding it (a stop signal, a long preemption) would keep every
// other shard from writing into the same region, and the learner would blame whichever shard it
// waited for first (a CI run; 1 run in 60 of the stalled fault case under load).
// There each shard writes and sends into an inlet of its own (open_inlets): an endpoint of the
// client's that only that shard is given, which takes that shard's replies, welcome, statuses,
// update results and acknowledgements alike, so a stalled shard stalls only its own. (A message
// is posted under the same lock as a write: with one control endpoint for all, a shard stopped
// inside a send held up the others' messages.) Providers with a connection per peer (tcp, verbs,
// efa) have no such shared region, and there shards write and send to the control endpoint.
// Messages from a client to a shard go to the shard's control endpoint (the shard's own
// endpoints are its concern).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <gear/detail/remote/blob.hpp>
#include <gear/detail/remote/hmac.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/transport/fabric_memory.hpp>
#include <gear/transport/libfabric.hpp>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace gear::transport {

class remote_client {
 public:
  using clock = std::chrono::steady_clock;

  struct shard_link {
    detail::remote::address_blob blob;
    fi_addr_t address = FI_ADDR_UNSPEC;
    std::optional<detail::remote::welcome> welcome;  // once greeted
    std::optional<detail::remote::status> last_status;
  };

  remote_client(const remote_client&) = delete;
  remote_client& operator=(const remote_client&) = delete;

  [[nodiscard]] std::size_t shards() const noexcept { return links_.size(); }
  /// The fewest steps a trajectory of some shard may hold: the longest window a sample may ask.
  [[nodiscard]] std::int64_t shortest_max_length() const noexcept {
    std::int64_t shortest = links_.front().blob.max_length;  // (a client has a shard at least)
    for (const auto& l : links_) shortest = std::min(shortest, l.blob.max_length);
    return shortest;
  }
  [[nodiscard]] const detail::remote::address_blob& shard(std::size_t s) const {
    return links_.at(s).blob;
  }

  /// Seconds this client's calls have spent waiting in polls that completed nothing: the rest
  /// of their time is its own work or, with manual progress, transfers it moves (on shm it
  /// copies what shards write to it). Against wall time, how busy its thread is.
  [[nodiscard]] double waiting_seconds() const noexcept { return 1e-9 * double(waiting_ns_); }

  /// Asks shard `s` for its status and waits for it (bounded by the deadline).
  detail::remote::status status(std::size_t s) {
    auto bytes = detail::remote::encode_status_request();
    detail::remote::stamp_sender(bytes, links_.at(s).welcome->peer_index);
    const auto until = clock::now() + deadline_;
    links_[s].last_status.reset();
    send(bytes, s, until);
    wait_until([&] { return links_[s].last_status.has_value(); }, until, s, "status");
    return *links_[s].last_status;
  }

 protected:
  /// Opens the endpoint and checks every blob against `spec_fingerprint` and the provider (and,
  /// unless `any_selection`, the selection fingerprint). Throws errc::peer_mismatch, ...
  remote_client(std::span<const std::vector<std::byte>> blobs, const libfabric_config& fabric,
                std::chrono::milliseconds deadline, std::uint64_t spec_fingerprint,
                std::optional<std::uint64_t> selection_fingerprint, std::string token)
      : deadline_(deadline),
        token_(std::move(token)),
        inbox_(1 << 20),
        ep_(std::make_unique<fabric::endpoint>(fabric)),
        outbox_(*ep_, 16, detail::remote::default_max_message) {
    namespace remote = detail::remote;
    inbox_region_ = ep_->register_memory(inbox_.data(), inbox_.size(), FI_RECV);
    ep_->receive_into(inbox_region_, remote::default_max_message);
    remote::address_blob mine;
    mine.provider = ep_->provider();
    mine.address_format = ep_->address_format();
    mine.pid = static_cast<std::uint32_t>(getpid());
    mine.hostname = "this client";
    mine.spec_fingerprint = spec_fingerprint;
    for (const auto& bytes : blobs) {
      const auto b = remote::parse_blob(bytes);
      GEAR_REQUIRE(b, errc::invalid_argument,
                   "a shard address blob is refused (" + std::string(remote::to_string(b.why)) +
                       ": " + b.what + ")");
      mine.selection_fingerprint = selection_fingerprint.value_or(b.value.selection_fingerprint);
      remote::check_peer(mine, b.value);
      GEAR_REQUIRE(b.value.shard < remote::max_peers, errc::peer_mismatch,
                   "shard id " + std::to_string(b.value.shard) + " is past " +
                       std::to_string(remote::max_peers - 1));
      for (const auto& known : links_)
        GEAR_REQUIRE(known.blob.shard != b.value.shard, errc::peer_mismatch,
                     "two shards call themselves " + std::to_string(b.value.shard) + " (pids " +
                         std::to_string(known.blob.pid) + " and " + std::to_string(b.value.pid) +
                         "): give each its own id");
      links_.push_back({b.value, ep_->insert_peer(b.value.address), {}, {}});
    }
    GEAR_REQUIRE(!links_.empty(), errc::invalid_argument, "a client needs at least one shard");
    lost_.assign(links_.size(), false);
  }
  ~remote_client() { close(); }
  /// Closes the endpoints, inlets and control endpoint (and every registration on them) first: a
  /// derived class calls it in its destructor, before the memory it registered is freed.
  void close() noexcept {
    inlets_.clear();
    ep_.reset();
  }

  /// Opens an inlet per shard where the provider's endpoints are shared regions (shm:
  /// fabric::shared_region), once, before greet: the endpoint each shard's one-sided writes and
  /// messages come into, with a receive buffer of four messages. Elsewhere they come into the
  /// control endpoint. Throws errc::transport_error, errc::out_of_memory.
  void open_inlets(const libfabric_config& fabric) {
    if (!fabric::shared_region(ep_->provider())) return;
    constexpr std::size_t max_message = detail::remote::default_max_message;
    inlet_failed_.assign(links_.size(), false);
    inlets_.reserve(links_.size());
    inlet_inboxes_.reserve(links_.size());
    for (std::size_t s = 0; s < links_.size(); ++s) {
      inlet_inboxes_.emplace_back(4 * max_message);
      inlets_.push_back(std::make_unique<fabric::endpoint>(fabric));
      const fabric::region r = inlets_.back()->register_memory(
          inlet_inboxes_.back().data(), inlet_inboxes_.back().size(), FI_RECV);
      inlets_.back()->receive_into(r, max_message);
    }
  }
  /// Inlets: 1 (the control endpoint for every shard) or one per shard.
  [[nodiscard]] std::size_t inlet_count() const noexcept {
    return inlets_.empty() ? 1 : inlets_.size();
  }
  /// The inlet shard s writes into (its index among inlet_count()), and that endpoint.
  [[nodiscard]] std::size_t inlet_of(std::size_t s) const noexcept {
    return inlets_.empty() ? 0 : s;
  }
  [[nodiscard]] fabric::endpoint& inlet(std::size_t i) {
    return inlets_.empty() ? *ep_ : *inlets_[i];
  }
  /// The address shard s is to write and send to, for its hello: none where it is the control
  /// endpoint's.
  [[nodiscard]] std::vector<std::uint8_t> inlet_address(std::size_t s) const {
    return inlets_.empty() ? std::vector<std::uint8_t>{} : inlets_[s]->name();
  }

  /// Greets every shard with the hello `make(s)` returns (with this client's address, the inlet
  /// it is to write and send to, and its proof of the token) and waits for every welcome; a shard
  /// that refuses the proof sends none.
  void greet(const std::function<detail::remote::hello(std::size_t)>& make) {
    const auto until = clock::now() + deadline_;
    for (std::size_t s = 0; s < links_.size(); ++s) {
      detail::remote::hello h = make(s);
      h.pid = static_cast<std::uint32_t>(getpid());
      h.token_proof = detail::remote::token_proof(token_, links_[s].blob.nonce,
                                                  static_cast<std::uint8_t>(h.role), h.pid);
      h.address = ep_->name();
      h.reply_address = inlet_address(s);
      send(detail::remote::encode(h), s, until);
    }
    for (std::size_t s = 0; s < links_.size(); ++s)
      wait_until([&] { return links_[s].welcome.has_value(); }, until, s, "welcome");
  }

  void send(std::span<const std::byte> message, std::size_t s, clock::time_point until) {
    if (!outbox_.send(
            *ep_, message, links_[s].address, until, [&] { (void)poll(); }, s))
      lost(s, "acceptance of a control message");
  }

  /// Sends `message` to shard s, as send does, for a caller that cannot throw: false when s is
  /// lost or its send failed (a send that throws has posted nothing). A failure of another
  /// shard's seen meanwhile (guarded leaves that one out where skip_lost_ says so; else its own
  /// waits run into their deadline) does not count against s: its message is sent again.
  bool try_send(std::span<const std::byte> message, std::size_t s,
                clock::time_point until) noexcept {
    for (std::size_t attempt = 0; attempt <= links_.size() && !lost_[s]; ++attempt) {
      try {
        guarded(
            s, [&] { return send(message, s, until), true; }, true);
        return true;
      } catch (const error& e) {
        if (e.code() != errc::peer_lost || last_lost() == s) return false;
      } catch (...) {
        return false;
      }
    }
    return false;
  }

  [[noreturn]] void lost(std::size_t s, const std::string& waiting_for) const {
    last_lost_ = s;
    const auto& b = links_[s].blob;
    throw error(errc::peer_lost,
                "shard " + std::to_string(b.shard) + " (pid " + std::to_string(b.pid) + " on '" +
                    b.hostname + "', " + b.provider + ") gave no " + waiting_for + " within " +
                    std::to_string(deadline_.count()) + " ms, or is gone" +
                    (unpinned_failure_.empty()
                         ? std::string()
                         : " (a transfer failed here meanwhile: " + unpinned_failure_ + ")"));
  }

  template <class Done>
  void wait_until(Done done, clock::time_point until, std::size_t s, const char* what) {
    while (!done()) {
      const auto now = clock::now();
      if (now > until) {
        // One more poll first: the last one may have been held up (on shm, by another shard
        // stopped while posting into its inlet) while s's answer came in.
        (void)poll();
        if (done()) return;
        lost(s, what);
      }
      if (poll() == 0) {
        std::this_thread::yield();
        waiting_ns_ += static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - now).count());
      }
    }
  }

  /// Makes progress: control messages go to on_message (welcomes and statuses are handled
  /// here), remote writes to on_remote_write. With inlets, what comes into inlet s is shard s's
  /// (a message about another shard is ignored: from_shard), and no message that comes into
  /// the control endpoint is taken (shards have no cause to send there). A failed transfer of a
  /// shard's throws errc::peer_lost naming it: a failed send, or the first failed write into
  /// shard s's inlet (its later ones are left to the deadlines, so that one shard's failures
  /// cannot come up again and again in calls about another). A failure that names no shard is
  /// left to the deadline of the wait it belongs to (every wait has one), whose peer_lost names
  /// the shard that did not answer. On shm, polling shard s's inlet may wait on that inlet's
  /// lock, which of the peers only shard s takes (to post a write or a message): a shard stopped
  /// in that very moment holds up this poll, and the thread calling it, until it goes on
  /// (README, "A limit of shm in libfabric 1.17"), as it did with one endpoint for all; the
  /// other shards' writes and messages still go in.
  std::size_t poll() {
    namespace remote = detail::remote;
    std::size_t n = 0;
    for (std::size_t s = 0; s < inlets_.size(); ++s)  // shard s's, and only those
      n += inlets_[s]->poll([&](const fabric::completion& c) {
        using kind = fabric::completion::kind;
        if (c.what == kind::failed && !written_off(s) && !inlet_failed_[s]) {
          inlet_failed_[s] = true;  // a write of its, or a message it sent (only s has the inlet)
          lost(s, "transfer into its inlet (one failed here: " + c.detail + ")");
        }
        if (c.what == kind::received) return handle(c.message, s);
        if (c.what != kind::remote_write) return;
        const auto d = remote::cq_data::decode(c.data);
        if (d.peer == links_[s].blob.shard) on_remote_write(d);
      });
    return n + ep_->poll([&](const fabric::completion& c) {
      using kind = fabric::completion::kind;
      if (c.what == kind::failed) {  // a peer that died or refused: name it where known
        const std::optional<std::size_t> s = outbox_.tag_of(c.context);
        (void)outbox_.completed(c.context);
        if (s && *s < links_.size() && written_off(*s)) return;  // already known lost
        if (s && *s < links_.size()) lost(*s, "delivery (" + c.detail + ")");
        // Nothing names its shard (an incoming write that failed at this end without inlets):
        // the wait it belongs to runs into its deadline, which names the shard that did not
        // answer, with this failure.
        unpinned_failure_ = c.detail;
        return;
      }
      if (c.what == kind::sent) (void)outbox_.completed(c.context);
      if (c.what == kind::remote_write && inlets_.empty())  // (with inlets, none come here)
        on_remote_write(remote::cq_data::decode(c.data));
      if (c.what != kind::received || !inlets_.empty()) return;
      handle(c.message, std::nullopt);
    });
  }

  /// A control message that is neither a welcome nor a status, from shard `from` (its inlet)
  /// or from any shard (no inlets): see from_shard.
  virtual void on_message(std::span<const std::byte>, detail::remote::message_type,
                          std::optional<std::size_t> /*from*/) {}
  /// False for a message about shard s that came into another shard's inlet (ignored: only s is
  /// given its inlet's address); true for one from inlet s, or where there are no inlets.
  [[nodiscard]] static bool from_shard(std::optional<std::size_t> from, std::size_t s) noexcept {
    return !from || *from == s;
  }
  /// True for a shard this client no longer counts on: its failed transfers are ignored.
  [[nodiscard]] bool written_off(std::size_t s) const { return lost_[s]; }
  /// Runs `call` for shard s. When it throws errc::peer_lost naming a shard and skip_lost_ is
  /// set, that shard is lost from then on (lost_); the error is thrown again unless it named s
  /// and not `rethrow`, when an empty result is returned.
  template <class Call>
  auto guarded(std::size_t s, Call&& call, bool rethrow = false)
      -> std::optional<decltype(call())> {
    try {
      return call();
    } catch (const error& e) {
      const std::optional<std::size_t> named = last_lost();
      if (e.code() != errc::peer_lost || !skip_lost_ || !named) throw;
      lost_[*named] = true;
      if (rethrow || *named != s) throw;
      return std::nullopt;
    }
  }
  /// The shard the last errc::peer_lost this client threw named (none: a failure it could not
  /// pin on one shard).
  [[nodiscard]] std::optional<std::size_t> last_lost() const noexcept { return last_lost_; }
  virtual void on_remote_write(const detail::remote::cq_data&) {}
  virtual void on_welcome(std::size_t, const detail::remote::welcome&) {}

  std::chrono::milliseconds deadline_;
  std::string token_;
  fabric::host_region inbox_;
  std::vector<shard_link> links_;  // their memory outlives the endpoint
  std::vector<bool> lost_;         // shards left out (a learner's skip_lost_shards)
  bool skip_lost_ = false;
  std::unique_ptr<fabric::endpoint> ep_;
  std::vector<fabric::host_region> inlet_inboxes_;         // their receive buffers (outlive them)
  std::vector<std::unique_ptr<fabric::endpoint>> inlets_;  // open_inlets (after ep_: closed first)
  std::vector<bool> inlet_failed_;  // a failed transfer into that inlet was reported
  fabric::region inbox_region_{};
  fabric::outbox outbox_;

 private:
  /// Handles a control message that came from shard `from` (its inlet), or from any shard.
  void handle(std::span<const std::byte> message, std::optional<std::size_t> from) {
    namespace remote = detail::remote;
    const auto info = remote::frame_type(message, remote::default_max_message);
    if (!info) return;
    if (info.value.type == remote::message_type::bundle) {  // a shard's acknowledgements
      if (remote::split_bundle(message, remote::default_max_message, remote::message_type::ack,
                               bundled_))
        for (const auto frame : bundled_) handle(frame, from);  // (never a bundle: bundled_ stays)
      return;
    }
    remote::message_limits l;
    l.max_ring_blocks = remote::max_cq_index;
    l.capacity = std::int64_t{1} << 62;
    if (info.value.type == remote::message_type::welcome) {
      const auto w = remote::parse_welcome(message, l);
      if (!w) return;
      for (std::size_t s = 0; s < links_.size(); ++s)  // the shard of that inlet or incarnation
        if (from_shard(from, s) && !links_[s].welcome &&
            links_[s].blob.incarnation == w.value.incarnation) {
          on_welcome(s, w.value);
          links_[s].welcome = w.value;
          return;
        }
    } else if (info.value.type == remote::message_type::status) {
      const auto st = remote::parse_status(message, l);
      if (!st) return;
      for (std::size_t s = 0; s < links_.size(); ++s)
        if (from_shard(from, s) && links_[s].blob.incarnation == st.value.incarnation)
          links_[s].last_status = st.value;
    } else {
      on_message(message, info.value.type, from);
    }
  }
  std::vector<std::span<const std::byte>> bundled_;  // a bundle's frames, in handle()
  mutable std::optional<std::size_t> last_lost_;
  std::string unpinned_failure_;  // the last failed transfer no shard could be named for
  std::uint64_t waiting_ns_ = 0;  // waiting_seconds()
};

}  // namespace gear::transport
