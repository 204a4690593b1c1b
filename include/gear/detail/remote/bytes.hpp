#pragma once
// Bytes on the wire: fixed-width little-endian integers and IEEE-754 floats, written into a growing
// buffer and read back from a span that is never read past its end. Every message of the remote
// transport (messages.hpp) is built from these, so a parser cannot index outside what it was
// given, whatever the peer sent: a read past the end fails, and the parser refuses the message.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace gear::detail::remote {

static_assert(std::endian::native == std::endian::little,
              "gear's wire format is little-endian, as every platform gear builds for");

/// Version of the wire format (frame.hpp, messages.hpp, entry.hpp) and of the packed layouts it
/// carries; part of every fingerprint (fingerprint.hpp).
inline constexpr std::uint16_t wire_version = 7;

/// Appends fields to a message.
class wire_writer {
 public:
  wire_writer() { bytes_.reserve(256); }  // control messages are small: few reallocations
  /// Writes into `reuse`, emptied, keeping its capacity (a message encoded for every sample).
  explicit wire_writer(std::vector<std::byte>&& reuse) : bytes_(std::move(reuse)) {
    bytes_.clear();
    bytes_.reserve(256);
  }

  template <class T>
  requires std::is_arithmetic_v<T>
  void put(T value) {
    std::byte raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    bytes_.insert(bytes_.end(), raw, raw + sizeof(T));
  }
  /// A string as a u16 length and its bytes (the caller bounds its length).
  void put_string(std::string_view s) {
    put(static_cast<std::uint16_t>(s.size()));
    put_bytes(std::as_bytes(std::span(s.data(), s.size())));
  }
  void put_bytes(std::span<const std::byte> b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  void put_bytes(std::span<const std::uint8_t> b) { put_bytes(std::as_bytes(b)); }
  /// Bytes as a u16 count and the bytes (the caller bounds the count); get_into reads them back
  /// once the count was read and checked.
  void put_counted(std::span<const std::uint8_t> b) {
    put(static_cast<std::uint16_t>(b.size()));
    put_bytes(b);
  }
  /// Overwrites a u32 written earlier at `at` (a length known only at the end).
  void patch_u32(std::size_t at, std::uint32_t value) {
    std::memcpy(bytes_.data() + at, &value, sizeof(value));
  }

  [[nodiscard]] std::size_t size() const noexcept { return bytes_.size(); }
  [[nodiscard]] std::vector<std::byte> take() && noexcept { return std::move(bytes_); }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

/// Reads fields from a received message; a read past the end returns false and leaves `ok()`
/// false for good (so a parser may read a run of fields and check once).
class wire_reader {
 public:
  explicit wire_reader(std::span<const std::byte> bytes) noexcept : bytes_(bytes) {}

  template <class T>
  requires std::is_arithmetic_v<T>
  bool get(T& value) noexcept {
    if (!ok_ || bytes_.size() - at_ < sizeof(T)) return ok_ = false;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  /// A string written by put_string, of at most `max` bytes.
  bool get_string(std::string& s, std::size_t max) {
    std::uint16_t n = 0;
    if (!get(n) || n > max || bytes_.size() - at_ < n) return ok_ = false;
    s.assign(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return true;
  }
  /// The next `n` bytes, without copying them.
  bool get_bytes(std::span<const std::byte>& out, std::size_t n) noexcept {
    if (!ok_ || bytes_.size() - at_ < n) return ok_ = false;
    out = bytes_.subspan(at_, n);
    at_ += n;
    return true;
  }

  /// Fills `out` with the next out.size() bytes.
  bool get_into(std::span<std::uint8_t> out) noexcept {
    std::span<const std::byte> in;
    if (!get_bytes(in, out.size())) return false;
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
    return true;
  }

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return bytes_.size() - at_; }

 private:
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
  bool ok_ = true;
};

}  // namespace gear::detail::remote
