// The remote transport's wire protocol and the learner's split maths, with no fabric: every
// message round-trips; every truncation, trailing byte, bad header and out-of-range field is
// refused with its reason and counted; random corruption never crashes a parser; insert entries
// and sample replies are checked against the layout the receiver computes; a peer that does not
// fit is refused naming both sides; batch splits follow the exact multinomial and hypergeometric
// laws (chi-square at 0.001, with power shown on a planted wrong law); global probabilities and
// weights match the union's.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <gear/detail/remote/blob.hpp>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/fingerprint.hpp>
#include <gear/detail/remote/hmac.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/detail/remote/split.hpp>
#include <gear/gear.hpp>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "common.hpp"

namespace remote = gear::detail::remote;
using remote::refusal;

namespace {

remote::message_limits limits() {
  remote::message_limits l;
  l.capacity = 1000;
  l.max_length = 64;
  l.max_batch = 4096;
  l.max_ring_blocks = 256;
  return l;
}

remote::hello some_hello() {
  remote::hello h;
  h.role = remote::peer_role::learner;
  h.spec_fingerprint = 0x1234;
  h.selection_fingerprint = 0x5678;
  h.pid = 4242;
  h.hostname = "node-a";
  for (std::size_t i = 0; i < h.token_proof.size(); ++i) h.token_proof[i] = std::uint8_t(i * 7);
  h.ring_blocks = 64;
  h.address = {127, 0, 0, 1, 0x30, 0x39};
  h.max_rows = 1024;
  h.max_window = 64;
  h.reply_address = {127, 0, 0, 1, 0x30, 0x3a};  // its inlet for this shard
  return h;
}
remote::welcome some_welcome() {
  remote::welcome w;
  w.peer_index = 3;
  w.incarnation = 0xBEEF;
  w.ring_address = 0x7f0000001000;
  w.ring_key = {1, 2, 3, 4, 5, 6, 7, 8};
  w.block_bytes = 65536;
  w.ring_blocks = 64;
  w.intake = {127, 0, 0, 1, 0x30, 0x3a};
  return w;
}
remote::status some_status() { return {0xBEEF, 900, 1234.5, 17.25, 10000, 5000, 3}; }
remote::sample_request some_request() {
  remote::sample_request r;
  r.request = 77;
  r.incarnation = 0xBEEF;
  r.rows = 256;
  r.win = {.length = 16, .offset = 2, .from = gear::anchor::random, .padding = gear::pad::head};
  r.seed = 99;
  r.call = 5;
  r.mass_used = 321.0;
  r.reply_offset = 4096;
  r.reply_bytes = 1 << 20;
  r.batch_address = 1 << 30;
  r.batch_key = 0xFEED;
  r.batch_bytes = 1 << 24;
  r.column_address = {(1 << 30) + 4096, (1 << 30) + (1 << 23)};
  return r;
}
remote::update some_update() {
  remote::update u;
  u.max_priority = 9.5;
  for (std::uint64_t i = 0; i < 10; ++i) u.entries.push_back({i * 3, 0xBEEF, float(i) + 0.5f});
  return u;
}
remote::ack some_ack() { return {4, 2, 11, gear::key{123, 1, 0xBEEF}}; }
remote::address_blob some_blob() {
  remote::address_blob b;
  b.provider = "tcp;ofi_rxm";
  b.address_format = 2;
  b.address = {10, 0, 0, 1, 0x1f, 0x90};
  b.shard = 1;
  b.incarnation = 0xBEEF;
  b.pid = 777;
  b.hostname = "node-b";
  b.capacity = 1000;
  b.max_length = 64;
  b.spec_fingerprint = 0xAAAA;
  b.selection_fingerprint = 0xBBBB;
  b.lifeline = "10.0.0.1:4000";
  b.nonce = 0x0123456789abcdefull;
  return b;
}

bool same(const remote::hello& a, const remote::hello& b) {
  return a.role == b.role && a.spec_fingerprint == b.spec_fingerprint &&
         a.selection_fingerprint == b.selection_fingerprint && a.pid == b.pid &&
         a.hostname == b.hostname && a.token_proof == b.token_proof &&
         a.ring_blocks == b.ring_blocks && a.max_message == b.max_message &&
         a.address == b.address && a.max_rows == b.max_rows && a.max_window == b.max_window &&
         a.reply_address == b.reply_address;
}

/// Every parser, each with its limits, as a function of the bytes: (accepted, refusal).
struct parser {
  const char* name;
  std::vector<std::byte> valid;
  std::function<std::pair<bool, refusal>(std::span<const std::byte>)> parse;
};

template <class Decoded>
std::pair<bool, refusal> result(const Decoded& d) {
  return {static_cast<bool>(d), d.why};
}

std::vector<parser> parsers() {
  const auto l = limits();
  return {
      {"hello", remote::encode(some_hello()),
       [l](auto b) { return result(remote::parse_hello(b, l)); }},
      {"welcome", remote::encode(some_welcome()),
       [l](auto b) { return result(remote::parse_welcome(b, l)); }},
      {"status_request", remote::encode_status_request(),
       [l](auto b) { return result(remote::parse_status_request(b, l)); }},
      {"status", remote::encode(some_status()),
       [l](auto b) { return result(remote::parse_status(b, l)); }},
      {"sample_request", remote::encode(some_request()),
       [l](auto b) { return result(remote::parse_sample_request(b, l)); }},
      {"update", remote::encode(some_update()),
       [l](auto b) { return result(remote::parse_update(b, l)); }},
      {"ack", remote::encode(some_ack()),
       [l](auto b) { return result(remote::parse_ack(b, l, 64)); }},
      {"blob", remote::encode(some_blob()), [](auto b) { return result(remote::parse_blob(b)); }},
  };
}

/// The bytes with the field at `at` (of T) replaced by `value`.
template <class T>
std::vector<std::byte> with(std::vector<std::byte> bytes, std::size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
  return bytes;
}

}  // namespace

TEST_CASE("every message round-trips") {
  const auto l = limits();
  const auto h = remote::parse_hello(remote::encode(some_hello()), l);
  REQUIRE(h);
  CHECK(same(h.value, some_hello()));
  const auto w = remote::parse_welcome(remote::encode(some_welcome()), l);
  REQUIRE(w);
  CHECK(w.value.ring_key == some_welcome().ring_key);
  CHECK(w.value.incarnation == 0xBEEF);
  CHECK(w.value.ring_address == some_welcome().ring_address);
  CHECK(w.value.intake == some_welcome().intake);
  const auto s = remote::parse_status(remote::encode(some_status()), l);
  REQUIRE(s);
  CHECK(s.value.mass == 1234.5);
  CHECK(s.value.size == 900);
  const auto r = remote::parse_sample_request(remote::encode(some_request()), l);
  REQUIRE(r);
  CHECK(r.value.win.from == gear::anchor::random);
  CHECK(r.value.win.padding == gear::pad::head);
  CHECK(r.value.rows == 256);
  CHECK(r.value.reply_bytes == (1u << 20));
  CHECK(r.value.batch_key == 0xFEED);
  CHECK(r.value.batch_bytes == (1u << 24));
  CHECK(r.value.column_address == some_request().column_address);
  const auto u = remote::parse_update(remote::encode(some_update()), l);
  REQUIRE(u);
  REQUIRE(u.value.entries.size() == 10);
  CHECK(u.value.entries[9].ticket == 27);
  CHECK(u.value.entries[9].priority == 9.5f);
  CHECK_FALSE(u.value.erase);
  // An erase is an update's body under its own type; the parser says which it read.
  remote::update erase = some_update();
  erase.erase = true;
  const auto bytes = remote::encode(erase);
  CHECK(remote::frame_type(bytes, remote::default_max_message).value.type ==
        remote::message_type::erase);
  const auto e = remote::parse_update(bytes, l);
  REQUIRE(e);
  CHECK(e.value.erase);
  CHECK(e.value.entries.size() == 10);
  const auto a = remote::parse_ack(remote::encode(some_ack()), l, 64);
  REQUIRE(a);
  CHECK(a.value.stored == gear::key{123, 1, 0xBEEF});
  const auto b = remote::parse_blob(remote::encode(some_blob()));
  REQUIRE(b);
  CHECK(b.value.provider == "tcp;ofi_rxm");
  CHECK(b.value.address == some_blob().address);
  CHECK(b.value.lifeline == "10.0.0.1:4000");
  CHECK(b.value.nonce == some_blob().nonce);
}

TEST_CASE("every truncation, every trailing byte and every bad header is refused and counted") {
  for (const parser& p : parsers()) {
    CAPTURE(p.name);
    REQUIRE(p.parse(p.valid).first);
    remote::refusal_counts counts;
    for (std::size_t n = 0; n < p.valid.size(); ++n) {
      const auto [ok, why] = p.parse(std::span(p.valid).first(n));
      CHECK_FALSE(ok);
      CHECK(why == refusal::truncated);
      counts.add(why);
    }
    CHECK(counts[refusal::truncated] == p.valid.size());
    auto longer = p.valid;
    longer.push_back(std::byte{0});
    CHECK(p.parse(longer).second == refusal::trailing);
    CHECK(p.parse(with(p.valid, 0, std::uint32_t{0x12345678})).second == refusal::bad_magic);
    CHECK(p.parse(with(p.valid, 4, std::uint16_t{remote::wire_version + 1})).second ==
          refusal::bad_version);
    CHECK(p.parse(with(p.valid, 12, std::uint32_t{5})).first);  // the sender: the caller's check
    counts.add(refusal::trailing);
    CHECK(counts.total() == p.valid.size() + 1);
  }
  // A frame of another type is refused as such, and one over the agreed maximum as oversized.
  const auto l = limits();
  CHECK(remote::parse_status(remote::encode(some_hello()), l).why == refusal::wrong_type);
  remote::update big;
  big.entries.resize(remote::update_capacity(l.max_message) + 1);
  CHECK(remote::parse_update(remote::encode(big), l).why == refusal::oversized);
}

TEST_CASE("every field out of range is refused, naming the field") {
  const auto l = limits();
  auto check = [](auto decoded, const char* field) {
    CAPTURE(field);
    CHECK_FALSE(decoded);
    CHECK(decoded.why == refusal::out_of_range);
    CHECK(decoded.what.find(field) != std::string::npos);
  };
  auto h = some_hello();
  h.role = static_cast<remote::peer_role>(9);
  check(remote::parse_hello(remote::encode(h), l), "role");
  h = some_hello();
  h.ring_blocks = l.max_ring_blocks + 1;
  check(remote::parse_hello(remote::encode(h), l), "ring_blocks");
  h = some_hello();
  h.address.clear();
  check(remote::parse_hello(remote::encode(h), l), "address length");
  h = some_hello();
  h.reply_address.assign(remote::max_hello_address + 1, 1);
  check(remote::parse_hello(remote::encode(h), l), "reply address length");
  h = some_hello();
  h.reply_address.clear();  // none: the shard answers to its address
  CHECK(same(remote::parse_hello(remote::encode(h), l).value, h));
  h = some_hello();
  h.max_rows = l.max_batch + 1;
  check(remote::parse_hello(remote::encode(h), l), "max_rows or max_window");
  h = some_hello();
  h.max_rows = 1 << 12;
  h.max_window = std::int64_t{1} << 21;  // 2^33 steps of staging
  check(remote::parse_hello(remote::encode(h), l), "max_rows or max_window");
  auto w = some_welcome();
  w.incarnation = 0;
  check(remote::parse_welcome(remote::encode(w), l), "incarnation");
  w = some_welcome();
  w.block_bytes = 65537;
  check(remote::parse_welcome(remote::encode(w), l), "block_bytes");
  w = some_welcome();
  w.ring_key.assign(remote::max_mr_key + 1, 1);
  check(remote::parse_welcome(remote::encode(w), l), "ring key");
  w = some_welcome();
  w.intake.assign(remote::max_hello_address + 1, 1);
  check(remote::parse_welcome(remote::encode(w), l), "intake length");
  auto s = some_status();
  s.size = l.capacity + 1;
  check(remote::parse_status(remote::encode(s), l), "size");
  for (const double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    s = some_status();
    s.mass = bad;
    check(remote::parse_status(remote::encode(s), l), "mass");
  }
  auto r = some_request();
  r.rows = 0;
  check(remote::parse_sample_request(remote::encode(r), l), "rows");
  r.rows = l.max_batch + 1;
  check(remote::parse_sample_request(remote::encode(r), l), "rows");
  r = some_request();
  r.win.length = l.max_length + 1;
  check(remote::parse_sample_request(remote::encode(r), l), "window length");
  r = some_request();
  r.win.offset = -1;
  check(remote::parse_sample_request(remote::encode(r), l), "window offset");
  r = some_request();
  r.win.from = static_cast<gear::anchor>(3);
  check(remote::parse_sample_request(remote::encode(r), l), "window anchor");
  r = some_request();
  r.win.padding = static_cast<gear::pad>(2);
  check(remote::parse_sample_request(remote::encode(r), l), "window padding");
  r = some_request();
  r.column_address.assign(remote::max_request_columns + 1, 0);
  check(remote::parse_sample_request(remote::encode(r), l), "columns");
  auto u = some_update();
  u.entries[4].priority = std::nanf("");
  check(remote::parse_update(remote::encode(u), l), "priority of entry 4");
  u = some_update();
  u.entries[0].priority = -1;
  check(remote::parse_update(remote::encode(u), l), "priority of entry 0");
  auto a = some_ack();
  a.first_block = 63;  // 2 blocks from 63 pass the end of a 64-block ring
  check(remote::parse_ack(remote::encode(a), l, 64), "blocks");
  auto b = some_blob();
  b.incarnation = 0;
  check(remote::parse_blob(remote::encode(b)), "incarnation");
  b = some_blob();
  b.capacity = 0;
  check(remote::parse_blob(remote::encode(b)), "capacity");
}

TEST_CASE("random corruption never crashes a parser; what is accepted re-encodes to itself") {
  std::mt19937_64 gen(20261203);
  for (const parser& p : parsers()) {
    CAPTURE(p.name);
    remote::refusal_counts counts;
    int accepted = 0;
    for (int trial = 0; trial < 20000; ++trial) {
      auto bytes = p.valid;
      const int flips = 1 + static_cast<int>(gen() % 4);
      for (int f = 0; f < flips; ++f) bytes[gen() % bytes.size()] = std::byte(gen() & 0xff);
      if (gen() % 8 == 0) bytes.resize(gen() % (bytes.size() + 8));
      const auto [ok, why] = p.parse(bytes);
      accepted += ok;
      counts.add(why);
    }
    CHECK(accepted + counts.total() == 20000);
    CHECK(counts.total() > 0);
  }
  // Accepted corruptions are exact: a parsed status, re-encoded, is the bytes it came from.
  const auto l = limits();
  int checked = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    auto bytes = remote::encode(some_status());
    bytes[16 + gen() % (bytes.size() - 16)] = std::byte(gen() & 0xff);
    const auto s = remote::parse_status(bytes, l);
    if (!s) continue;
    CHECK(remote::encode(s.value) == bytes);
    ++checked;
  }
  CHECK(checked > 100);
}

TEST_CASE("remote CQ data and frame senders round-trip") {
  for (const auto kind : {remote::write_kind::insert_entry, remote::write_kind::sample_reply})
    for (const std::uint32_t peer : {0u, 1u, 4095u})
      for (const std::uint32_t index : {0u, 7u, 65535u}) {
        const auto d = remote::cq_data::decode(remote::cq_data{kind, peer, index}.encode());
        CHECK(d.kind == kind);
        CHECK(d.peer == peer);
        CHECK(d.index == index);
        CHECK(remote::cq_data{kind, peer, index}.encode() < (std::uint64_t{1} << 32));
      }
  auto bytes = remote::encode(some_status());
  remote::stamp_sender(bytes, 42);
  const auto info = remote::frame_type(bytes, remote::default_max_message);
  REQUIRE(info);
  CHECK(info.value.sender == 42);
  CHECK(info.value.type == remote::message_type::status);
}

TEST_CASE("bundles: several requests of one sender in one message, split back whole") {
  // Three requests of sender 9, each its own frame, in one bundle.
  std::vector<std::vector<std::byte>> frames;
  for (std::uint32_t i = 0; i < 3; ++i) {
    remote::sample_request r = some_request();
    r.request = 100 + i;
    frames.push_back(remote::encode(r));
    remote::stamp_sender(frames.back(), 9);
  }
  const auto bundle_of = [](const std::vector<std::vector<std::byte>>& fs, std::uint32_t sender) {
    std::vector<std::byte> b;
    remote::start_bundle(b);
    for (const auto& f : fs) remote::add_to_bundle(b, f);
    remote::finish_bundle(b, sender);
    return b;
  };
  const std::vector<std::byte> bundle = bundle_of(frames, 9);
  std::vector<std::span<const std::byte>> split;
  const auto ok = remote::split_bundle(bundle, remote::default_max_message,
                                       remote::message_type::sample_request, split);
  REQUIRE(ok);
  CHECK(ok.value.sender == 9);
  CHECK(ok.value.type == remote::message_type::bundle);
  REQUIRE(split.size() == 3);
  remote::message_limits l;
  l.max_length = 64;
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(std::equal(split[i].begin(), split[i].end(), frames[i].begin(), frames[i].end()));
    const auto r = remote::parse_sample_request(split[i], l);
    REQUIRE(r);
    CHECK(r.value.request == 100 + i);
  }

  // A shard's acknowledgements to an actor, bundled the same way (sender 0).
  std::vector<std::vector<std::byte>> acks{
      remote::encode(remote::ack{1, 1, 3, gear::key{5, 0, 7}}),
      remote::encode(remote::ack{2, 1, 4, gear::key{6, 0, 7}})};
  const std::vector<std::byte> ack_bundle = bundle_of(acks, 0);
  REQUIRE(remote::split_bundle(ack_bundle, remote::default_max_message, remote::message_type::ack,
                               split));
  REQUIRE(split.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto a = remote::parse_ack(split[i], {}, 8);
    REQUIRE(a);
    CHECK(a.value.stored.ticket == 5 + i);
  }
  CHECK_FALSE(remote::split_bundle(ack_bundle, remote::default_max_message,
                                   remote::message_type::sample_request, split));

  // Refused whole, with its reason: a bundle of nothing, a frame cut short or running past the
  // end, a frame of another sender, of another type, a bundle in a bundle, a bad inner header,
  // a lone request where a bundle was expected.
  const auto refused = [&](const std::vector<std::byte>& b) {
    split.assign(2, {});
    const auto d = remote::split_bundle(b, remote::default_max_message,
                                        remote::message_type::sample_request, split);
    CHECK(split.empty());  // nothing of it handed out
    return d ? refusal::none : d.why;
  };
  CHECK(refused(bundle_of({}, 9)) == refusal::out_of_range);
  std::vector<std::byte> cut = bundle;
  cut.resize(cut.size() - 5);
  remote::finish_bundle(cut, 9);  // the outer length agrees; the last frame's does not
  CHECK(refused(cut) == refusal::truncated);
  std::vector<std::byte> short_header = bundle_of(frames, 9);
  short_header.resize(short_header.size() + 7);  // 7 bytes of no frame after the last one
  remote::finish_bundle(short_header, 9);
  CHECK(refused(short_header) == refusal::truncated);
  auto other_sender = frames;
  remote::stamp_sender(other_sender[1], 8);
  CHECK(refused(bundle_of(other_sender, 9)) == refusal::mismatch);
  auto status_frame = remote::encode(some_status());
  remote::stamp_sender(status_frame, 9);
  CHECK(refused(bundle_of({frames[0], status_frame}, 9)) == refusal::wrong_type);
  CHECK(refused(bundle_of({frames[0], bundle}, 9)) == refusal::wrong_type);
  auto bad_magic = frames;
  bad_magic[2][0] ^= std::byte{1};
  CHECK(refused(bundle_of(bad_magic, 9)) == refusal::bad_magic);
  CHECK(refused(frames[0]) == refusal::wrong_type);
  auto outer_truncated = bundle;
  outer_truncated.pop_back();
  CHECK(refused(outer_truncated) == refusal::truncated);  // the outer length no longer agrees
}

TEST_CASE("a peer that does not fit is refused, naming both sides") {
  const auto mine = some_blob();
  CHECK_NOTHROW(remote::check_peer(mine, some_blob()));
  auto check = [&](remote::address_blob theirs, const char* field) {
    theirs.pid = 999;
    theirs.hostname = "node-z";
    CAPTURE(field);
    try {
      remote::check_peer(mine, theirs);
      FAIL("accepted");
    } catch (const gear::error& e) {
      CHECK(e.code() == gear::errc::peer_mismatch);
      const std::string what = e.what();
      CHECK(what.find(field) != std::string::npos);
      CHECK(what.find("pid 777 on 'node-b'") != std::string::npos);
      CHECK(what.find("pid 999 on 'node-z'") != std::string::npos);
    }
  };
  auto theirs = some_blob();
  theirs.provider = "shm";
  check(theirs, "provider");
  theirs = some_blob();
  theirs.address_format = 9;
  check(theirs, "address format");
  theirs = some_blob();
  theirs.spec_fingerprint ^= 1;
  check(theirs, "spec");
  theirs = some_blob();
  theirs.selection_fingerprint ^= 1;
  check(theirs, "selection policy");
}

TEST_CASE("fingerprints tell specs and policies apart") {
  using a = gear::spec<gear::column<"obs", float, 4>, gear::column<"act", std::int32_t>>;
  using same_as_a = gear::spec<gear::column<"obs", float, 4>, gear::column<"act", std::int32_t>>;
  using renamed = gear::spec<gear::column<"ob", float, 4>, gear::column<"act", std::int32_t>>;
  using retyped =
      gear::spec<gear::column<"obs", std::int32_t, 4>, gear::column<"act", std::int32_t>>;
  using reshaped = gear::spec<gear::column<"obs", float, 2, 2>, gear::column<"act", std::int32_t>>;
  using reordered = gear::spec<gear::column<"act", std::int32_t>, gear::column<"obs", float, 4>>;
  constexpr auto fa = remote::spec_fingerprint<a>();
  static_assert(fa == remote::spec_fingerprint<same_as_a>());
  CHECK(fa != remote::spec_fingerprint<renamed>());
  CHECK(fa != remote::spec_fingerprint<retyped>());
  CHECK(fa != remote::spec_fingerprint<reshaped>());
  CHECK(fa != remote::spec_fingerprint<reordered>());
  const std::uint64_t policies[] = {remote::selection_fingerprint<gear::select::uniform>(),
                                    remote::selection_fingerprint<gear::select::prioritized>(),
                                    remote::selection_fingerprint<gear::select::recency>(),
                                    remote::selection_fingerprint<gear::select::fifo>(),
                                    remote::selection_fingerprint<gear::select::lifo>()};
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t j = i + 1; j < 5; ++j) CHECK(policies[i] != policies[j]);
}

TEST_CASE(
    "insert entries: packed ones pass; every bad field, a partial write and the ring's "
    "edges are refused") {
  const std::int64_t steps[] = {24, 4, 1};
  const std::int64_t block = 4096;
  const std::uint32_t ring_blocks = 8;
  std::vector<std::byte> ring(ring_blocks * block, std::byte{0xEE});
  std::vector<std::byte> c0(10 * 24, std::byte{1}), c1(10 * 4, std::byte{2}), c2(10, std::byte{3});
  const std::span<const std::byte> cols[] = {c0, c1, c2};
  remote::entry_header h;
  h.actor = 5;
  h.sequence = 41;
  h.length = 10;
  h.first_block = 6;
  std::vector<std::byte> packed;
  remote::pack_entry(h, cols, steps, block, packed);
  REQUIRE(packed.size() == static_cast<std::size_t>(block));  // 64 + 384 + 128 + 128 + 8 bytes
  std::memcpy(ring.data() + 6 * block, packed.data(), packed.size());
  const remote::entry_expectation expect{5, 41, 6, ring_blocks, block, 64, steps};
  const auto ok = remote::check_entry(ring, expect);
  REQUIRE(ok);
  CHECK(ok.value.length == 10);
  const auto layout = remote::layout_entry(steps, 10, block);
  CHECK(std::memcmp(ring.data() + 6 * block + 64 + layout.column_at[1], c1.data(), c1.size()) == 0);

  auto refused = [&](std::vector<std::byte> r, remote::entry_expectation e, refusal why,
                     const char* field) {
    CAPTURE(field);
    const auto d = remote::check_entry(r, e);
    CHECK_FALSE(d);
    CHECK(d.why == why);
    CHECK(d.what.find(field) != std::string::npos);
  };
  const std::size_t at = 6 * block;
  refused(with(ring, at, std::uint32_t{0}), expect, refusal::bad_magic, "magic");
  refused(with(ring, at + 4, std::uint16_t{9}), expect, refusal::bad_version, "version");
  refused(with(ring, at + 6, std::uint16_t{2}), expect, refusal::out_of_range, "column count");
  refused(with(ring, at + 8, std::uint32_t{6}), expect, refusal::mismatch, "actor");
  refused(with(ring, at + 12, std::uint32_t{4}), expect, refusal::out_of_range, "flags");
  refused(with(ring, at + 16, std::uint64_t{40}), expect, refusal::mismatch, "sequence");
  refused(with(ring, at + 24, std::int64_t{65}), expect, refusal::out_of_range, "length");
  refused(with(ring, at + 24, std::int64_t{0}), expect, refusal::out_of_range, "length");
  refused(with(with(ring, at + 12, remote::entry_has_priority), at + 32, std::nan("")), expect,
          refusal::out_of_range, "priority");
  refused(with(ring, at + 40, std::uint32_t{5}), expect, refusal::mismatch, "first block");
  refused(with(ring, at + 44, std::uint32_t{3}), expect, refusal::out_of_range, "blocks");
  refused(with(ring, at + 48, std::uint64_t{1}), expect, refusal::out_of_range, "payload");
  refused(with(ring, at + 56, std::uint32_t{1}), expect, refusal::out_of_range, "flags");
  // A partial write: the footer is not the sequence yet.
  refused(with(ring, at + 64 + layout.payload_bytes, std::uint64_t{0}), expect, refusal::truncated,
          "footer");
  // Completions that name a block outside the ring, or an entry running past its end.
  auto past = expect;
  past.first_block = ring_blocks;
  refused(ring, past, refusal::out_of_range, "first block");
  // An entry whose blocks run past the ring's end (1 KiB blocks: 64 steps take 2 from the last).
  std::vector<std::byte> long_entry;
  std::vector<std::byte> big(64 * 24, std::byte{1}), big1(64 * 4, std::byte{2}),
      big2(64, std::byte{3});
  const std::span<const std::byte> big_cols[] = {big, big1, big2};
  h.length = 64;
  h.first_block = 7;
  remote::pack_entry(h, big_cols, steps, 1024, long_entry);
  REQUIRE(long_entry.size() == 2 * 1024);
  std::vector<std::byte> small_ring(8 * 1024);
  std::memcpy(small_ring.data() + 7 * 1024, long_entry.data(), 1024);
  const remote::entry_expectation last{5, 41, 7, 8, 1024, 64, steps};
  refused(small_ring, last, refusal::out_of_range, "past the ring");
  // The same trajectory where it fits passes.
  h.first_block = 5;
  remote::pack_entry(h, big_cols, steps, 1024, long_entry);
  std::memcpy(small_ring.data() + 5 * 1024, long_entry.data(), 2 * 1024);
  const remote::entry_expectation fits{5, 41, 5, 8, 1024, 64, steps};
  CHECK(remote::check_entry(small_ring, fits));
}

TEST_CASE("sample replies: sealed ones pass; a mismatch or a missing footer is refused") {
  const std::int64_t steps[] = {24, 4};
  const auto l = remote::layout_reply(steps, 32, 8);
  CHECK(l.mask_at >= remote::reply_header_bytes);
  CHECK(l.keys_at >= l.mask_at + 32 * 8);
  CHECK(l.probabilities_at >= l.keys_at + 32 * 16);
  CHECK(l.footer_at >= l.probabilities_at + 32 * 4);
  CHECK(l.meta_bytes == l.footer_at + remote::reply_footer_bytes);
  CHECK(l.column_at[0] >= l.meta_bytes);  // the columns follow, each aligned
  CHECK(l.column_at[0] % gear::segment_alignment == 0);
  CHECK(l.column_at[1] >= l.column_at[0] + 32 * 8 * 24);
  CHECK(l.total_bytes >= l.column_at[1] + 32 * 8 * 4);
  std::vector<std::byte> slice(static_cast<std::size_t>(l.meta_bytes));
  remote::reply_header h;
  h.request = 9;
  h.incarnation = 0xBEEF;
  h.rows = 32;
  h.window = 8;
  h.mass = 12.5;
  h.size = 100;
  remote::seal_reply(h, slice, l);
  CHECK(remote::check_reply(slice, 9, 0xBEEF, 32, 8, steps));
  CHECK(remote::check_reply(slice, 10, 0xBEEF, 32, 8, steps).why == refusal::mismatch);
  CHECK(remote::check_reply(slice, 9, 0xBEEE, 32, 8, steps).why == refusal::mismatch);
  CHECK(
      remote::check_reply(std::span(slice).first(slice.size() - 8), 9, 0xBEEF, 32, 8, steps).why ==
      refusal::truncated);
  CHECK(remote::check_reply(slice, 9, 0xBEEF, 31, 8, steps).why == refusal::mismatch);
  CHECK(remote::check_reply(with(slice, 40, -1.0), 9, 0xBEEF, 32, 8, steps).why ==
        refusal::out_of_range);
  CHECK(remote::check_reply(with(slice, static_cast<std::size_t>(l.footer_at), std::uint32_t{0}), 9,
                            0xBEEF, 32, 8, steps)
            .why == refusal::truncated);
  // The writes of columns alone it announces: at most one per column.
  CHECK(remote::check_reply(with(slice, 6, std::uint16_t{2}), 9, 0xBEEF, 32, 8, steps));
  CHECK(remote::check_reply(with(slice, 6, std::uint16_t{3}), 9, 0xBEEF, 32, 8, steps).why ==
        refusal::out_of_range);
}

TEST_CASE("sample replies: as few writes as the provider allows, the meta part in the last") {
  // columns, segments per write -> writes of columns alone before the meta part's
  CHECK(remote::reply_column_writes(0, 1) == 0);  // a reply of no rows: the meta part alone
  CHECK(remote::reply_column_writes(0, 4) == 0);
  CHECK(remote::reply_column_writes(2, 1) == 2);  // one segment a write: a write per column
  CHECK(remote::reply_column_writes(1, 4) == 0);
  CHECK(remote::reply_column_writes(3, 4) == 0);  // 3 columns and the meta part: one write
  CHECK(remote::reply_column_writes(4, 4) == 1);
  CHECK(remote::reply_column_writes(7, 4) == 1);
  CHECK(remote::reply_column_writes(8, 4) == 2);
}

namespace {

/// Counts of each split (as a map from the share vector) over `calls` splits of `batch` rows.
template <class Split>
std::map<std::vector<std::int64_t>, double> split_counts(Split split, int calls) {
  std::map<std::vector<std::int64_t>, double> counts;
  gear::rng g{7};
  for (int c = 0; c < calls; ++c) ++counts[split(g.next())];
  return counts;
}

/// Every split of `batch` into 4 non-negative shares.
std::vector<std::vector<std::int64_t>> compositions4(std::int64_t batch) {
  std::vector<std::vector<std::int64_t>> out;
  for (std::int64_t a = 0; a <= batch; ++a)
    for (std::int64_t b = 0; a + b <= batch; ++b)
      for (std::int64_t c = 0; a + b + c <= batch; ++c) out.push_back({a, b, c, batch - a - b - c});
  return out;
}

double log_factorial(std::int64_t n) { return std::lgamma(static_cast<double>(n) + 1); }

double multinomial_p(const std::vector<std::int64_t>& k, const std::vector<double>& p) {
  std::int64_t n = 0;
  double lp = 0;
  for (std::size_t i = 0; i < k.size(); ++i) {
    n += k[i];
    if (p[i] == 0 && k[i] > 0) return 0;
    if (k[i] > 0) lp += static_cast<double>(k[i]) * std::log(p[i]) - log_factorial(k[i]);
  }
  return std::exp(lp + log_factorial(n));
}

double log_choose(std::int64_t n, std::int64_t k) {
  return log_factorial(n) - log_factorial(k) - log_factorial(n - k);
}

double hypergeometric_p(const std::vector<std::int64_t>& k, const std::vector<std::int64_t>& n) {
  std::int64_t b = 0, total = 0;
  double lp = 0;
  for (std::size_t i = 0; i < k.size(); ++i) {
    if (k[i] > n[i]) return 0;
    lp += log_choose(n[i], k[i]);
    b += k[i];
    total += n[i];
  }
  return std::exp(lp - log_choose(total, b));
}

/// Chi-square of observed split counts against exact probabilities, at 0.001.
bool law_rejects(const std::map<std::vector<std::int64_t>, double>& counts,
                 const std::vector<std::vector<std::int64_t>>& cells,
                 const std::function<double(const std::vector<std::int64_t>&)>& prob, int calls) {
  std::vector<double> o, e;
  for (const auto& cell : cells) {
    const auto it = counts.find(cell);
    o.push_back(it == counts.end() ? 0 : it->second);
    e.push_back(prob(cell) * calls);
  }
  const auto [stat, df] = gear_test::pooled_chi2(o, e);
  MESSAGE("chi-square " << stat << " on " << df << " df, critical "
                        << gear_test::chi2_critical_0001(df));
  return stat > gear_test::chi2_critical_0001(df);
}

}  // namespace

TEST_CASE("with replacement, shares follow Multinomial(B, M_s / M) over live shards") {
  // Four shards, one lost and one empty: the split is over the other two, B = 12 (13 cells).
  const std::vector<remote::shard_share> shards{
      {3.0, 30, true}, {5.0, 50, false}, {0.0, 0, true}, {1.5, 15, true}};
  const std::vector<double> p{3.0 / 4.5, 0, 0, 1.5 / 4.5};
  const int calls = 200000;
  const auto counts = split_counts(
      [&](gear::rng_draw d) { return remote::split_with_replacement(shards, 12, d); }, calls);
  for (const auto& [k, n] : counts) {
    CHECK(k[0] + k[1] + k[2] + k[3] == 12);
    CHECK(k[1] == 0);  // lost
    CHECK(k[2] == 0);  // no mass
  }
  std::vector<std::vector<std::int64_t>> cells;
  for (std::int64_t k0 = 0; k0 <= 12; ++k0) cells.push_back({k0, 0, 0, 12 - k0});
  auto exact = [&](const std::vector<std::int64_t>& k) { return multinomial_p(k, p); };
  CHECK_FALSE(law_rejects(counts, cells, exact, calls));
  // Power: the same test rejects a split made with shard 0's mass 10% off.
  auto planted = shards;
  planted[0].mass *= 1.1;
  const auto wrong = split_counts(
      [&](gear::rng_draw d) { return remote::split_with_replacement(planted, 12, d); }, calls);
  CHECK(law_rejects(wrong, cells, exact, calls));
  // Nothing to sample from: a clear error.
  const std::vector<remote::shard_share> none{{0.0, 0, true}, {4.0, 4, false}};
  CHECK(gear_test::code_of([&] {
          (void)remote::split_with_replacement(none, 4, gear::rng{1}.next());
        }) == gear::errc::empty_buffer);
  const std::vector<remote::shard_share> bad{{std::nan(""), 1, true}};
  CHECK(gear_test::code_of([&] {
          (void)remote::split_with_replacement(bad, 4, gear::rng{1}.next());
        }) == gear::errc::invalid_argument);
}

TEST_CASE("without replacement, shares follow the multivariate hypergeometric law on sizes") {
  const std::vector<remote::shard_share> shards{
      {1, 4, true}, {1, 3, true}, {1, 9, false}, {1, 5, true}};
  const std::vector<std::int64_t> sizes{4, 3, 0, 5};
  const int calls = 200000;
  const std::int64_t batch = 5;
  const auto counts = split_counts(
      [&](gear::rng_draw d) { return remote::split_without_replacement(shards, batch, d); }, calls);
  std::vector<std::vector<std::int64_t>> cells;
  for (const auto& k : compositions4(batch))
    if (k[2] == 0 && k[0] <= 4 && k[1] <= 3 && k[3] <= 5) cells.push_back(k);
  for (const auto& [k, n] : counts) {
    CHECK(k[0] <= 4);
    CHECK(k[1] <= 3);
    CHECK(k[2] == 0);
    CHECK(k[3] <= 5);
  }
  auto exact = [&](const std::vector<std::int64_t>& k) { return hypergeometric_p(k, sizes); };
  CHECK_FALSE(law_rejects(counts, cells, exact, calls));
  // Power: a split that draws with replacement by size (a plausible bug) is rejected.
  const auto wrong = split_counts(
      [&](gear::rng_draw d) {
        std::vector<remote::shard_share> by_size = shards;
        for (auto& s : by_size) s.mass = static_cast<double>(s.size);
        return remote::split_with_replacement(by_size, batch, d);
      },
      calls);
  CHECK(law_rejects(wrong, cells, exact, calls));
  // Everything asked: every live trajectory; more: a clear error.
  gear::rng g{3};
  CHECK(remote::split_without_replacement(shards, 12, g.next()) ==
        std::vector<std::int64_t>{4, 3, 0, 5});
  CHECK(gear_test::code_of([&] {
          (void)remote::split_without_replacement(shards, 13, g.next());
        }) == gear::errc::not_enough_items);
}

TEST_CASE("global probabilities are the union's; weights follow the local formula") {
  // Two shards with priorities; the union's P(i) = p_i / M.
  const std::vector<double> a{1, 2, 3}, b{4, 0.5};
  const double ma = 6, mb = 4.5, m = ma + mb;
  double total = 0;
  std::vector<double> P;
  for (const double p : a) P.push_back(remote::global_probability(ma, m, p / ma));
  for (const double p : b) P.push_back(remote::global_probability(mb, m, p / mb));
  for (std::size_t i = 0; i < P.size(); ++i) {
    const double union_p = (i < 3 ? a[i] : b[i - 3]) / m;
    CHECK(P[i] == doctest::Approx(union_p).epsilon(1e-12));
    total += P[i];
  }
  CHECK(total == doctest::Approx(1.0).epsilon(1e-12));
  // A shard that grew since the snapshot: the row's P is what was actually used.
  CHECK(remote::global_probability(ma, m, 3 / 7.0) == doctest::Approx(ma / m * 3 / 7.0));
  std::vector<float> w(P.size());
  remote::importance_weights(P, 5, 0.4, w);
  double max_raw = 0;
  for (const double p : P) max_raw = std::max(max_raw, std::pow(5 * p, -0.4));
  for (std::size_t i = 0; i < P.size(); ++i)
    CHECK(w[i] == doctest::Approx(std::pow(5 * P[i], -0.4) / max_raw).epsilon(1e-6));
}

namespace {
std::string hex(const remote::digest& d) {
  std::string out;
  char two[3];
  for (const std::uint8_t b : d) {
    std::snprintf(two, sizeof(two), "%02x", b);
    out += two;
  }
  return out;
}
std::span<const std::uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}
}  // namespace

TEST_CASE("the token proof: SHA-256 and HMAC-SHA-256 against published test vectors") {
  auto sha = [](std::string_view s) {
    remote::sha256 h;
    h.update(bytes_of(s));
    return hex(h.finish());
  };
  CHECK(sha("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // RFC 4231, test cases 1, 2 and 6 (a key longer than a block).
  const std::vector<std::uint8_t> key1(20, 0x0b), key6(131, 0xaa);
  CHECK(hex(remote::hmac_sha256(key1, bytes_of("Hi There"))) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hex(remote::hmac_sha256(bytes_of("Jefe"), bytes_of("what do ya want for nothing?"))) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hex(remote::hmac_sha256(key6, bytes_of("Test Using Larger Than Block-Size Key - Hash Key "
                                               "First"))) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // A proof binds the token, the nonce, the role and the pid.
  const auto p = remote::token_proof("secret", 42, 1, 7);
  CHECK(remote::same_proof(p, remote::token_proof("secret", 42, 1, 7)));
  CHECK_FALSE(remote::same_proof(p, remote::token_proof("Secret", 42, 1, 7)));
  CHECK_FALSE(remote::same_proof(p, remote::token_proof("secret", 43, 1, 7)));
  CHECK_FALSE(remote::same_proof(p, remote::token_proof("secret", 42, 2, 7)));
  CHECK_FALSE(remote::same_proof(p, remote::token_proof("secret", 42, 1, 8)));
}

TEST_CASE("a sample request's writes must stay inside what the learner granted") {
  const std::int64_t steps[] = {24, 4};
  const remote::reply_grant grant{1 << 20, 64, 16};
  remote::sample_request r;
  r.rows = 32;
  r.win.length = 8;
  r.reply_offset = 4096;
  r.reply_bytes = static_cast<std::uint64_t>(remote::layout_reply(steps, 32, 8).meta_bytes);
  r.batch_address = 1 << 20;
  r.batch_bytes = 64 * 16 * 28;  // a batch of 64 rows of 16 steps
  r.column_address = {(1 << 20) + 32 * 8 * 24, (1 << 20) + 64 * 16 * 24 + 32 * 8 * 4};
  const auto fits = remote::check_request_fits(r, steps, grant);
  REQUIRE(fits);
  CHECK(fits.value.total_bytes == remote::layout_reply(steps, 32, 8).total_bytes);
  const auto refused = [&](remote::sample_request bad, refusal why, const char* what) {
    const auto d = remote::check_request_fits(bad, steps, grant);
    CHECK(d.why == why);
    CHECK(d.what == what);
  };
  auto bad = r;
  bad.rows = 65;
  refused(bad, refusal::out_of_range, "a share larger than the grant");
  bad = r;
  bad.win.length = 17;
  refused(bad, refusal::out_of_range, "a share larger than the grant");
  bad = r;
  bad.column_address.pop_back();
  refused(bad, refusal::mismatch, "column count");
  bad = r;
  bad.reply_bytes += 1;
  refused(bad, refusal::out_of_range, "reply past the slice");
  bad = r;
  bad.reply_offset = (1 << 20) - 8;
  refused(bad, refusal::out_of_range, "reply past the slice");
  bad = r;
  bad.column_address[0] = bad.batch_address - 1;  // before the batch
  refused(bad, refusal::out_of_range, "column 0 past the batch");
  bad = r;
  bad.column_address[1] = bad.batch_address + bad.batch_bytes - 32 * 8 * 4 + 1;  // one byte past
  refused(bad, refusal::out_of_range, "column 1 past the batch");
  bad = r;
  bad.column_address[1] = ~std::uint64_t{0};  // would wrap
  refused(bad, refusal::out_of_range, "column 1 past the batch");
  bad = r;
  bad.column_address[1] = bad.batch_address + bad.batch_bytes - 32 * 8 * 4;  // the last that fits
  CHECK(remote::check_request_fits(bad, steps, grant));
}
