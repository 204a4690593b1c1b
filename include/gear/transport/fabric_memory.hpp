#pragma once
// Host memory for a fabric endpoint (transport/libfabric.hpp): page-aligned regions to register,
// and an outbox of registered slots for control messages, each busy until its send completes.

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <gear/error.hpp>
#include <gear/transport/libfabric.hpp>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace gear::transport {

namespace fabric {

/// Page-aligned, zeroed host memory for registration.
class host_region {
 public:
  explicit host_region(std::size_t bytes) : bytes_(bytes) {
    void* p = nullptr;
    if (bytes == 0 || posix_memalign(&p, 4096, bytes) != 0)
      throw error(errc::out_of_memory,
                  "registered host memory of " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, bytes);
    data_.reset(static_cast<std::byte*>(p));
  }
  [[nodiscard]] std::byte* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }

 private:
  struct release {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, release> data_;
  std::size_t bytes_;
};

/// Control messages to send: registered slots of max_message bytes, each busy until its send
/// completes.
class outbox {
 public:
  outbox(endpoint& ep, std::size_t slots, std::size_t max_message)
      : memory_(slots * max_message), max_message_(max_message), busy_(slots), tags_(slots) {
    region_ = ep.register_memory(memory_.data(), memory_.size(), FI_SEND);
  }
  /// Sends `message` to `peer`, progressing with `poll` while no slot is free or the provider
  /// asks to retry; false past `until` (the message is dropped). `tag` is kept with the slot
  /// until the send completes (tag_of), e.g. which peer it went to.
  template <class Poll>
  bool send(endpoint& ep, std::span<const std::byte> message, fi_addr_t peer,
            std::chrono::steady_clock::time_point until, Poll&& poll, std::size_t tag = 0) {
    if (message.size() > max_message_) return false;
    for (;;) {
      for (std::size_t s = 0; s < busy_.size(); ++s) {
        if (busy_[s]) continue;
        std::memcpy(memory_.data() + s * max_message_, message.data(), message.size());
        if (ep.try_send(region_, s * max_message_, message.size(), peer, &busy_[s])) {
          busy_[s] = 1;
          tags_[s] = tag;
          return true;
        }
        break;  // the provider is busy: progress first
      }
      if (std::chrono::steady_clock::now() > until) return false;
      poll();
    }
  }
  /// Frees the slot a send completion names; false if the context is not one of this outbox's.
  bool completed(const void* context) noexcept {
    for (auto& b : busy_)
      if (&b == context) return b = 0, true;
    return false;
  }
  /// The tag of the send `context` names, if it is one of this outbox's.
  [[nodiscard]] std::optional<std::size_t> tag_of(const void* context) const noexcept {
    for (std::size_t s = 0; s < busy_.size(); ++s)
      if (&busy_[s] == context) return tags_[s];
    return std::nullopt;
  }

 private:
  host_region memory_;
  std::size_t max_message_;
  std::vector<char> busy_;
  std::vector<std::size_t> tags_;
  region region_{};
};

}  // namespace fabric

}  // namespace gear::transport
