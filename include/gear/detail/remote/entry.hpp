#pragma once
// What moves by one-sided writes, and how the receiver checks it before use:
//
//   insert entry   an actor's trajectory, written into its staging ring at a shard and
//                  published with remote CQ data naming its first block:
//                    header (64 B) | column 0 | column 1 | ... | footer (8 B: the sequence)
//                  each column `length` steps, starting at a multiple of segment_alignment from
//                  the payload's start, over ceil(bytes / block_bytes) consecutive blocks;
//   sample reply   a shard's share of a learner's batch, packed in the shard's staging as
//                    header (48 B) | mask [k][L] | keys [k] | probabilities [k] (f32, within
//                    the shard) | footer (8 B: the request) | column 0 [k][L] | column 1 ...
//                  each section at a multiple of segment_alignment. Each column is written
//                  straight into the learner's batch (its rows of that column), the part up to
//                  the footer into the learner's slice, last; each write names the request in
//                  its CQ data, and the learner counts them.
//
// A receiver computes the layout from what it expects (the spec, the request), never from what
// the sender claims, and refuses an entry or a reply whose header or footer disagrees: a footer
// that does not match means the bytes were not all written.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <gear/detail/remote/frame.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <gear/layout.hpp>
#include <span>
#include <string>
#include <vector>

namespace gear::detail::remote {

constexpr std::int64_t align_section(std::int64_t bytes) noexcept {
  return (bytes + segment_alignment - 1) / segment_alignment * segment_alignment;
}

// ---- insert entries ----------------------------------------------------------------------------

inline constexpr std::uint32_t entry_magic = 0x544E4547;  // "GENT"
inline constexpr std::int64_t entry_header_bytes = 64, entry_footer_bytes = 8;
inline constexpr std::uint32_t entry_has_priority = 1;  ///< flags: the header's priority is set

struct entry_header {
  std::uint32_t magic = entry_magic;
  std::uint16_t version = wire_version;
  std::uint16_t columns = 0;
  std::uint32_t actor = 0;
  std::uint32_t flags = 0;
  std::uint64_t sequence = 0;
  std::int64_t length = 0;  ///< steps
  double priority = 0;      ///< initial priority, if flags say so
  std::uint32_t first_block = 0, blocks = 0;
  std::uint64_t payload_bytes = 0;
  std::uint32_t checksum = 0, reserved = 0;  ///< both 0 in this version
};
static_assert(sizeof(entry_header) == entry_header_bytes);

/// Where an entry's parts lie, from the spec's step sizes and the trajectory's length.
struct entry_layout {
  std::vector<std::int64_t> column_at;  ///< from the payload's start
  std::int64_t payload_bytes = 0;
  std::int64_t total_bytes = 0;  ///< header, payload, footer
  std::int64_t blocks = 0;
};

inline entry_layout layout_entry(std::span<const std::int64_t> step_bytes, std::int64_t length,
                                 std::int64_t block_bytes) {
  entry_layout l;
  for (const std::int64_t s : step_bytes) {
    l.column_at.push_back(l.payload_bytes);
    l.payload_bytes += align_section(length * s);
  }
  l.total_bytes = entry_header_bytes + l.payload_bytes + entry_footer_bytes;
  l.blocks = (l.total_bytes + block_bytes - 1) / block_bytes;
  return l;
}

/// Writes the entry for `h` (its columns, blocks and payload_bytes set here from the layout) into
/// `out`, which holds its whole blocks: the header, column c's `h.length` steps from
/// `columns[c]` (packed, step_bytes[c] bytes a step), the footer. What an actor writes to its ring.
inline void pack_entry_into(entry_header h, std::span<const std::byte* const> columns,
                            std::span<const std::int64_t> step_bytes, const entry_layout& l,
                            std::span<std::byte> out) {
  h.columns = static_cast<std::uint16_t>(step_bytes.size());
  h.blocks = static_cast<std::uint32_t>(l.blocks);
  h.payload_bytes = static_cast<std::uint64_t>(l.payload_bytes);
  std::memcpy(out.data(), &h, sizeof(h));
  for (std::size_t c = 0; c < columns.size() && c < step_bytes.size(); ++c)
    if (columns[c] != nullptr && h.length * step_bytes[c] > 0)
      std::memcpy(out.data() + entry_header_bytes + l.column_at[c], columns[c],
                  static_cast<std::size_t>(h.length * step_bytes[c]));
  std::memcpy(out.data() + entry_header_bytes + l.payload_bytes, &h.sequence, sizeof(h.sequence));
}

/// pack_entry_into a new buffer of whole blocks (zeroed): for tests and tools.
inline void pack_entry(const entry_header& h, std::span<const std::span<const std::byte>> columns,
                       std::span<const std::int64_t> step_bytes, std::int64_t block_bytes,
                       std::vector<std::byte>& out) {
  const entry_layout l = layout_entry(step_bytes, h.length, block_bytes);
  out.assign(static_cast<std::size_t>(l.blocks * block_bytes), std::byte{0});
  std::vector<const std::byte*> from;
  for (std::size_t c = 0; c < columns.size(); ++c)
    from.push_back(columns[c].size() >= static_cast<std::size_t>(h.length * step_bytes[c])
                       ? columns[c].data()
                       : nullptr);
  pack_entry_into(h, from, step_bytes, l, out);
}

/// What the shard expects of the entry a completion names.
struct entry_expectation {
  std::uint32_t actor = 0;
  std::uint64_t sequence = 0;     ///< the oldest the shard still expects (older: a replay)
  std::uint32_t first_block = 0;  ///< from the completion's CQ data
  std::uint32_t ring_blocks = 0;
  std::int64_t block_bytes = 0;
  std::int64_t max_length = 0;
  std::span<const std::int64_t> step_bytes;  ///< the spec's
};

/// Checks the entry at `expect.first_block` of `ring` (the actor's whole staging ring) and
/// returns its header, or why it is refused. Reads nothing outside the ring.
inline decoded<entry_header> check_entry(std::span<const std::byte> ring,
                                         const entry_expectation& expect) {
  using d = decoded<entry_header>;
  const auto ring_bytes = static_cast<std::int64_t>(ring.size());
  if (expect.first_block >= expect.ring_blocks ||
      static_cast<std::int64_t>(expect.ring_blocks) * expect.block_bytes != ring_bytes)
    return refuse<entry_header>(refusal::out_of_range, "first block");
  const std::int64_t at = std::int64_t{expect.first_block} * expect.block_bytes;
  if (ring_bytes - at < entry_header_bytes)
    return refuse<entry_header>(refusal::truncated, "header");
  d out;
  entry_header& h = out.value;
  wire_reader r(ring.subspan(static_cast<std::size_t>(at), entry_header_bytes));
  (void)(r.get(h.magic) && r.get(h.version) && r.get(h.columns) && r.get(h.actor) &&
         r.get(h.flags) && r.get(h.sequence) && r.get(h.length) && r.get(h.priority) &&
         r.get(h.first_block) && r.get(h.blocks) && r.get(h.payload_bytes) && r.get(h.checksum) &&
         r.get(h.reserved));
  if (h.magic != entry_magic) return refuse<entry_header>(refusal::bad_magic, "entry magic");
  if (h.version != wire_version) return refuse<entry_header>(refusal::bad_version, "entry version");
  if (h.actor != expect.actor) return refuse<entry_header>(refusal::mismatch, "actor");
  if (h.sequence < expect.sequence)
    return refuse<entry_header>(refusal::mismatch,
                                "sequence " + std::to_string(h.sequence) + ", expected " +
                                    std::to_string(expect.sequence) + " or later");
  if (h.first_block != expect.first_block)
    return refuse<entry_header>(refusal::mismatch, "first block");
  if (h.columns != expect.step_bytes.size())
    return refuse<entry_header>(refusal::out_of_range, "column count");
  if (h.length < 1 || h.length > expect.max_length)
    return refuse<entry_header>(refusal::out_of_range, "length " + std::to_string(h.length));
  if ((h.flags & ~entry_has_priority) != 0 || h.checksum != 0 || h.reserved != 0)
    return refuse<entry_header>(refusal::out_of_range, "flags");
  if ((h.flags & entry_has_priority) != 0 && !(std::isfinite(h.priority) && h.priority >= 0))
    return refuse<entry_header>(refusal::out_of_range, "priority");
  const entry_layout l = layout_entry(expect.step_bytes, h.length, expect.block_bytes);
  if (h.payload_bytes != static_cast<std::uint64_t>(l.payload_bytes))
    return refuse<entry_header>(refusal::out_of_range, "payload bytes");
  if (h.blocks != l.blocks) return refuse<entry_header>(refusal::out_of_range, "blocks");
  if (h.blocks > expect.ring_blocks - expect.first_block)
    return refuse<entry_header>(refusal::out_of_range, "blocks past the ring's end");
  std::uint64_t footer = 0;
  wire_reader f(ring.subspan(static_cast<std::size_t>(at + entry_header_bytes + l.payload_bytes),
                             entry_footer_bytes));
  (void)f.get(footer);
  if (footer != h.sequence) return refuse<entry_header>(refusal::truncated, "footer");
  return out;
}

// ---- sample replies ----------------------------------------------------------------------------

inline constexpr std::uint32_t reply_magic = 0x504D5347;  // "GSMP"
inline constexpr std::int64_t reply_header_bytes = 48, reply_footer_bytes = 8;

struct reply_header {
  std::uint32_t magic = reply_magic;
  std::uint16_t version = wire_version;
  std::uint16_t column_writes = 0;  ///< writes of columns alone that come before this one's
  std::uint32_t request = 0;
  std::uint32_t incarnation = 0;
  std::int64_t rows = 0;
  std::int64_t window = 0;
  double mass = 0;        ///< the shard's selection mass when it selected (M'_s)
  std::int64_t size = 0;  ///< its committed trajectories then
};
static_assert(sizeof(reply_header) == reply_header_bytes);

/// A reply as a shard packs it in its staging: the part the learner's slice takes (header, mask,
/// keys, probabilities, footer: meta_bytes), then the columns, which the shard writes straight
/// into the learner's batch. A write carries as many segments as the provider takes (columns
/// into the batch, in order, then the meta part into the slice; reply_column_writes), each
/// naming the request in its CQ data; the header counts the writes before the meta part's.
struct reply_layout {
  std::int64_t mask_at = 0, keys_at = 0, probabilities_at = 0, footer_at = 0, meta_bytes = 0;
  std::array<std::int64_t, max_request_columns> column_at{};  // a learner lays out every sample
  std::int64_t total_bytes = 0;
};

inline reply_layout layout_reply(std::span<const std::int64_t> step_bytes, std::int64_t rows,
                                 std::int64_t window) {
  reply_layout l;
  std::int64_t at = align_section(reply_header_bytes);
  l.mask_at = at;
  at += align_section(rows * window);
  l.keys_at = at;
  at += align_section(rows * std::int64_t{sizeof(key)});
  l.probabilities_at = at;
  at += align_section(rows * std::int64_t{sizeof(float)});
  l.footer_at = at;
  l.meta_bytes = at + reply_footer_bytes;
  at = align_section(l.meta_bytes);
  GEAR_REQUIRE(step_bytes.size() <= l.column_at.size(), errc::invalid_argument,
               std::to_string(step_bytes.size()) + " columns in a reply");
  for (std::size_t c = 0; c < step_bytes.size(); ++c) {
    l.column_at[c] = at;
    at += align_section(rows * window * step_bytes[c]);
  }
  l.total_bytes = at;
  return l;
}

/// Writes of columns alone that come before the one carrying the meta part, for `columns` columns
/// (none in a reply of no rows) when a write carries up to `segments` (>= 1) segments.
[[nodiscard]] constexpr std::uint16_t reply_column_writes(std::size_t columns,
                                                          std::size_t segments) noexcept {
  return static_cast<std::uint16_t>((columns + segments) / segments - 1);
}

/// Writes a reply's header and footer around the sections a gather filled in `slice`.
inline void seal_reply(const reply_header& h, std::span<std::byte> slice, const reply_layout& l) {
  std::memcpy(slice.data(), &h, sizeof(h));
  std::memcpy(slice.data() + l.footer_at, &h.request, sizeof(h.request));
}

/// Checks a reply's meta part in `slice` (exactly the layout's meta_bytes) against the request it
/// answers.
inline decoded<reply_header> check_reply(std::span<const std::byte> slice, std::uint32_t request,
                                         std::uint32_t incarnation, std::int64_t rows,
                                         std::int64_t window,
                                         std::span<const std::int64_t> step_bytes) {
  const reply_layout l = layout_reply(step_bytes, rows, window);
  if (static_cast<std::int64_t>(slice.size()) != l.meta_bytes)
    return refuse<reply_header>(refusal::truncated, "reply size");
  decoded<reply_header> out;
  reply_header& h = out.value;
  wire_reader r(slice.first(reply_header_bytes));
  (void)(r.get(h.magic) && r.get(h.version) && r.get(h.column_writes) && r.get(h.request) &&
         r.get(h.incarnation) && r.get(h.rows) && r.get(h.window) && r.get(h.mass) &&
         r.get(h.size));
  if (h.magic != reply_magic) return refuse<reply_header>(refusal::bad_magic, "reply magic");
  if (h.version != wire_version) return refuse<reply_header>(refusal::bad_version, "reply version");
  if (h.request != request) return refuse<reply_header>(refusal::mismatch, "request");
  if (h.incarnation != incarnation) return refuse<reply_header>(refusal::mismatch, "incarnation");
  if (h.rows != rows || h.window != window)
    return refuse<reply_header>(refusal::mismatch, "rows or window");
  if (h.column_writes > step_bytes.size())
    return refuse<reply_header>(refusal::out_of_range, "column writes");
  if (!(std::isfinite(h.mass) && h.mass >= 0))  // 0: priorities all 0 since (rows drawn uniformly)
    return refuse<reply_header>(refusal::out_of_range, "mass");
  if (h.size < 1) return refuse<reply_header>(refusal::out_of_range, "size");
  std::uint32_t footer = 0;
  wire_reader f(slice.subspan(static_cast<std::size_t>(l.footer_at), 4));
  (void)f.get(footer);
  if (footer != request) return refuse<reply_header>(refusal::truncated, "footer");
  return out;
}

/// What a learner granted a shard for its replies (its hello): its slice's size, the largest
/// share it will ask for.
struct reply_grant {
  std::uint64_t slice_bytes = 0;
  std::int64_t max_rows = 0, max_window = 0;
};

/// Checks that the writes answering `r` stay inside what its learner granted: a share no larger
/// than the grant (the shard's staging is sized by it), the meta part inside the slice, each
/// column's rows inside the batch region the request names. The reply's layout when they do.
inline decoded<reply_layout> check_request_fits(const sample_request& r,
                                                std::span<const std::int64_t> step_bytes,
                                                const reply_grant& g) {
  if (r.rows > g.max_rows || r.win.length > g.max_window)
    return refuse<reply_layout>(refusal::out_of_range, "a share larger than the grant");
  if (r.column_address.size() != step_bytes.size())
    return refuse<reply_layout>(refusal::mismatch, "column count");
  decoded<reply_layout> out;
  out.value = layout_reply(step_bytes, r.rows, r.win.length);
  if (r.reply_bytes != static_cast<std::uint64_t>(out.value.meta_bytes) ||
      r.reply_offset > g.slice_bytes || g.slice_bytes - r.reply_offset < r.reply_bytes)
    return refuse<reply_layout>(refusal::out_of_range, "reply past the slice");
  for (std::size_t c = 0; c < step_bytes.size(); ++c) {
    const auto bytes = static_cast<std::uint64_t>(r.rows * r.win.length * step_bytes[c]);
    const std::uint64_t a = r.column_address[c];
    if (a < r.batch_address || a - r.batch_address > r.batch_bytes ||
        r.batch_bytes - (a - r.batch_address) < bytes)
      return refuse<reply_layout>(refusal::out_of_range,
                                  "column " + std::to_string(c) + " past the batch");
  }
  return out;
}

}  // namespace gear::detail::remote
