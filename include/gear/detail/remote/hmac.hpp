#pragma once
// The handshake token's proof: HMAC-SHA-256 (FIPS 180-4, RFC 2104) of the shard's nonce and the
// client's identity under a token both sides were given. The token itself never travels; a shard
// compares proofs in constant time. Against accidents in one trusted cluster (a job that reaches
// the wrong shards), not against an attacker who can read the wire.

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace gear::detail::remote {

using digest = std::array<std::uint8_t, 32>;

/// SHA-256 of a byte stream, fed in pieces.
class sha256 {
 public:
  void update(std::span<const std::uint8_t> data) noexcept {
    for (const std::uint8_t b : data) {
      block_[fill_++] = b;
      if (fill_ == 64) {
        compress();
        fill_ = 0;
      }
    }
    bits_ += std::uint64_t{data.size()} * 8;
  }
  [[nodiscard]] digest finish() noexcept {
    const std::uint64_t bits = bits_;
    const std::uint8_t one = 0x80, zero = 0;
    update({&one, 1});
    while (fill_ != 56) update({&zero, 1});
    std::uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
    update(length);
    digest out{};
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<std::uint8_t>(h_[i] >> (24 - 8 * j));
    return out;
  }

 private:
  static constexpr std::uint32_t rotr(std::uint32_t x, int n) noexcept {
    return (x >> n) | (x << (32 - n));
  }
  void compress() noexcept {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = std::uint32_t{block_[4 * i]} << 24 | std::uint32_t{block_[4 * i + 1]} << 16 |
             std::uint32_t{block_[4 * i + 2]} << 8 | block_[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6],
                  h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t t1 =
          h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const std::uint32_t t2 =
          (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
  }

  std::uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::uint8_t block_[64] = {};
  int fill_ = 0;
  std::uint64_t bits_ = 0;
};

/// HMAC-SHA-256 of `message` under `key`.
inline digest hmac_sha256(std::span<const std::uint8_t> key,
                          std::span<const std::uint8_t> message) {
  std::uint8_t block[64] = {};
  if (key.size() > 64) {
    sha256 k;
    k.update(key);
    const digest d = k.finish();
    std::memcpy(block, d.data(), d.size());
  } else if (!key.empty()) {
    std::memcpy(block, key.data(), key.size());
  }
  std::uint8_t inner_pad[64], outer_pad[64];
  for (int i = 0; i < 64; ++i) {
    inner_pad[i] = block[i] ^ 0x36;
    outer_pad[i] = block[i] ^ 0x5c;
  }
  sha256 inner;
  inner.update(inner_pad);
  inner.update(message);
  const digest in = inner.finish();
  sha256 outer;
  outer.update(outer_pad);
  outer.update(in);
  return outer.finish();
}

/// A client's proof for a shard: HMAC(token, nonce || role || pid).
inline digest token_proof(std::string_view token, std::uint64_t nonce, std::uint8_t role,
                          std::uint32_t pid) {
  std::uint8_t message[13];
  std::memcpy(message, &nonce, 8);
  message[8] = role;
  std::memcpy(message + 9, &pid, 4);
  return hmac_sha256({reinterpret_cast<const std::uint8_t*>(token.data()), token.size()}, message);
}

/// Equal, in time that does not depend on where they differ.
inline bool same_proof(const digest& a, const digest& b) noexcept {
  std::uint8_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<std::uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace gear::detail::remote
