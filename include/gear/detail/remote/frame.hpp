#pragma once
// Framing of the remote transport's messages, and how a refused message is told and counted.
//
// Every control message (messages.hpp) and the address blob (blob.hpp) is a frame: a 16-byte
// header {magic "GEAR", wire version, type, body bytes, sender} and its body. `sender` is the
// index the receiver gave the sender at the handshake (0 before it): the receiver checks it
// against the peers it knows before acting on the message. A parser takes
// the bytes a peer sent, which may be anything: it checks the header against what it holds, reads
// every field through wire_reader (never past the end), checks every field's range, and refuses
// the message, naming the reason and the field, rather than use a value it has not checked. The
// receiver counts refusals by reason and goes on serving. Several frames of one sender may travel
// in one message, a bundle (at the end of this file).

#include <array>
#include <cstdint>
#include <cstring>
#include <gear/detail/remote/bytes.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gear::detail::remote {

inline constexpr std::uint32_t frame_magic = 0x52414547;  // "GEAR" in little-endian bytes
inline constexpr std::size_t frame_header_bytes = 16;
/// The largest control message a peer may send unless the handshake agrees on another.
inline constexpr std::uint32_t default_max_message = 64 * 1024;

enum class message_type : std::uint16_t {
  blob = 1,
  hello,
  welcome,
  status_request,
  status,
  sample_request,
  update,
  ack,
  update_result,
  erase,   ///< an update's body, removing the trajectories named (their priorities unused)
  bundle,  ///< several whole frames of one sender in one message (below)
};

/// Why a message was refused.
enum class refusal : std::uint8_t {
  none,
  truncated,     ///< fewer bytes than the header or a field says
  oversized,     ///< longer than the agreed maximum message
  bad_magic,     ///< not a gear frame
  bad_version,   ///< another wire version
  wrong_type,    ///< a frame of another type than expected
  trailing,      ///< bytes left after the last field
  out_of_range,  ///< a field outside its range (the message says which)
  mismatch,      ///< a fingerprint, incarnation, peer or sequence that is not this side's
};
inline constexpr std::size_t refusal_kinds = 9;

constexpr std::string_view to_string(refusal r) noexcept {
  constexpr std::array<std::string_view, refusal_kinds> names{
      "none",       "truncated", "oversized",    "bad_magic", "bad_version",
      "wrong_type", "trailing",  "out_of_range", "mismatch"};
  const auto i = static_cast<std::size_t>(r);
  return i < names.size() ? names[i] : "unknown";
}

/// Refused messages, by reason: the counters a shard reports in its stats.
struct refusal_counts {
  std::array<std::uint64_t, refusal_kinds> by_reason{};
  void add(refusal r) noexcept {
    if (r != refusal::none) ++by_reason[static_cast<std::size_t>(r)];
  }
  [[nodiscard]] std::uint64_t operator[](refusal r) const noexcept {
    return by_reason[static_cast<std::size_t>(r)];
  }
  [[nodiscard]] std::uint64_t total() const noexcept {
    std::uint64_t n = 0;
    for (const std::uint64_t c : by_reason) n += c;
    return n;
  }
};

/// A parsed message, or why it was refused (`why`, and `what` names the field).
template <class T>
struct decoded {
  T value{};
  refusal why = refusal::none;
  std::string what;
  explicit operator bool() const noexcept { return why == refusal::none; }
};

template <class T>
decoded<T> refuse(refusal why, std::string what) {
  decoded<T> d;
  d.why = why;
  d.what = std::move(what);
  return d;
}

/// Remote CQ data of a one-sided write (32 bits: every provider carries at least 4 bytes):
/// [kind 4 | peer 12 | block or request 16].
/// A sample reply is written as writes of columns alone (sample_column) and a last one that
/// carries its meta part (sample_reply), with the columns that fit beside it.
enum class write_kind : std::uint32_t { insert_entry = 1, sample_reply = 2, sample_column = 3 };
struct cq_data {
  write_kind kind{};
  std::uint32_t peer = 0;   ///< the writer's index at the receiver (< 4096)
  std::uint32_t index = 0;  ///< the first block (insert entries) or the request (< 65536)
  [[nodiscard]] constexpr std::uint64_t encode() const noexcept {
    return (static_cast<std::uint64_t>(kind) << 28) | (std::uint64_t{peer & 0xfff} << 16) |
           (index & 0xffff);
  }
  static constexpr cq_data decode(std::uint64_t v) noexcept {
    return {static_cast<write_kind>((v >> 28) & 0xf), static_cast<std::uint32_t>((v >> 16) & 0xfff),
            static_cast<std::uint32_t>(v & 0xffff)};
  }
};
inline constexpr std::uint32_t max_peers = 4096, max_cq_index = 65536;

/// Reads every field in order; false once one is missing (the parser then refuses: truncated).
template <class... T>
bool read_all(wire_reader& r, T&... fields) {
  return (r.get(fields) && ...);
}

/// Starts a frame of `type` from `sender` (in `reuse`'s storage); finish_frame() writes its body
/// length.
inline wire_writer start_frame(message_type type, std::uint32_t sender = 0,
                               std::vector<std::byte>&& reuse = {}) {
  wire_writer w(std::move(reuse));
  w.put(frame_magic);
  w.put(wire_version);
  w.put(static_cast<std::uint16_t>(type));
  w.put(std::uint32_t{0});  // body bytes, patched
  w.put(sender);
  return w;
}
/// Sets the sender of an encoded frame.
inline void stamp_sender(std::span<std::byte> frame, std::uint32_t sender) noexcept {
  if (frame.size() >= frame_header_bytes) std::memcpy(frame.data() + 12, &sender, 4);
}
inline std::vector<std::byte> finish_frame(wire_writer&& w) {
  w.patch_u32(8, static_cast<std::uint32_t>(w.size() - frame_header_bytes));
  return std::move(w).take();
}

/// What a frame's header says: its type and sender.
struct frame_info {
  message_type type{};
  std::uint32_t sender = 0;
};

/// The type and sender a frame says, if its header holds together (magic, version, lengths); for
/// a receiver that dispatches on it. Refuses as parse_frame does.
inline decoded<frame_info> frame_type(std::span<const std::byte> bytes, std::uint32_t max_message) {
  if (bytes.size() < frame_header_bytes)
    return refuse<frame_info>(refusal::truncated, "frame header");
  if (bytes.size() > max_message)
    return refuse<frame_info>(
        refusal::oversized,
        std::to_string(bytes.size()) + " bytes, the maximum is " + std::to_string(max_message));
  wire_reader r(bytes);
  std::uint32_t magic = 0, body = 0, sender = 0;
  std::uint16_t version = 0, type = 0;
  (void)(r.get(magic) && r.get(version) && r.get(type) && r.get(body) && r.get(sender));
  if (magic != frame_magic) return refuse<frame_info>(refusal::bad_magic, "magic");
  if (version != wire_version)
    return refuse<frame_info>(refusal::bad_version, "wire version " + std::to_string(version) +
                                                        ", this side speaks " +
                                                        std::to_string(wire_version));
  if (body > r.remaining()) return refuse<frame_info>(refusal::truncated, "frame body");
  if (body < r.remaining()) return refuse<frame_info>(refusal::trailing, "frame body");
  decoded<frame_info> d;
  d.value = {static_cast<message_type>(type), sender};
  return d;
}

/// Parses a frame that must be of `type`: the header, then `read_body(reader, value, what)`,
/// which reads and range-checks every field and returns the refusal (or none), then checks that
/// no byte is left.
template <class T, class ReadBody>
decoded<T> parse_frame(std::span<const std::byte> bytes, message_type type,
                       std::uint32_t max_message, ReadBody&& read_body) {
  const decoded<frame_info> header = frame_type(bytes, max_message);
  if (!header) return refuse<T>(header.why, header.what);
  if (header.value.type != type)
    return refuse<T>(refusal::wrong_type,
                     "type " + std::to_string(static_cast<unsigned>(header.value.type)) +
                         ", expected " + std::to_string(static_cast<unsigned>(type)));
  wire_reader r(bytes.subspan(frame_header_bytes));
  decoded<T> d;
  d.why = read_body(r, d.value, d.what);
  if (d.why != refusal::none) return d;
  if (!r.ok()) return refuse<T>(refusal::truncated, d.what.empty() ? "a field" : d.what);
  if (r.remaining() != 0) return refuse<T>(refusal::trailing, "after the last field");
  return d;
}

// ---- bundles -----------------------------------------------------------------------------------
// A bundle is one message that carries several frames of one sender (a learner's sample requests
// for one shard): a frame of type bundle whose body is those frames back to back, each whole, with
// its own header. A sender that holds several for one receiver pays one send for them all.

/// Starts an empty bundle in `out`, keeping its storage.
inline void start_bundle(std::vector<std::byte>& out) {
  out.assign(frame_header_bytes, std::byte{0});
  const std::uint16_t type = static_cast<std::uint16_t>(message_type::bundle);
  std::memcpy(out.data(), &frame_magic, 4);
  std::memcpy(out.data() + 4, &wire_version, 2);
  std::memcpy(out.data() + 6, &type, 2);
}
/// Appends a whole frame to the bundle in `out`.
inline void add_to_bundle(std::vector<std::byte>& out, std::span<const std::byte> frame) {
  out.insert(out.end(), frame.begin(), frame.end());
}
/// Sets the body length and the sender of the bundle in `out` (that of its frames).
inline void finish_bundle(std::span<std::byte> out, std::uint32_t sender) noexcept {
  const auto body = static_cast<std::uint32_t>(out.size() - frame_header_bytes);
  std::memcpy(out.data() + 8, &body, 4);
  stamp_sender(out, sender);
}

/// Frames for one receiver, to go in one message: the lone frame, or a bundle of them. Keeps its
/// storage once cleared.
class outgoing_frames {
 public:
  outgoing_frames() { start_bundle(bytes_); }
  void add(std::span<const std::byte> frame) {
    add_to_bundle(bytes_, frame);
    ++frames_;
  }
  [[nodiscard]] std::size_t frames() const noexcept { return frames_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_.size(); }
  /// The message that sends them, from `sender`: the lone frame (as added), or a bundle of them
  /// all; empty when none was added.
  [[nodiscard]] std::span<const std::byte> message(std::uint32_t sender) noexcept {
    if (frames_ <= 1) return std::span<const std::byte>(bytes_).subspan(frame_header_bytes);
    finish_bundle(bytes_, sender);
    return bytes_;
  }
  /// Keeps the first `frames` frames (`bytes` bytes, as bytes() said then): a rollback.
  void truncate(std::size_t bytes, std::size_t frames) noexcept {
    bytes_.resize(bytes);  // shrinks: never allocates
    frames_ = frames;
  }
  void clear() noexcept { truncate(frame_header_bytes, 0); }

 private:
  std::vector<std::byte> bytes_;  // a bundle's header, then the frames
  std::size_t frames_ = 0;
};

/// The frames of a bundle, as views of `bytes` in `frames`, once the bundle and every frame's
/// header hold together (frame_type), each frame is of type `inner` (never a bundle) and names
/// the bundle's sender. Otherwise the whole bundle is refused (`frames` empty): nothing of it is
/// to be acted on. The receiver then takes each frame as if it had come alone: its body is
/// parsed and checked, and refused or acted on, on its own. Returns the bundle's header.
inline decoded<frame_info> split_bundle(std::span<const std::byte> bytes, std::uint32_t max_message,
                                        message_type inner,
                                        std::vector<std::span<const std::byte>>& frames) {
  frames.clear();
  const auto refused = [&](refusal why, std::string what) {
    frames.clear();  // nothing of a refused bundle is handed out
    return refuse<frame_info>(why, std::move(what));
  };
  const decoded<frame_info> header = frame_type(bytes, max_message);
  if (!header) return header;
  if (header.value.type != message_type::bundle) return refused(refusal::wrong_type, "no bundle");
  std::span<const std::byte> rest = bytes.subspan(frame_header_bytes);
  if (rest.empty()) return refused(refusal::out_of_range, "a bundle of no frame");
  while (!rest.empty()) {
    if (rest.size() < frame_header_bytes)
      return refused(refusal::truncated, "bundled frame header");
    std::uint32_t body = 0;
    std::memcpy(&body, rest.data() + 8, 4);
    if (body > rest.size() - frame_header_bytes)
      return refused(refusal::truncated, "bundled frame body");
    const auto frame = rest.first(frame_header_bytes + body);
    const decoded<frame_info> f = frame_type(frame, max_message);
    if (!f) return refused(f.why, "bundled frame: " + f.what);
    if (f.value.type != inner || inner == message_type::bundle)
      return refused(refusal::wrong_type,
                     "bundled frame of type " + std::to_string(unsigned(f.value.type)));
    if (f.value.sender != header.value.sender)
      return refused(refusal::mismatch, "bundled frame of another sender");
    frames.push_back(frame);
    rest = rest.subspan(frame.size());
  }
  return header;
}

}  // namespace gear::detail::remote
