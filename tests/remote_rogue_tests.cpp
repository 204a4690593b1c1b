// Bad input from the wire, against a real shard_server over loopback (tcp;ofi_rxm, shm): a rogue
// peer on a raw endpoint sends a hello proving another token, a truncated hello, bytes that are
// no frame, a frame claiming more
// body than it has, a hello with another spec's fingerprint, one whose fabric address is too
// short for the provider, one with a role out of range, a
// message from a sender the shard never welcomed, and, once welcomed, a sample request for 0 rows,
// one whose reply would not fit its slice, one with a column past the batch it grants, one with a
// column missing, one for more rows than its hello said, a bundle holding another sender's frame
// (refused whole), a bundle of a bad request and a good one (the bad refused, the good served),
// and an insert entry published for a block outside its ring. The shard refuses each and counts it
// by reason, and then still answers a valid status request and welcomes a valid actor.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <gear/detail/remote/hmac.hpp>
#include <gear/gear.hpp>
#include <gear/transport/remote_actor.hpp>
#include <gear/transport/shard_server.hpp>
#include <optional>
#include <vector>

#include "process_common.hpp"

using namespace process_test;
namespace remote = gear::detail::remote;
namespace fabric = gear::transport::fabric;

namespace {

using spec = gear::spec<gear::column<"obs", float, 4>>;
using buffer = gear::replay_buffer<spec, gear::storage::host>;

/// The shard: serves until told, then reports its refusal counts on the socket.
int run_shard(int fd, const gear::transport::libfabric_config& config) {
  buffer buf{gear::capacity{16}, gear::max_length{4}};
  std::vector<float> obs(8, 1.0f);
  const std::int64_t lengths[] = {2};
  gear::key k{};
  buf.insert({lengths, {gear::input(obs.data(), {4})}}, std::span(&k, 1));
  gear::transport::shard_server<buffer>::options o;
  o.fabric = config;
  gear::transport::shard_server<buffer> server(buf, o);
  if (!send_frame(fd, server.address())) return 10;
  char byte = 0;
  if (read(fd, &byte, 1) != 1) return 11;
  server.stop();
  const auto s = server.stats();
  std::vector<std::byte> counts(sizeof(s.refused.by_reason));
  std::memcpy(counts.data(), s.refused.by_reason.data(), counts.size());
  return send_frame(fd, counts) ? 0 : 12;
}

/// A raw endpoint talking to the shard: what both rogues share.
struct raw_peer {
  fabric::endpoint ep;
  fi_addr_t shard;
  fabric::host_region inbox{1 << 20};
  fabric::region inbox_r;
  fabric::outbox out;
  std::vector<std::vector<std::byte>> received;

  raw_peer(const gear::transport::libfabric_config& config, const remote::address_blob& blob)
      : ep(config),
        shard(ep.insert_peer(blob.address)),
        inbox_r(ep.register_memory(inbox.data(), inbox.size(), FI_RECV)),
        out(ep, 16, remote::default_max_message) {
    ep.receive_into(inbox_r, remote::default_max_message);
  }
  std::size_t poll() {
    return ep.poll([&](const fabric::completion& c) {
      std::vector<std::span<const std::byte>> frames;  // a bundle's (the shard's acks)
      if (c.what == fabric::completion::kind::received &&
          remote::split_bundle(c.message, remote::default_max_message, remote::message_type::ack,
                               frames))
        for (const auto f : frames) received.emplace_back(f.begin(), f.end());
      else if (c.what == fabric::completion::kind::received)
        received.emplace_back(c.message.begin(), c.message.end());
      (void)out.completed(c.context);
    });
  }
  bool send(std::span<const std::byte> m) {
    return out.send(ep, m, shard, clock_type::now() + std::chrono::seconds(10),
                    [&] { (void)poll(); });
  }
  /// The next message of `type` (taken out of `received`), or none within 10 s.
  std::vector<std::byte> wait_for(remote::message_type type) {
    const auto until = clock_type::now() + std::chrono::seconds(10);
    while (clock_type::now() < until) {
      for (auto it = received.begin(); it != received.end(); ++it) {
        const auto info = remote::frame_type(*it, remote::default_max_message);
        if (info && info.value.type == type) {
          auto m = std::move(*it);
          received.erase(it);
          return m;
        }
      }
      if (poll() == 0) std::this_thread::yield();
    }
    return {};
  }
};

/// The rogue: a raw endpoint that sends what a real client never would.
int run_rogue(int fd, const gear::transport::libfabric_config& config) {
  const auto blob = remote::parse_blob(receive_frame(fd));
  if (!blob) return 20;
  raw_peer peer(config, blob.value);
  fabric::endpoint& ep = peer.ep;
  fabric::host_region slice(1 << 16);
  fabric::region slice_r = ep.register_memory(slice.data(), slice.size(), FI_REMOTE_WRITE);
  fabric::host_region batch(1 << 16);  // where the columns of its one valid request go
  fabric::region batch_r = ep.register_memory(batch.data(), batch.size(), FI_REMOTE_WRITE);
  auto send = [&](std::span<const std::byte> m) { return peer.send(m); };
  auto wait_for = [&](remote::message_type type) { return peer.wait_for(type); };
  remote::hello h;
  h.role = remote::peer_role::learner;
  h.spec_fingerprint = blob.value.spec_fingerprint;
  h.selection_fingerprint = blob.value.selection_fingerprint;
  h.hostname = "rogue";
  h.address = ep.name();
  h.slice_address = slice_r.remote_address;
  h.slice_key.resize(8);
  std::memcpy(h.slice_key.data(), &slice_r.key, 8);
  h.slice_bytes = slice.size();
  h.max_rows = 4;
  h.max_window = 4;
  h.token_proof =
      remote::token_proof("", blob.value.nonce, static_cast<std::uint8_t>(h.role), h.pid);
  const auto good_hello = remote::encode(h);
  auto wrong_token = h;  // another job's token
  wrong_token.token_proof = remote::token_proof("other", blob.value.nonce, 2, h.pid);
  if (!send(remote::encode(wrong_token))) return 37;
  // 1. truncated, 2. no frame at all, 3. a body shorter than its header says
  if (!send(std::span(good_hello).first(good_hello.size() - 5))) return 22;
  const std::vector<std::byte> junk(100, std::byte{0x5a});
  if (!send(junk)) return 23;
  auto short_body = good_hello;
  short_body.resize(short_body.size() - 1);
  std::uint32_t claimed = static_cast<std::uint32_t>(good_hello.size());
  std::memcpy(short_body.data() + 8, &claimed, 4);
  if (!send(short_body)) return 24;
  // 4. another spec's fingerprint, 5. a role out of range, 6. a sender never welcomed
  auto other = h;
  other.spec_fingerprint ^= 1;
  if (!send(remote::encode(other))) return 25;
  auto short_address = h;  // fi_av_insert would read past it
  short_address.address = {0x7f};
  if (!send(remote::encode(short_address))) return 36;
  auto short_inlet = h;  // the same, for the inlet its replies would go to
  short_inlet.reply_address = {0x7f};
  if (!send(remote::encode(short_inlet))) return 42;
  auto bad_role = remote::encode(h);
  bad_role[remote::frame_header_bytes] = std::byte{9};
  if (!send(bad_role)) return 26;
  auto stranger = remote::encode_status_request();
  remote::stamp_sender(stranger, 77);
  if (!send(stranger)) return 27;
  // Welcomed properly, then: 7. a sample of 0 rows, 8. a reply that would not fit the slice,
  // 9. a column past the batch it grants, 10. a column missing, 11. more rows than its hello.
  if (!send(good_hello)) return 28;
  const auto w = remote::parse_welcome(wait_for(remote::message_type::welcome), {});
  if (!w) return 29;
  remote::sample_request r;
  r.incarnation = blob.value.incarnation;
  r.rows = 1;
  r.win.length = 2;
  r.reply_bytes =
      static_cast<std::uint64_t>(remote::layout_reply(spec::step_bytes, 1, 2).meta_bytes);
  r.batch_address = batch_r.remote_address;
  r.batch_key = batch_r.key;
  r.batch_bytes = batch.size();
  for (std::size_t c = 0; c < spec::num_columns; ++c)  // each column's row apart
    r.column_address.push_back(batch_r.remote_address + c * 4096);
  auto zero_rows = r;
  zero_rows.rows = 0;
  auto bytes = remote::encode(zero_rows);
  remote::stamp_sender(bytes, w.value.peer_index);
  if (!send(bytes)) return 30;
  auto too_far = r;
  too_far.reply_offset = slice.size() - 8;
  bytes = remote::encode(too_far);
  remote::stamp_sender(bytes, w.value.peer_index);
  if (!send(bytes)) return 31;
  auto past_batch = r;
  past_batch.column_address.back() = r.batch_address + r.batch_bytes - 1;
  bytes = remote::encode(past_batch);
  remote::stamp_sender(bytes, w.value.peer_index);
  if (!send(bytes)) return 38;
  auto missing = r;
  missing.column_address.pop_back();
  bytes = remote::encode(missing);
  remote::stamp_sender(bytes, w.value.peer_index);
  if (!send(bytes)) return 39;
  auto too_many = r;
  too_many.rows = 5;
  bytes = remote::encode(too_many);
  remote::stamp_sender(bytes, w.value.peer_index);
  if (!send(bytes)) return 40;
  // 12. a bundle holding a frame of another sender: refused whole. 13. a bundle of a request
  // for 0 rows and a valid one: each taken as if it came alone, the first refused, the valid
  // one still served (its columns in the batch), and so is a status request.
  const auto bundle_of = [&](std::uint32_t second_sender) {
    std::vector<std::byte> b, frame = remote::encode(zero_rows);
    remote::start_bundle(b);
    remote::stamp_sender(frame, w.value.peer_index);
    remote::add_to_bundle(b, frame);
    frame = remote::encode(r);
    remote::stamp_sender(frame, second_sender);
    remote::add_to_bundle(b, frame);
    remote::finish_bundle(b, w.value.peer_index);
    return b;
  };
  if (!send(bundle_of(w.value.peer_index + 1))) return 41;
  if (!send(bundle_of(w.value.peer_index))) return 32;
  bytes = remote::encode_status_request();
  remote::stamp_sender(bytes, w.value.peer_index);
  if (!send(bytes)) return 33;
  const auto st = remote::parse_status(wait_for(remote::message_type::status), {.capacity = 16});
  if (!st || st.value.size != 1) return 34;
  // The valid reply: its meta part in the slice, its one row's column (2 steps of 4 ones) in the
  // batch.
  const auto until = clock_type::now() + std::chrono::seconds(10);
  const auto column_in = [&] {
    std::array<float, 8> row{};
    std::memcpy(row.data(), batch.data(), sizeof row);
    return std::all_of(row.begin(), row.end(), [](float x) { return x == 1.0f; });
  };
  while (remote::check_reply({slice.data(), static_cast<std::size_t>(r.reply_bytes)}, 0,
                             blob.value.incarnation, 1, 2, spec::step_bytes)
                 .why != remote::refusal::none ||
         !column_in()) {
    if (clock_type::now() > until) return 35;
    (void)peer.poll();
  }
  return 0;
}

/// A rogue actor: welcomed properly, then writes into its ring entries a real actor never would:
/// another actor's id, a sequence already used, one far past what its ring holds, a length past
/// max_length, a completion naming a block outside its ring, and one publishing in another
/// actor's name (through this actor's intake); two valid entries between them are stored and
/// acknowledged.
int run_rogue_actor(int fd, const gear::transport::libfabric_config& config) {
  const auto blob = remote::parse_blob(receive_frame(fd));
  if (!blob) return 60;
  raw_peer peer(config, blob.value);
  fabric::endpoint& ep = peer.ep;
  remote::hello h;
  h.role = remote::peer_role::actor;
  h.spec_fingerprint = blob.value.spec_fingerprint;
  h.selection_fingerprint = blob.value.selection_fingerprint;
  h.ring_blocks = 8;
  h.address = ep.name();
  h.token_proof = remote::token_proof("", blob.value.nonce, 1, h.pid);
  if (!peer.send(remote::encode(h))) return 62;
  const auto w = remote::parse_welcome(peer.wait_for(remote::message_type::welcome), {});
  if (!w || w.value.ring_blocks != 8 || w.value.ring_key.size() != 8) return 63;
  std::uint64_t key = 0;
  std::memcpy(&key, w.value.ring_key.data(), 8);
  const std::size_t block = w.value.block_bytes;
  fabric::host_region source(8 * block);
  fabric::region source_r = ep.register_memory(source.data(), source.size(), FI_WRITE);
  std::vector<float> obs(4 * 8, 2.5f);
  const std::span<const std::byte> columns[] = {std::as_bytes(std::span(obs))};
  int context = 0;
  if (!w.value.intake.empty() && !ep.fits_address(w.value.intake)) return 65;
  if (w.value.intake.empty() == gear::transport::intake_per_actor(config.provider)) return 66;
  const fi_addr_t intake =  // where this actor's ring is: an endpoint of its own on shm
      w.value.intake.empty() ? peer.shard : ep.insert_peer(w.value.intake);
  // Writes an entry at `at` (its header as given), published for block `named` in the name of
  // actor `as` (this one's by default).
  auto write_entry = [&](std::uint32_t at, remote::entry_header e, std::uint32_t named,
                         std::uint32_t as = 0) {
    std::vector<std::byte> packed;
    e.first_block = at;
    remote::pack_entry(e, columns, spec::step_bytes, static_cast<std::int64_t>(block), packed);
    std::memcpy(source.data() + at * block, packed.data(), packed.size());
    const remote::cq_data data{remote::write_kind::insert_entry, as != 0 ? as : w.value.peer_index,
                               named};
    while (!ep.try_writedata(source_r, at * block, packed.size(), intake,
                             w.value.ring_address + at * block, key, data.encode(), &context))
      if (peer.poll() == 0) std::this_thread::yield();
  };
  remote::entry_header e;
  e.actor = w.value.peer_index;
  e.length = 2;
  auto forged = e;
  forged.actor += 1;
  write_entry(0, forged, 0);  // another actor's id: mismatch
  e.sequence = 0;
  write_entry(1, e, 1);  // valid: stored
  write_entry(2, e, 2);  // sequence 0 again: mismatch
  auto far = e;
  far.sequence = 100;
  write_entry(3, far, 3);  // past what the ring holds: mismatch
  auto too_long = e;
  too_long.sequence = 1;
  too_long.length = 5;
  write_entry(4, too_long, 4);  // past max_length: out of range
  e.sequence = 1;
  write_entry(5, e, 99);                         // a block outside the ring: out of range
  write_entry(7, e, 7, w.value.peer_index + 1);  // published as another actor: mismatch
  write_entry(6, e, 6);                          // valid: stored
  int acks = 0;
  for (int i = 0; i < 2; ++i) {
    const auto a = remote::parse_ack(peer.wait_for(remote::message_type::ack), {}, 8);
    acks += a && a.value.stored.ticket != gear::no_ticket;
  }
  return acks == 2 ? 0 : 64;
}

template <class Role>
remote::refusal_counts rogue_run(const char* provider, Role role) {
  gear::transport::libfabric_config config;
  config.provider = provider;
  const auto until = clock_type::now() + std::chrono::seconds(40);
  int shard_fd[2], rogue_fd[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, shard_fd) == 0);
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, rogue_fd) == 0);
  const pid_t shard =
      spawn([&](int fd) { return run_shard(fd, config); }, shard_fd[0], shard_fd[1], false);
  close(shard_fd[0]);
  const auto blob = receive_frame(shard_fd[1]);
  const pid_t peer =
      spawn([&](int fd) { return role(fd, config); }, rogue_fd[0], rogue_fd[1], false);
  close(rogue_fd[0]);
  (void)send_frame(rogue_fd[1], blob);
  const int rogue_rc = reap(peer, until);
  (void)write(shard_fd[1], "q", 1);
  const auto counts_bytes = receive_frame(shard_fd[1]);
  const int shard_rc = reap(shard, until);
  MESSAGE(std::string(provider) << ": rogue exit " << rogue_rc << ", shard exit " << shard_rc);
  CHECK(rogue_rc == 0);
  CHECK(shard_rc == 0);
  REQUIRE(counts_bytes.size() == sizeof(remote::refusal_counts::by_reason));
  remote::refusal_counts counts;
  std::memcpy(counts.by_reason.data(), counts_bytes.data(), counts_bytes.size());
  CHECK(shm_leftovers(shard) == 0);
  CHECK(shm_leftovers(peer) == 0);
  close(shard_fd[1]);
  close(rogue_fd[1]);
  return counts;
}

void rogue(const char* provider) {
  const auto counts = rogue_run(provider, run_rogue);
  CHECK(counts[remote::refusal::truncated] == 2);     // the truncated hello, the short body
  CHECK(counts[remote::refusal::bad_magic] == 1);     // no frame
  CHECK(counts[remote::refusal::mismatch] == 5);      // a token; another spec; a stranger; a
                                                      // column; a bundle with another sender's
                                                      // frame
  CHECK(counts[remote::refusal::out_of_range] == 8);  // an address; an inlet; a role; 0 rows; the
                                                      // slice; the batch; rows past the hello's;
                                                      // 0 rows in a bundle
  CHECK(counts.total() == 16);
}

void rogue_actor(const char* provider) {
  const auto counts = rogue_run(provider, run_rogue_actor);
  CHECK(counts[remote::refusal::mismatch] == 4);      // an id; a used sequence; one too far; a name
  CHECK(counts[remote::refusal::out_of_range] == 2);  // a length; a block outside the ring
  CHECK(counts.total() == 6);
}

}  // namespace

TEST_CASE("tcp;ofi_rxm: bad input from the wire is refused and counted; the shard serves on") {
  rogue("tcp;ofi_rxm");
}
TEST_CASE("shm: bad input from the wire is refused and counted; the shard serves on") {
  rogue("shm");
}
TEST_CASE("tcp;ofi_rxm: forged, replayed and out-of-range insert entries are refused") {
  rogue_actor("tcp;ofi_rxm");
}
TEST_CASE("shm: forged, replayed and out-of-range insert entries are refused") {
  rogue_actor("shm");
}

TEST_CASE("a learner's next request waits for a free reply slot, and never over a range in use") {
  using gear::transport::reply_state;
  gear::transport::shard_peer p;
  p.slots = 2;
  const auto request = [](std::uint64_t offset, std::uint64_t bytes) {
    gear::detail::remote::sample_request r;
    r.reply_offset = offset;
    r.reply_bytes = bytes;
    return r;
  };
  CHECK(!p.slot_for_next());  // nothing deferred
  p.deferred.push_back({request(0, 100), {}});
  CHECK(p.slot_for_next() == 0u);
  (*p.writes)[0].request = request(0, 100);
  (*p.writes)[0].state = reply_state::writing;
  CHECK(!p.slot_for_next());  // its area is still being written
  p.deferred.front().request = request(100, 100);
  CHECK(p.slot_for_next() == 1u);  // beside it: the free slot
  (*p.writes)[1].request = request(100, 100);
  (*p.writes)[1].state = reply_state::packed;
  p.deferred.front().request = request(200, 100);
  CHECK(!p.slot_for_next());                 // no slot free
  (*p.writes)[2].state = reply_state::idle;  // beyond `slots`: not this learner's
  CHECK(!p.slot_for_next());
  (*p.writes)[0].state = reply_state::idle;
  CHECK(p.slot_for_next() == 0u);
  p.deferred.front().request = request(150, 100);  // overlaps slot 1's area, in use
  CHECK(!p.slot_for_next());
}
