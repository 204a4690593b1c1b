// The fabric endpoint (transport/libfabric.hpp) between two processes over loopback, on every
// provider CI must cover: tcp;ofi_rxm, shm, and shm without cross-memory attach. A shard and an
// actor exchange address blobs out of band (a socketpair); the shard grants the actor a staging
// ring (a welcome); the actor writes 9 insert entries into it with one-sided writes, each
// published by its remote CQ data; the shard checks every entry against the layout it computes
// and its bytes against their pattern, refusing and counting the last (forged: another actor's
// id) and serving on; then the actor sends 4000 control messages of 300 bytes (about six times
// the shard's receive buffer, which the provider releases when full and the endpoint posts
// again: on shm the release comes as a completion of its own) and asks for the shard's status
// with one more, and checks the answer: 8 stored, 1 refused, every message received. Every wait has
// a deadline; the parent kills what overruns, and no process and no /dev/shm file of theirs is left
// behind.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <gear/detail/remote/blob.hpp>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/transport/libfabric.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "process_common.hpp"

namespace remote = gear::detail::remote;
namespace fabric = gear::transport::fabric;
using namespace process_test;

namespace {

constexpr int entries = 9;  // the last one forged (another actor's id): refused and counted
constexpr std::int64_t block_bytes = 64 * 1024, ring_blocks = 9, max_length = 64;
constexpr std::int64_t step_bytes[] = {1000, 8};
constexpr std::uint32_t incarnation = 0x5eed;
constexpr auto deadline = std::chrono::seconds(20);
constexpr int chatter = 4000;  // control messages before the status request
constexpr std::size_t chatter_bytes = 300;
// The shard acknowledges every chatter_ack messages, and the actor keeps at most twice that
// many unacknowledged, as gear's protocol bounds what a peer has in flight: a provider holds
// only so many messages that find no posted receive (shm: its receive queue's size, after
// which it cannot post the next receive).
constexpr int chatter_ack = 100;

/// Byte j of column c of entry i.
std::byte pattern(int i, std::size_t c, std::size_t j) {
  return std::byte(static_cast<unsigned>(i * 37 + c * 11 + j) & 0xff);
}
std::int64_t length_of(int i) { return 1 + (i * 7) % max_length; }

remote::address_blob blob_of(const fabric::endpoint& ep, std::uint32_t shard) {
  remote::address_blob b;
  b.provider = ep.provider();
  b.address_format = ep.address_format();
  b.address = ep.name();
  b.shard = shard;
  b.incarnation = incarnation;
  b.pid = static_cast<std::uint32_t>(getpid());
  b.hostname = "localhost";
  b.capacity = ring_blocks;
  b.max_length = max_length;
  b.spec_fingerprint = 0xfeed;
  b.selection_fingerprint = 0xbeef;
  b.max_message = remote::default_max_message;
  return b;
}

/// Polls until `done()` or the deadline; false on the deadline. A failed completion throws.
template <class Done, class On>
bool progress_until(fabric::endpoint& ep, Done done, On on) {
  const auto until = clock_type::now() + deadline;
  while (!done()) {
    if (clock_type::now() > until) return false;
    if (ep.poll([&](const fabric::completion& c) {
          if (c.what == fabric::completion::kind::failed)
            throw gear::error(gear::errc::transport_error, "completion failed: " + c.detail);
          on(c);
        }) == 0)
      std::this_thread::yield();
  }
  return true;
}

struct aligned_buffer {
  std::unique_ptr<std::byte[]> raw;
  std::byte* data;
  explicit aligned_buffer(std::size_t bytes)
      : raw(new std::byte[bytes + 4096]()),
        data(reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(raw.get()) + 4095) &
                                          ~std::uintptr_t{4095})) {}
};

// ---- the two processes -------------------------------------------------------------------------

int run_shard(int fd, const gear::transport::libfabric_config& config) {
  fabric::endpoint ep(config);
  aligned_buffer ring(ring_blocks * block_bytes), inbox(256 * 1024), outbox(4096);
  fabric::region ring_r = ep.register_memory(ring.data, ring_blocks * block_bytes, FI_REMOTE_WRITE);
  fabric::region inbox_r = ep.register_memory(inbox.data, 256 * 1024, FI_RECV);
  fabric::region outbox_r = ep.register_memory(outbox.data, 4096, FI_SEND);
  int send_context = 0;
  ep.receive_into(inbox_r, remote::default_max_message);
  if (!send_frame(fd, remote::encode(blob_of(ep, 0)))) return 11;
  const auto actor = remote::parse_blob(receive_frame(fd));
  if (!actor) return 12;
  remote::check_peer(blob_of(ep, 0), actor.value);
  const fi_addr_t peer = ep.insert_peer(actor.value.address);
  remote::welcome w;
  w.peer_index = 1;
  w.incarnation = incarnation;
  w.ring_address = ring_r.remote_address;
  w.ring_key.resize(8);
  std::memcpy(w.ring_key.data(), &ring_r.key, 8);
  w.block_bytes = block_bytes;
  w.ring_blocks = ring_blocks;
  if (!send_frame(fd, remote::encode(w))) return 13;

  // Entries, each published by its remote CQ data (its block); any order.
  const std::span<const std::byte> ring_bytes(ring.data, ring_blocks * block_bytes);
  int good = 0, bad = 0, received = 0, acked = 0;
  bool asked = false;
  std::uint64_t ack = 0;  // the count acknowledged, sent from outbox_r's second half
  int ack_context = 0;
  bool ack_sending = false;
  // Acknowledges the chatter received so far, one acknowledgement on the wire at a time.
  const auto acknowledge = [&] {
    if (ack_sending || received / chatter_ack == acked) return;
    ack = std::uint64_t(received);
    std::memcpy(outbox.data + 2048, &ack, sizeof ack);
    if (ep.try_send(outbox_r, 2048, sizeof ack, peer, &ack_context)) {
      ack_sending = true;
      acked = received / chatter_ack;
    }
  };
  remote::message_limits limits;
  limits.capacity = ring_blocks;
  limits.max_length = max_length;
  if (!progress_until(
          ep, [&] { return acknowledge(), good + bad == entries && asked; },
          [&](const fabric::completion& c) {
            if (c.context == &ack_context) ack_sending = false;
            if (c.what == fabric::completion::kind::remote_write) {
              const auto block = static_cast<std::uint32_t>(c.data);
              const remote::entry_expectation expect{
                  1, block, block, ring_blocks, block_bytes, max_length, step_bytes};
              const auto e = remote::check_entry(ring_bytes, expect);
              bool ok = static_cast<bool>(e);
              const auto l = remote::layout_entry(step_bytes, length_of(int(block)), block_bytes);
              for (std::size_t col = 0; ok && col < 2; ++col)
                for (std::int64_t j = 0; j < length_of(int(block)) * step_bytes[col]; ++j)
                  ok = ok &&
                       ring.data[block * block_bytes + remote::entry_header_bytes +
                                 l.column_at[col] + j] == pattern(int(block), col, std::size_t(j));
              (ok ? good : bad) += 1;
            } else if (c.what == fabric::completion::kind::received) {
              ++received;
              asked = asked || static_cast<bool>(remote::parse_status_request(c.message, limits));
            }
          }))
    return 14;
  // The answer: a status saying how many entries passed.
  const auto answer = remote::encode(remote::status{incarnation, good, double(good), 0,
                                                    std::uint64_t(good), 0, std::uint64_t(bad)});
  std::memcpy(outbox.data, answer.data(), answer.size());
  bool sent = false;
  const auto until = clock_type::now() + deadline;
  while (!ep.try_send(outbox_r, 0, answer.size(), peer, &send_context)) {
    if (clock_type::now() > until) return 15;
    ep.poll([](const fabric::completion&) {});
  }
  if (!progress_until(
          ep, [&] { return sent; },
          [&](const fabric::completion& c) { sent = sent || c.context == &send_context; }))
    return 16;
  // Wait for the actor to read it before closing (it says so on the socket).
  char byte = 0;
  if (read(fd, &byte, 1) != 1) return 17;
  if (received != chatter + 1) return 19;
  return bad == 1 && good == entries - 1 ? 0 : 18;
}

int run_actor(int fd, const gear::transport::libfabric_config& config) {
  fabric::endpoint ep(config);
  const auto shard = remote::parse_blob(receive_frame(fd));
  if (!shard) return 20;
  remote::check_peer(blob_of(ep, 1), shard.value);
  if (!send_frame(fd, remote::encode(blob_of(ep, 1)))) return 21;
  const fi_addr_t peer = ep.insert_peer(shard.value.address);
  remote::message_limits limits;
  limits.capacity = ring_blocks;
  limits.max_length = max_length;
  const auto w = remote::parse_welcome(receive_frame(fd), limits);
  if (!w || w.value.ring_key.size() != 8) return 22;
  std::uint64_t key = 0;
  std::memcpy(&key, w.value.ring_key.data(), 8);

  aligned_buffer source(ring_blocks * block_bytes), inbox(256 * 1024), outbox(4096);
  fabric::region source_r = ep.register_memory(source.data, ring_blocks * block_bytes, FI_WRITE);
  fabric::region inbox_r = ep.register_memory(inbox.data, 256 * 1024, FI_RECV);
  fabric::region outbox_r = ep.register_memory(outbox.data, 4096, FI_SEND);
  int send_context = 0;
  ep.receive_into(inbox_r, remote::default_max_message);
  std::vector<int> write_context(entries);
  int written = 0;
  for (int i = 0; i < entries; ++i) {
    std::vector<std::vector<std::byte>> cols(2);
    for (std::size_t c = 0; c < 2; ++c)
      for (std::int64_t j = 0; j < length_of(i) * step_bytes[c]; ++j)
        cols[c].push_back(pattern(i, c, std::size_t(j)));
    const std::span<const std::byte> spans[] = {cols[0], cols[1]};
    remote::entry_header h;
    h.actor = i == entries - 1 ? 2 : 1;
    h.sequence = std::uint64_t(i);
    h.length = length_of(i);
    h.first_block = std::uint32_t(i);
    std::vector<std::byte> packed;
    remote::pack_entry(h, spans, step_bytes, block_bytes, packed);
    if (std::int64_t(packed.size()) != block_bytes) return 24;  // one block each
    std::memcpy(source.data + i * block_bytes, packed.data(), packed.size());
    // The remote address: checked against the ring granted before posting.
    const std::uint64_t at = std::uint64_t(i) * block_bytes;
    if (at + packed.size() > std::uint64_t(w.value.ring_blocks) * w.value.block_bytes) return 25;
    const auto until = clock_type::now() + deadline;
    while (!ep.try_writedata(source_r, at, packed.size(), peer, w.value.ring_address + at, key,
                             std::uint64_t(i), &write_context[std::size_t(i)])) {
      if (clock_type::now() > until) return 26;
      ep.poll([&](const fabric::completion& c) {
        written += c.what == fabric::completion::kind::written;
      });
    }
  }
  // Chatter: messages enough to fill the shard's receive buffer several times over.
  aligned_buffer many(chatter * chatter_bytes);
  fabric::region many_r = ep.register_memory(many.data, chatter * chatter_bytes, FI_SEND);
  std::vector<int> chatter_context(chatter);
  const auto until = clock_type::now() + deadline;
  std::uint64_t acknowledged = 0;  // by the shard
  const auto poll_once = [&] {
    ep.poll([&](const fabric::completion& c) {
      written += c.what == fabric::completion::kind::written;
      if (c.what == fabric::completion::kind::received && c.message.size() == sizeof acknowledged)
        std::memcpy(&acknowledged, c.message.data(), sizeof acknowledged);
    });
  };
  for (int i = 0; i < chatter; ++i) {
    std::memset(many.data + i * chatter_bytes, i & 0xff, chatter_bytes);
    while (std::uint64_t(i) >= acknowledged + 2 * chatter_ack ||
           !ep.try_send(many_r, i * chatter_bytes, chatter_bytes, peer,
                        &chatter_context[std::size_t(i)])) {
      if (clock_type::now() > until) return 31;
      poll_once();
    }
  }
  const auto ask = remote::encode_status_request();
  std::memcpy(outbox.data, ask.data(), ask.size());
  while (!ep.try_send(outbox_r, 0, ask.size(), peer, &send_context)) {
    if (clock_type::now() > until) return 27;
    poll_once();
  }
  std::int64_t reported = -1;
  std::uint64_t refused = 0;
  if (!progress_until(
          ep, [&] { return reported >= 0 && written == entries; },
          [&](const fabric::completion& c) {
            written += c.what == fabric::completion::kind::written;
            if (c.what == fabric::completion::kind::received) {
              const auto s = remote::parse_status(c.message, limits);
              if (s) reported = s.value.size, refused = s.value.refused;
            }
          }))
    return 28;
  const char byte = 1;
  if (write(fd, &byte, 1) != 1) return 29;
  return reported == entries - 1 && refused == 1 ? 0 : 30;
}

void loopback(const char* provider, bool disable_cma) {
  gear::transport::libfabric_config config;
  config.provider = provider;
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  const auto start = clock_type::now();
  const pid_t shard =
      spawn([&](int fd) { return run_shard(fd, config); }, fds[0], fds[1], disable_cma);
  const pid_t actor =
      spawn([&](int fd) { return run_actor(fd, config); }, fds[1], fds[0], disable_cma);
  close(fds[0]);
  close(fds[1]);
  const auto until = start + deadline + std::chrono::seconds(5);
  const int shard_rc = reap(shard, until), actor_rc = reap(actor, until);
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  const std::string name = std::string(provider) + (disable_cma ? " (no CMA)" : "");
  MESSAGE(name << ": shard exit " << shard_rc << ", actor exit " << actor_rc << ", " << seconds
               << " s");
  CHECK(shm_leftovers(shard) == 0);
  CHECK(shm_leftovers(actor) == 0);
  if (shard_rc == 77 || actor_rc == 77) {
    MESSAGE("provider " << name << " is not available here: not tested");
    return;
  }
  CHECK(shard_rc == 0);
  CHECK(actor_rc == 0);
}

}  // namespace

TEST_CASE("tcp;ofi_rxm: insert entries by one-sided writes, a status by control messages") {
  loopback("tcp;ofi_rxm", false);
}
TEST_CASE("shm: the same") { loopback("shm", false); }
TEST_CASE("shm without cross-memory attach: the same") { loopback("shm", true); }
