#pragma once
// What remote actors and learners (remote_actor.hpp, remote_learner.hpp) share: a fabric
// endpoint, its control-message inbox and outbox, one link per shard (its address blob, its
// welcome, its last status), the handshake, deadlines, and progress driven by the caller's thread.
// A shard that does not answer by the deadline is reported as errc::peer_lost, named by its id,
// pid, host and provider.

#include <unistd.h>

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
    wait_until([&] { return links_[s].last_status.has_value(); }, until, s, "a status");
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
  /// Closes the endpoint (and every registration) first: a derived class calls it in its
  /// destructor, before the memory it registered is freed.
  void close() noexcept { ep_.reset(); }

  /// Greets every shard with the hello `make(s)` returns (with this client's address and its
  /// proof of the token) and waits for every welcome; a shard that refuses the proof sends none.
  void greet(const std::function<detail::remote::hello(std::size_t)>& make) {
    const auto until = clock::now() + deadline_;
    for (std::size_t s = 0; s < links_.size(); ++s) {
      detail::remote::hello h = make(s);
      h.pid = static_cast<std::uint32_t>(getpid());
      h.token_proof = detail::remote::token_proof(token_, links_[s].blob.nonce,
                                                  static_cast<std::uint8_t>(h.role), h.pid);
      h.address = ep_->name();
      send(detail::remote::encode(h), s, until);
    }
    for (std::size_t s = 0; s < links_.size(); ++s)
      wait_until([&] { return links_[s].welcome.has_value(); }, until, s, "a welcome");
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
      if (now > until) lost(s, what);
      if (poll() == 0) {
        std::this_thread::yield();
        waiting_ns_ += static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - now).count());
      }
    }
  }

  /// Makes progress: control messages go to on_message (welcomes and statuses are handled
  /// here), remote writes to on_remote_write. A failed transfer of a shard's throws
  /// errc::peer_lost naming it; one that names no shard is left to the deadline of the wait it
  /// belongs to (every wait has one), whose peer_lost names the shard that did not answer.
  std::size_t poll() {
    namespace remote = detail::remote;
    return ep_->poll([&](const fabric::completion& c) {
      using kind = fabric::completion::kind;
      if (c.what == kind::failed) {  // a peer that died or refused: name it where known
        const std::optional<std::size_t> s = outbox_.tag_of(c.context);
        (void)outbox_.completed(c.context);
        if (s && *s < links_.size() && written_off(*s)) return;  // already known lost
        if (s && *s < links_.size()) lost(*s, "delivery (" + c.detail + ")");
        // Nothing names its shard (an incoming write that failed at this end, as when shm's
        // cross-memory attach reads from a shard that died): the wait it belongs to runs into
        // its deadline, which names the shard that did not answer, with this failure.
        unpinned_failure_ = c.detail;
        return;
      }
      if (c.what == kind::sent) (void)outbox_.completed(c.context);
      if (c.what == kind::remote_write) on_remote_write(remote::cq_data::decode(c.data));
      if (c.what != kind::received) return;
      handle(c.message);
    });
  }

  virtual void on_message(std::span<const std::byte>, detail::remote::message_type) {}
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
  fabric::region inbox_region_{};
  fabric::outbox outbox_;

 private:
  void handle(std::span<const std::byte> message) {
    namespace remote = detail::remote;
    const auto info = remote::frame_type(message, remote::default_max_message);
    if (!info) return;
    if (info.value.type == remote::message_type::bundle) {  // a shard's acknowledgements
      if (remote::split_bundle(message, remote::default_max_message, remote::message_type::ack,
                               bundled_))
        for (const auto frame : bundled_) handle(frame);  // (never a bundle: bundled_ stays)
      return;
    }
    remote::message_limits l;
    l.max_ring_blocks = remote::max_cq_index;
    l.capacity = std::int64_t{1} << 62;
    if (info.value.type == remote::message_type::welcome) {
      const auto w = remote::parse_welcome(message, l);
      if (!w) return;
      for (std::size_t s = 0; s < links_.size(); ++s)  // the shard of that incarnation
        if (!links_[s].welcome && links_[s].blob.incarnation == w.value.incarnation) {
          on_welcome(s, w.value);
          links_[s].welcome = w.value;
          return;
        }
    } else if (info.value.type == remote::message_type::status) {
      const auto st = remote::parse_status(message, l);
      if (!st) return;
      for (auto& link : links_)
        if (link.blob.incarnation == st.value.incarnation) link.last_status = st.value;
    } else {
      on_message(message, info.value.type);
    }
  }
  std::vector<std::span<const std::byte>> bundled_;  // a bundle's frames, in handle()
  mutable std::optional<std::size_t> last_lost_;
  std::string unpinned_failure_;  // the last failed transfer no shard could be named for
  std::uint64_t waiting_ns_ = 0;  // waiting_seconds()
};

}  // namespace gear::transport
