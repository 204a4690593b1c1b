// libFuzzer target for the remote transport's parsers (frame.hpp and its bundles, messages.hpp,
// blob.hpp, entry.hpp): whatever bytes a peer sends, a parser must refuse or accept them without
// reading outside them (AddressSanitizer), without undefined behaviour (UBSan), and an accepted
// message must re-encode to the bytes it came from. The first input byte picks the parser; the
// rest is either the message itself or an XOR mask over a valid one (so that the search starts
// deep).
//
//   tests/fuzz: built by clang++ with -fsanitize=fuzzer,address,undefined where clang is found;
//   ctest runs it for a bounded time (protocol_fuzz).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <gear/detail/remote/blob.hpp>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/messages.hpp>
#include <vector>

namespace remote = gear::detail::remote;

namespace {

remote::message_limits limits() {
  remote::message_limits l;
  l.capacity = 1000;
  l.max_length = 64;
  l.max_batch = 4096;
  l.max_ring_blocks = 256;
  return l;
}

/// A valid message of each kind, to mutate.
std::vector<std::byte> valid(unsigned kind) {
  switch (kind) {
    case 0: {
      remote::hello h;
      h.hostname = "node";
      h.ring_blocks = 8;
      h.address = {1, 2, 3};
      h.reply_address = {7, 8, 9};
      return remote::encode(h);
    }
    case 1: {
      remote::welcome w;
      w.incarnation = 7;
      w.ring_key = {1, 2, 3};
      w.block_bytes = 4096;
      w.ring_blocks = 8;
      w.intake = {4, 5, 6};
      return remote::encode(w);
    }
    case 2:
      return remote::encode(remote::status{7, 10, 3.5, 1.0, 1, 2, 3});
    case 3: {
      remote::sample_request r;
      r.rows = 4;
      r.win.length = 4;
      return remote::encode(r);
    }
    case 4: {
      remote::update u;
      u.entries = {{1, 7, 0.5f}, {2, 7, 1.5f}};
      return remote::encode(u);
    }
    case 5:
      return remote::encode(remote::ack{1, 1, 3, gear::key{5, 0, 7}});
    case 9: {  // a bundle of two sample requests
      std::vector<std::byte> b;
      remote::start_bundle(b);
      for (int i = 0; i < 2; ++i) {
        auto frame = valid(3);
        remote::stamp_sender(frame, 3);
        remote::add_to_bundle(b, frame);
      }
      remote::finish_bundle(b, 3);
      return b;
    }
    default: {
      remote::address_blob b;
      b.provider = "shm";
      b.address = {1, 2, 3, 4};
      b.incarnation = 7;
      b.capacity = 8;
      b.max_length = 4;
      return remote::encode(b);
    }
  }
}

template <class Decoded, class Encode>
void roundtrip(const Decoded& d, std::span<const std::byte> bytes, Encode encode) {
  if (!d) return;
  std::vector<std::byte> again = encode(d.value);
  std::uint32_t sender = 0;  // the header's sender is the receiver's to check, not the parser's
  std::memcpy(&sender, bytes.data() + 12, sizeof(sender));
  remote::stamp_sender(again, sender);
  if (again.size() != bytes.size() || std::memcmp(again.data(), bytes.data(), bytes.size()) != 0)
    std::abort();  // accepted, yet not what it says
}

void parse(unsigned kind, std::span<const std::byte> b) {
  const auto l = limits();
  switch (kind) {
    case 0:
      roundtrip(remote::parse_hello(b, l), b, [](const auto& v) { return remote::encode(v); });
      break;
    case 1:
      roundtrip(remote::parse_welcome(b, l), b, [](const auto& v) { return remote::encode(v); });
      break;
    case 2:
      roundtrip(remote::parse_status(b, l), b, [](const auto& v) { return remote::encode(v); });
      break;
    case 3:
      roundtrip(remote::parse_sample_request(b, l), b,
                [](const auto& v) { return remote::encode(v); });
      break;
    case 4:
      roundtrip(remote::parse_update(b, l), b, [](const auto& v) { return remote::encode(v); });
      break;
    case 5:
      roundtrip(remote::parse_ack(b, l, 8), b, [](const auto& v) { return remote::encode(v); });
      break;
    case 6:
      roundtrip(remote::parse_blob(b), b, [](const auto& v) { return remote::encode(v); });
      break;
    case 7: {  // an insert entry in a ring of 4 blocks of 4 KiB, the completion naming any block
      const std::int64_t steps[] = {24, 4, 1};
      std::vector<std::byte> ring(4 * 4096);
      if (!b.empty()) std::memcpy(ring.data(), b.data(), std::min(b.size(), ring.size()));
      const auto first = b.empty() ? 0u : static_cast<std::uint32_t>(b[0]) % 5;
      (void)remote::check_entry(ring, {1, 1, first, 4, 4096, 64, steps});
      break;
    }
    case 9: {  // a bundle: what is accepted is whole frames, which rebuild it byte for byte
      std::vector<std::span<const std::byte>> frames;
      const auto d =
          remote::split_bundle(b, l.max_message, remote::message_type::sample_request, frames);
      if (!d) break;
      std::vector<std::byte> again;
      remote::start_bundle(again);
      for (const auto f : frames) {
        remote::add_to_bundle(again, f);
        roundtrip(remote::parse_sample_request(f, l), f,
                  [](const auto& v) { return remote::encode(v); });
      }
      remote::finish_bundle(again, d.value.sender);
      if (again.size() != b.size() || std::memcmp(again.data(), b.data(), b.size()) != 0)
        std::abort();
      break;
    }
    default: {  // a sample reply, the slice as long as the input
      const std::int64_t steps[] = {24, 4};
      (void)remote::check_reply(b, 1, 7, 2, 2, steps);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const unsigned kind = data[0] % 10;
  const bool mask = (data[1] & 1) != 0 && (kind < 7 || kind == 9);
  std::vector<std::byte> bytes;
  if (mask) {  // XOR the rest over a valid message of that kind (and its length, if longer)
    bytes = valid(kind);
    for (std::size_t i = 2; i < size; ++i) {
      if (i - 2 >= bytes.size()) bytes.push_back(std::byte{0});
      bytes[i - 2] ^= std::byte{data[i]};
    }
  } else {
    bytes.assign(reinterpret_cast<const std::byte*>(data + 2),
                 reinterpret_cast<const std::byte*>(data + size));
  }
  parse(kind, bytes);
  return 0;
}
