#pragma once
// gear::transport::held_requests: the sample requests a remote learner (remote_learner.hpp) holds
// back, to send those of several samples to a shard in one message (a bundle:
// detail/remote/frame.hpp). Over tcp a send costs the learner's thread about what receiving a
// 64 KiB reply costs it (the kernel delivers a loopback message within the sender's call), so a
// learner with many samples in flight holds a new sample's requests while enough earlier ones keep
// the shards busy, and sends them together. Once its sizes were seen it allocates nothing.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <gear/detail/remote/frame.hpp>
#include <span>
#include <vector>

namespace gear::transport {

class held_requests {
 public:
  explicit held_requests(std::size_t shards)
      : bundles_(shards), size_marks_(shards, 0), frame_marks_(shards, 0) {}

  /// Starts one more sample's requests: add() each, then end_sample(), or cancel_sample() to
  /// take back what was added since.
  void begin_sample() noexcept {
    for (std::size_t s = 0; s < bundles_.size(); ++s) {
      size_marks_[s] = bundles_[s].bytes();
      frame_marks_[s] = bundles_[s].frames();
    }
    samples_mark_ = samples_;
  }
  /// Holds `frame` (a whole request, its sender stamped) for shard s.
  void add(std::size_t s, std::span<const std::byte> frame) { bundles_[s].add(frame); }
  void end_sample() noexcept { ++samples_; }
  void cancel_sample() noexcept {
    for (std::size_t s = 0; s < bundles_.size(); ++s)
      bundles_[s].truncate(size_marks_[s], frame_marks_[s]);
    samples_ = samples_mark_;
  }

  /// Samples whose requests are held.
  [[nodiscard]] std::size_t samples() const noexcept { return samples_; }

  /// The message that sends shard s's held requests: the lone request, or a bundle of them from
  /// `sender` (the index the shard gave this learner); empty when none is held for s.
  [[nodiscard]] std::span<const std::byte> message(std::size_t s, std::uint32_t sender) {
    return bundles_[s].message(sender);
  }

  /// True while the held requests may stay held: fewer samples' are held than `per_message`,
  /// and every shard one is held for is serving at least that many earlier samples (its reply
  /// not all in, `reply_in(shard, area)` as the last poll saw), which keep it busy meanwhile.
  /// `flights`: the samples in flight (held, sent, area).
  template <class Flights, class ReplyIn>
  [[nodiscard]] bool may_hold(const Flights& flights, std::size_t per_message,
                              ReplyIn reply_in) const {
    if (samples_ >= per_message) return false;
    for (std::size_t s = 0; s < bundles_.size(); ++s) {
      if (bundles_[s].frames() == 0) continue;
      std::size_t serving = 0;
      for (const auto& g : flights)
        serving += !g.held && std::find(g.sent.begin(), g.sent.end(), s) != g.sent.end() &&
                   !reply_in(s, g.area);
      if (serving < per_message) return false;
    }
    return true;
  }

  /// Sends every held request, one message per shard (`send_one(shard, message)`, false when it
  /// could not go; `sender(shard)`: this learner's index there), and marks their samples (the
  /// held ones of `flights`, and `also`) sent. A shard whose message could not go is taken out
  /// of those samples' `sent`: returns false then. Forgets what it held either way.
  template <class Flights, class Flight, class SendOne, class Sender>
  bool send(Flights& flights, Flight* also, SendOne send_one, Sender sender) noexcept {
    if (samples_ == 0) return true;
    bool all = true;
    for (std::size_t s = 0; s < bundles_.size(); ++s) {
      const std::span<const std::byte> m = message(s, sender(s));
      if (m.empty() || send_one(s, m)) continue;
      all = false;
      for (auto& g : flights)
        if (g.held) std::erase(g.sent, s);
      if (also != nullptr) std::erase(also->sent, s);
    }
    for (auto& g : flights) g.held = false;
    if (also != nullptr) also->held = false;
    clear();
    return all;
  }

  /// Forgets every held request (sent, or given up), keeping the storage.
  void clear() noexcept {
    for (auto& b : bundles_) b.clear();
    samples_ = 0;
  }

 private:
  std::vector<detail::remote::outgoing_frames> bundles_;  // per shard
  std::vector<std::size_t> size_marks_, frame_marks_;     // begin_sample's, for cancel_sample
  std::size_t samples_ = 0, samples_mark_ = 0;
};

}  // namespace gear::transport
