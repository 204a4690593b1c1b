#pragma once
// A shard's address blob: what a peer needs to reach it and to know that it fits. The user moves
// blobs between processes any way they like (a file, a key-value store, gear's rendezvous helper);
// a peer parses the blob (refusing any field out of range) and checks it against its own side
// before it connects: another wire version, provider, address format, spec or selection policy is
// refused with an error that names both sides, since a layout mismatch under one-sided writes
// would corrupt silently. Memory keys are not in the blob: the handshake grants them per peer.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <gear/detail/remote/frame.hpp>
#include <gear/error.hpp>
#include <random>
#include <string>
#include <vector>

namespace gear::detail::remote {

inline constexpr std::size_t max_provider_name = 64;
inline constexpr std::size_t max_fabric_address = 512;
inline constexpr std::size_t max_lifeline = 300;
inline constexpr std::size_t max_blob_hostname = 255;

struct address_blob {
  std::string provider;               ///< libfabric provider, e.g. "tcp;ofi_rxm", "shm"
  std::uint32_t address_format = 0;   ///< libfabric's addr_format
  std::vector<std::uint8_t> address;  ///< fi_getname's bytes
  std::uint32_t shard = 0;
  std::uint32_t incarnation = 0;  ///< never 0
  std::uint32_t pid = 0;
  std::string hostname;
  std::int64_t capacity = 0;
  std::int64_t max_length = 0;
  std::uint64_t spec_fingerprint = 0;
  std::uint64_t selection_fingerprint = 0;
  std::string lifeline;  ///< host:port of the shard's lifeline socket
  std::uint32_t max_message = default_max_message;
  std::uint64_t nonce = 0;  ///< what a client's token proof is computed over
};

inline std::vector<std::byte> encode(const address_blob& b) {
  wire_writer w = start_frame(message_type::blob);
  w.put_string(b.provider);
  w.put(b.address_format);
  w.put_counted(b.address);
  w.put(b.shard);
  w.put(b.incarnation);
  w.put(b.pid);
  w.put_string(b.hostname);
  w.put(b.capacity);
  w.put(b.max_length);
  w.put(b.spec_fingerprint);
  w.put(b.selection_fingerprint);
  w.put_string(b.lifeline);
  w.put(b.max_message);
  w.put(b.nonce);
  return finish_frame(std::move(w));
}

/// Parses a blob of at most `max_bytes` (blobs are small: 4 KiB is plenty).
inline decoded<address_blob> parse_blob(std::span<const std::byte> bytes,
                                        std::uint32_t max_bytes = 4096) {
  return parse_frame<address_blob>(
      bytes, message_type::blob, max_bytes, [](wire_reader& r, address_blob& b, std::string& what) {
        std::uint16_t address_bytes = 0;
        if (!r.get_string(b.provider, max_provider_name)) return what = "provider", refusal::none;
        if (!read_all(r, b.address_format, address_bytes)) return refusal::none;
        if (address_bytes == 0 || address_bytes > max_fabric_address)
          return what = "address length", refusal::out_of_range;
        b.address.resize(address_bytes);
        if (!r.get_into(b.address)) return refusal::none;
        if (!read_all(r, b.shard, b.incarnation, b.pid) ||
            !r.get_string(b.hostname, max_blob_hostname))
          return what = "hostname", refusal::none;
        if (!read_all(r, b.capacity, b.max_length, b.spec_fingerprint, b.selection_fingerprint) ||
            !r.get_string(b.lifeline, max_lifeline))
          return what = "lifeline", refusal::none;
        if (!read_all(r, b.max_message, b.nonce)) return refusal::none;
        if (b.provider.empty()) return what = "provider", refusal::out_of_range;
        if (b.incarnation == 0) return what = "incarnation", refusal::out_of_range;
        if (b.capacity < 1) return what = "capacity", refusal::out_of_range;
        if (b.max_length < 1) return what = "max_length", refusal::out_of_range;
        if (b.max_message < 4096) return what = "max_message", refusal::out_of_range;
        return refusal::none;
      });
}

/// Throws errc::peer_mismatch unless `theirs` may be connected to from `mine` (this side's own
/// blob, or what it expects: provider, address format, fingerprints), naming both sides.
inline void check_peer(const address_blob& mine, const address_blob& theirs) {
  auto refuse_peer = [&](const std::string& field, const std::string& ours,
                         const std::string& other) {
    throw error(errc::peer_mismatch,
                field + " differs: this side (pid " + std::to_string(mine.pid) + " on '" +
                    mine.hostname + "') has " + ours + ", shard " + std::to_string(theirs.shard) +
                    " (pid " + std::to_string(theirs.pid) + " on '" + theirs.hostname + "') has " +
                    other);
  };
  auto hex = [](std::uint64_t v) {
    char s[19];
    std::snprintf(s, sizeof(s), "0x%016llx", static_cast<unsigned long long>(v));
    return std::string(s);
  };
  if (mine.provider != theirs.provider)
    refuse_peer("the provider", "'" + mine.provider + "'", "'" + theirs.provider + "'");
  if (mine.address_format != theirs.address_format)
    refuse_peer("the address format", std::to_string(mine.address_format),
                std::to_string(theirs.address_format));
  if (mine.spec_fingerprint != theirs.spec_fingerprint)
    refuse_peer("the spec (columns, types, shapes or layout)", hex(mine.spec_fingerprint),
                hex(theirs.spec_fingerprint));
  if (mine.selection_fingerprint != theirs.selection_fingerprint)
    refuse_peer("the selection policy", hex(mine.selection_fingerprint),
                hex(theirs.selection_fingerprint));
}

/// This machine's host name (what a blob names its shard's host by).
inline std::string host_name() {
  char host[256] = {};
  (void)gethostname(host, sizeof(host) - 1);
  return host;
}

/// A random incarnation, never 0 (0 is transport::local's).
inline std::uint32_t draw_incarnation() {
  std::random_device seed;
  std::uint32_t n = 0;
  while (n == 0) n = seed();
  return n;
}

}  // namespace gear::detail::remote
