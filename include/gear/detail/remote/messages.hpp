#pragma once
// The control messages of the remote transport (frames, frame.hpp): the handshake (hello,
// welcome), a shard's status, a learner's sample request, priority updates and insert ACKs. Each
// has an encoder and a parser; a parser checks every field against the limits this side holds
// (never against what the peer claims) and refuses the message otherwise.
//
//   hello           client -> shard   role, fingerprints, token proof, ring blocks wanted; a
//                                     learner's slice; the client's inlet for this shard (where
//                                     the shard writes and sends)
//   welcome         shard -> client   the client's index, the shard's incarnation, its ring and
//                                     the intake endpoint to write it through
//   status_request  learner -> shard  (empty)
//   status          shard -> learner  size, selection mass, max priority, counters
//   sample_request  learner -> shard  k rows of a window, the random stream, where to write
//                                     (several samples' may come in one bundle: frame.hpp)
//   update          learner -> shard  (ticket, incarnation, priority) per key, the max priority
//   erase           learner -> shard  the same body: remove the trajectories named
//   update_result   shard -> learner  pairs applied (or removed) and skipped as stale
//   ack             shard -> actor    an insert entry's blocks are free again, and its key

#include <cmath>
#include <cstdint>
#include <gear/detail/remote/frame.hpp>
#include <gear/key.hpp>
#include <gear/window.hpp>
#include <string>
#include <vector>

namespace gear::detail::remote {

/// What this side allows a peer's message to ask for.
struct message_limits {
  std::uint32_t max_message = default_max_message;
  std::int64_t capacity = 0;         ///< the shard's slots
  std::int64_t max_length = 0;       ///< the buffer's max_length
  std::int64_t max_batch = 1 << 20;  ///< rows one sample request may ask of a shard
  std::uint32_t max_ring_blocks = 1 << 16;
};

/// A finite, non-negative double (a selection mass, a priority).
inline bool non_negative(double v) noexcept { return std::isfinite(v) && v >= 0; }

// ---- handshake ---------------------------------------------------------------------------------

enum class peer_role : std::uint8_t { actor = 1, learner = 2, shard = 3 };
inline constexpr std::size_t token_proof_bytes = 32;
inline constexpr std::size_t max_hostname = 255;
inline constexpr std::size_t max_mr_key = 64;
inline constexpr std::size_t max_hello_address = 512;

struct hello {
  peer_role role = peer_role::actor;
  std::uint64_t spec_fingerprint = 0;
  std::uint64_t selection_fingerprint = 0;
  std::uint32_t pid = 0;
  std::string hostname;
  std::array<std::uint8_t, token_proof_bytes> token_proof{};
  std::uint32_t ring_blocks = 0;  ///< staging blocks an actor asks for (0 for a learner)
  std::uint32_t max_message = default_max_message;
  std::vector<std::uint8_t> address;  ///< the client's fabric address, to answer it
  // A learner's slice for this shard's sample replies (none for an actor): where it starts as
  // the provider addresses it, its memory key and its size; and the largest share it will ask
  // for (rows, window steps), which sizes the shard's staging for its replies.
  std::uint64_t slice_address = 0;
  std::vector<std::uint8_t> slice_key;
  std::uint64_t slice_bytes = 0;
  std::int64_t max_rows = 0, max_window = 0;
  /// The client's inlet for this shard: where the shard writes and sends (empty: `address`).
  std::vector<std::uint8_t> reply_address;
};

inline std::vector<std::byte> encode(const hello& m) {
  wire_writer w = start_frame(message_type::hello);
  w.put(static_cast<std::uint8_t>(m.role));
  w.put(m.spec_fingerprint);
  w.put(m.selection_fingerprint);
  w.put(m.pid);
  w.put_string(m.hostname);
  w.put_bytes(m.token_proof);
  w.put(m.ring_blocks);
  w.put(m.max_message);
  w.put_counted(m.address);
  w.put(m.slice_address);
  w.put_counted(m.slice_key);
  w.put(m.slice_bytes);
  w.put(m.max_rows);
  w.put(m.max_window);
  w.put_counted(m.reply_address);
  return finish_frame(std::move(w));
}

inline decoded<hello> parse_hello(std::span<const std::byte> bytes, const message_limits& lim) {
  return parse_frame<hello>(
      bytes, message_type::hello, lim.max_message,
      [&](wire_reader& r, hello& m, std::string& what) {
        std::uint8_t role = 0;
        if (!read_all(r, role, m.spec_fingerprint, m.selection_fingerprint, m.pid) ||
            !r.get_string(m.hostname, max_hostname))
          return what = "hello fields", refusal::none;
        if (!r.get_into(m.token_proof)) return refusal::none;
        std::uint16_t address_bytes = 0;
        if (!read_all(r, m.ring_blocks, m.max_message, address_bytes)) return refusal::none;
        if (address_bytes == 0 || address_bytes > max_hello_address)
          return what = "address length", refusal::out_of_range;
        m.address.resize(address_bytes);
        if (!r.get_into(m.address)) return refusal::none;
        std::uint16_t key_bytes = 0;
        if (!read_all(r, m.slice_address, key_bytes)) return refusal::none;
        if (key_bytes > max_mr_key) return what = "slice key length", refusal::out_of_range;
        m.slice_key.resize(key_bytes);
        if (!r.get_into(m.slice_key)) return refusal::none;
        if (!read_all(r, m.slice_bytes, m.max_rows, m.max_window)) return refusal::none;
        std::uint16_t reply_bytes = 0;
        if (!read_all(r, reply_bytes)) return refusal::none;
        if (reply_bytes > max_hello_address)
          return what = "reply address length", refusal::out_of_range;
        m.reply_address.resize(reply_bytes);
        if (!r.get_into(m.reply_address)) return refusal::none;
        m.role = static_cast<peer_role>(role);
        if (role < 1 || role > 3) return what = "role", refusal::out_of_range;
        if (m.ring_blocks > lim.max_ring_blocks) return what = "ring_blocks", refusal::out_of_range;
        if (m.max_message < 4096) return what = "max_message", refusal::out_of_range;
        if (m.max_rows < 0 || m.max_window < 0 || m.max_rows > lim.max_batch ||
            m.max_window > std::int64_t{1} << 32 ||
            m.max_rows * m.max_window > std::int64_t{1} << 32)
          return what = "max_rows or max_window", refusal::out_of_range;
        return refusal::none;
      });
}

struct welcome {
  std::uint32_t peer_index = 0;        ///< the client's number at this shard
  std::uint32_t incarnation = 0;       ///< the shard's (never 0)
  std::uint64_t ring_address = 0;      ///< where the client's staging ring starts, as the provider
                                       ///< addresses it (a virtual address or an offset)
  std::vector<std::uint8_t> ring_key;  ///< the ring's memory key (at most max_mr_key bytes)
  std::uint32_t block_bytes = 0;       ///< a power of two in [4 KiB, 16 MiB]
  std::uint32_t ring_blocks = 0;
  std::uint32_t max_message = default_max_message;
  std::vector<std::uint8_t> intake;  ///< an actor's: the address of the shard's endpoint its ring
                                     ///< is on, to write its entries to (empty: the shard's own)
};

inline std::vector<std::byte> encode(const welcome& m) {
  wire_writer w = start_frame(message_type::welcome);
  w.put(m.peer_index);
  w.put(m.incarnation);
  w.put(m.ring_address);
  w.put_counted(m.ring_key);
  w.put(m.block_bytes);
  w.put(m.ring_blocks);
  w.put(m.max_message);
  w.put_counted(m.intake);
  return finish_frame(std::move(w));
}

inline decoded<welcome> parse_welcome(std::span<const std::byte> bytes, const message_limits& lim) {
  return parse_frame<welcome>(
      bytes, message_type::welcome, lim.max_message,
      [&](wire_reader& r, welcome& m, std::string& what) {
        std::uint16_t key_bytes = 0;
        if (!read_all(r, m.peer_index, m.incarnation, m.ring_address, key_bytes))
          return refusal::none;
        if (key_bytes > max_mr_key) return what = "ring key length", refusal::out_of_range;
        m.ring_key.resize(key_bytes);
        if (!r.get_into(m.ring_key)) return refusal::none;
        std::uint16_t intake_bytes = 0;
        if (!read_all(r, m.block_bytes, m.ring_blocks, m.max_message, intake_bytes))
          return refusal::none;
        if (intake_bytes > max_hello_address) return what = "intake length", refusal::out_of_range;
        m.intake.resize(intake_bytes);
        if (!r.get_into(m.intake)) return refusal::none;
        if (m.incarnation == 0) return what = "incarnation", refusal::out_of_range;
        if (m.block_bytes < 4096 || m.block_bytes > (16u << 20) ||
            (m.block_bytes & (m.block_bytes - 1)) != 0)
          return what = "block_bytes", refusal::out_of_range;
        if (m.ring_blocks > lim.max_ring_blocks) return what = "ring_blocks", refusal::out_of_range;
        if (m.max_message < 4096) return what = "max_message", refusal::out_of_range;
        return refusal::none;
      });
}

// ---- status ------------------------------------------------------------------------------------

inline std::vector<std::byte> encode_status_request() {
  return finish_frame(start_frame(message_type::status_request));
}
inline decoded<bool> parse_status_request(std::span<const std::byte> bytes,
                                          const message_limits& lim) {
  return parse_frame<bool>(bytes, message_type::status_request, lim.max_message,
                           [](wire_reader&, bool& m, std::string&) {
                             m = true;
                             return refusal::none;
                           });
}

struct status {
  std::uint32_t incarnation = 0;
  std::int64_t size = 0;  ///< committed trajectories
  double mass = 0;        ///< selection mass: sum p^alpha (prioritized), size (uniform)
  double max_priority = 0;
  std::uint64_t inserted = 0, sampled = 0, refused = 0;
};

inline std::vector<std::byte> encode(const status& m) {
  wire_writer w = start_frame(message_type::status);
  w.put(m.incarnation);
  w.put(m.size);
  w.put(m.mass);
  w.put(m.max_priority);
  w.put(m.inserted);
  w.put(m.sampled);
  w.put(m.refused);
  return finish_frame(std::move(w));
}

inline decoded<status> parse_status(std::span<const std::byte> bytes, const message_limits& lim) {
  return parse_frame<status>(bytes, message_type::status, lim.max_message,
                             [&](wire_reader& r, status& m, std::string& what) {
                               if (!read_all(r, m.incarnation, m.size, m.mass, m.max_priority,
                                             m.inserted, m.sampled, m.refused))
                                 return refusal::none;
                               if (m.incarnation == 0)
                                 return what = "incarnation", refusal::out_of_range;
                               if (m.size < 0 || m.size > lim.capacity)
                                 return what = "size", refusal::out_of_range;
                               if (!non_negative(m.mass))
                                 return what = "mass", refusal::out_of_range;
                               if (!non_negative(m.max_priority))
                                 return what = "max_priority", refusal::out_of_range;
                               return refusal::none;
                             });
}

// ---- sample request ----------------------------------------------------------------------------

struct sample_request {
  std::uint32_t request = 0;
  std::uint32_t incarnation = 0;  ///< the shard's, as the learner knows it
  std::int64_t rows = 0;          ///< k_s: rows this shard selects and gathers
  window win{};
  std::uint64_t seed = 0, call = 0;  ///< the random stream (gear::rng_draw) for this share
  double mass_used = 0;              ///< the shard's mass in the learner's snapshot
  std::uint64_t reply_offset = 0;    ///< where in the learner's slice the reply's meta part goes
  std::uint64_t reply_bytes = 0;     ///< and its size (the layout's meta_bytes, checked)
  /// The learner's batch, registered for this request: where it starts as the provider addresses
  /// it, its key and size; and where this share's rows of each column start in it.
  std::uint64_t batch_address = 0, batch_key = 0, batch_bytes = 0;
  std::vector<std::uint64_t> column_address;
};

/// Columns a sample request may name (gear::max_columns).
inline constexpr std::size_t max_request_columns = 16;

/// (In `reuse`'s storage: a learner encodes one for every sample.)
inline std::vector<std::byte> encode(const sample_request& m, std::vector<std::byte>&& reuse = {}) {
  wire_writer w = start_frame(message_type::sample_request, 0, std::move(reuse));
  w.put(m.request);
  w.put(m.incarnation);
  w.put(m.rows);
  w.put(m.win.length);
  w.put(m.win.offset);
  w.put(static_cast<std::uint8_t>(m.win.from));
  w.put(static_cast<std::uint8_t>(m.win.padding));
  w.put(m.seed);
  w.put(m.call);
  w.put(m.mass_used);
  w.put(m.reply_offset);
  w.put(m.reply_bytes);
  w.put(m.batch_address);
  w.put(m.batch_key);
  w.put(m.batch_bytes);
  w.put(static_cast<std::uint16_t>(m.column_address.size()));
  for (const std::uint64_t a : m.column_address) w.put(a);
  return finish_frame(std::move(w));
}

inline decoded<sample_request> parse_sample_request(std::span<const std::byte> bytes,
                                                    const message_limits& lim) {
  return parse_frame<sample_request>(
      bytes, message_type::sample_request, lim.max_message,
      [&](wire_reader& r, sample_request& m, std::string& what) {
        std::uint8_t from = 0, padding = 0;
        if (!read_all(r, m.request, m.incarnation, m.rows, m.win.length, m.win.offset, from,
                      padding, m.seed, m.call, m.mass_used, m.reply_offset, m.reply_bytes,
                      m.batch_address, m.batch_key, m.batch_bytes))
          return refusal::none;
        std::uint16_t columns = 0;
        if (!r.get(columns)) return refusal::none;
        if (columns > max_request_columns) return what = "columns", refusal::out_of_range;
        m.column_address.resize(columns);
        for (std::uint64_t& a : m.column_address)
          if (!r.get(a)) return refusal::none;
        m.win.from = static_cast<anchor>(from);
        m.win.padding = static_cast<pad>(padding);
        if (m.rows < 1 || m.rows > lim.max_batch) return what = "rows", refusal::out_of_range;
        if (m.win.length < 1 || m.win.length > lim.max_length)
          return what = "window length", refusal::out_of_range;
        if (m.win.offset < 0 || m.win.offset >= lim.max_length)
          return what = "window offset", refusal::out_of_range;
        if (from > static_cast<std::uint8_t>(anchor::random))
          return what = "window anchor", refusal::out_of_range;
        if (padding > static_cast<std::uint8_t>(pad::head))
          return what = "window padding", refusal::out_of_range;
        if (!non_negative(m.mass_used)) return what = "mass_used", refusal::out_of_range;
        return refusal::none;
      });
}

// ---- priority updates --------------------------------------------------------------------------

struct update_entry {
  std::uint64_t ticket = 0;
  std::uint32_t incarnation = 0;
  float priority = 0;
};
inline constexpr std::size_t update_entry_bytes = 16;

struct update {
  double max_priority = 0;  ///< the learner's running maximum, so that shards converge
  std::vector<update_entry> entries;
  bool erase = false;  ///< sent as message_type::erase: remove the entries' trajectories
};

/// Entries one update message of `max_message` bytes holds.
constexpr std::size_t update_capacity(std::uint32_t max_message) noexcept {
  constexpr std::size_t fixed = frame_header_bytes + 8 + 4;
  return max_message > fixed ? (max_message - fixed) / update_entry_bytes : 0;
}

inline std::vector<std::byte> encode(const update& m) {
  wire_writer w = start_frame(m.erase ? message_type::erase : message_type::update);
  w.put(m.max_priority);
  w.put(static_cast<std::uint32_t>(m.entries.size()));
  for (const update_entry& e : m.entries) {
    w.put(e.ticket);
    w.put(e.incarnation);
    w.put(e.priority);
  }
  return finish_frame(std::move(w));
}

/// Refuses the whole message for a NaN, negative or infinite priority (a bug on the sender's
/// side, not a race); stale tickets are the receiver's to skip and count.
/// Parses an update or an erase (update::erase says which; any other type is refused).
inline decoded<update> parse_update(std::span<const std::byte> bytes, const message_limits& lim) {
  const auto type = frame_type(bytes, lim.max_message);
  const bool erase = type && type.value.type == message_type::erase;
  return parse_frame<update>(bytes, erase ? message_type::erase : message_type::update,
                             lim.max_message, [&](wire_reader& r, update& m, std::string& what) {
                               m.erase = erase;
                               std::uint32_t count = 0;
                               if (!read_all(r, m.max_priority, count)) return refusal::none;
                               if (!non_negative(m.max_priority))
                                 return what = "max_priority", refusal::out_of_range;
                               what = "entry count " + std::to_string(count);
                               if (count > update_capacity(lim.max_message))
                                 return refusal::out_of_range;
                               if (std::size_t{count} * update_entry_bytes > r.remaining())
                                 return refusal::truncated;
                               if (std::size_t{count} * update_entry_bytes < r.remaining())
                                 return refusal::trailing;
                               what.clear();
                               m.entries.resize(count);
                               for (std::uint32_t i = 0; i < count; ++i) {
                                 update_entry& e = m.entries[i];
                                 if (!read_all(r, e.ticket, e.incarnation, e.priority))
                                   return refusal::none;
                                 if (!non_negative(e.priority))
                                   return what = "priority of entry " + std::to_string(i),
                                          refusal::out_of_range;
                               }
                               return refusal::none;
                             });
}

/// A shard's answer to an update: pairs applied, and pairs skipped as stale (an evicted or
/// removed trajectory, or an older incarnation's key).
struct update_result {
  std::uint32_t incarnation = 0;
  std::int64_t applied = 0, stale = 0;
};

inline std::vector<std::byte> encode(const update_result& m) {
  wire_writer w = start_frame(message_type::update_result);
  w.put(m.incarnation);
  w.put(m.applied);
  w.put(m.stale);
  return finish_frame(std::move(w));
}

inline decoded<update_result> parse_update_result(std::span<const std::byte> bytes,
                                                  const message_limits& lim) {
  return parse_frame<update_result>(
      bytes, message_type::update_result, lim.max_message,
      [&](wire_reader& r, update_result& m, std::string& what) {
        if (!read_all(r, m.incarnation, m.applied, m.stale)) return refusal::none;
        if (m.applied < 0 || m.stale < 0 ||
            m.applied + m.stale > static_cast<std::int64_t>(update_capacity(lim.max_message)))
          return what = "counts", refusal::out_of_range;
        return refusal::none;
      });
}

// ---- insert acknowledgements -------------------------------------------------------------------

struct ack {
  std::uint32_t first_block = 0, blocks = 0;  ///< the entry's blocks, free again
  std::uint64_t sequence = 0;                 ///< the entry's sequence number
  key stored{};                               ///< the inserted trajectory's key
};

inline std::vector<std::byte> encode(const ack& m) {
  wire_writer w = start_frame(message_type::ack);
  w.put(m.first_block);
  w.put(m.blocks);
  w.put(m.sequence);
  w.put(m.stored.ticket);
  w.put(m.stored.shard);
  w.put(m.stored.incarnation);
  return finish_frame(std::move(w));
}

/// `ring_blocks`: the actor's ring at that shard, which the ACK's blocks must lie in.
inline decoded<ack> parse_ack(std::span<const std::byte> bytes, const message_limits& lim,
                              std::uint32_t ring_blocks) {
  return parse_frame<ack>(
      bytes, message_type::ack, lim.max_message, [&](wire_reader& r, ack& m, std::string& what) {
        if (!read_all(r, m.first_block, m.blocks, m.sequence, m.stored.ticket, m.stored.shard,
                      m.stored.incarnation))
          return refusal::none;
        if (m.blocks < 1 || m.first_block >= ring_blocks || m.blocks > ring_blocks - m.first_block)
          return what = "blocks", refusal::out_of_range;
        if (m.stored.incarnation == 0) return what = "key incarnation", refusal::out_of_range;
        return refusal::none;
      });
}

}  // namespace gear::detail::remote
