#pragma once
// Shared by the host suite's files (host_tests.cpp, host_removal_tests.cpp): the storage::host
// buffer of the test spec, inserting recorded trajectories, the buffer's observable fingerprint and
// the check that an error leaves it unchanged.

#include <doctest/doctest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"

namespace host_test {

using namespace gear_test;
using host_buffer =
    gear::replay_buffer<spec, gear::storage::host, gear::select::uniform, gear::transport::local>;

inline std::vector<std::int64_t> random_lengths(std::mt19937_64& gen, std::size_t n,
                                                std::int64_t max) {
  std::uniform_int_distribution<std::int64_t> d(1, max);
  std::vector<std::int64_t> out(n);
  for (auto& l : out) l = d(gen);
  return out;
}

template <class Buffer>
std::vector<gear::key> insert(Buffer& buf, model& m, const std::vector<std::int64_t>& lens) {
  packed p(m.next_id, lens);
  m.next_id += lens.size();
  std::vector<gear::key> keys(lens.size());
  buf.insert(p.input(), keys);
  for (std::size_t i = 0; i < keys.size(); ++i) m.record(keys[i], p.ids[i], p.lengths[i]);
  return keys;
}

/// Everything observable about a buffer: sizes, per-slot metadata (ticket(slot), length(slot)),
/// the stored bytes.
struct fingerprint {
  std::int64_t size;
  std::uint64_t tickets_issued;
  std::vector<std::int64_t> lengths;
  std::vector<std::uint64_t> tickets;
  std::vector<std::byte> bytes;
  bool operator==(const fingerprint&) const = default;
};

template <class Buffer>
fingerprint take_fingerprint(const Buffer& buf) {
  fingerprint f{buf.size(), buf.tickets_issued(), {}, {}, {}};
  auto r = buf.ref(gear::op::write_steps{});
  for (std::int64_t s = 0; s < buf.capacity(); ++s) {
    f.lengths.push_back(buf.length(s));
    f.tickets.push_back(buf.ticket(s));
    for (std::int64_t t = 0; t < buf.length(s); ++t) {
      const auto* o = reinterpret_cast<const std::byte*>(r.template step<0>(s, t));
      f.bytes.insert(f.bytes.end(), o, o + spec::step_bytes[0]);
      const auto* i = reinterpret_cast<const std::byte*>(r.template step<3>(s, t));
      f.bytes.insert(f.bytes.end(), i, i + spec::step_bytes[3]);
    }
  }
  return f;
}

/// Checks that f throws the gear::error `code` and leaves the buffer as it was; returns the
/// error's message ("" if none was thrown).
template <class Buffer, class F>
std::string expect_error(Buffer& buf, gear::errc code, F&& f) {
  const fingerprint before = take_fingerprint(buf);
  bool thrown = false;
  std::string what;
  try {
    f();
  } catch (const gear::error& e) {
    thrown = true;
    what = e.what();
    CHECK_MESSAGE(e.code() == code, "got " << e.what());
    CHECK(std::string(e.what()).find(std::string(gear::to_string(code))) != std::string::npos);
  }
  CHECK_MESSAGE(thrown, "expected gear::error " << gear::to_string(code));
  CHECK(take_fingerprint(buf) == before);
  return what;
}

/// Samples `rows` rows of window w with a gear::rng of `seed`; the model's verdict ("" if right).
template <class Buffer>
std::string sample_checked(Buffer& buf, const model& m, std::int64_t rows, const gear::window& w,
                           std::uint64_t seed) {
  auto out = buf.make_batch(gear::batch_size{rows}, gear::window_length{w.length});
  gear::rng g{seed};
  buf.sample(out, w, g);
  return m.check(copy_host_batch(out), w);
}

/// Samples batches of `rows` until the buffer is empty; returns how often each id came back.
template <class Buffer>
std::map<std::uint64_t, int> drain(Buffer& buf, const model& m, std::int64_t rows, int max_calls) {
  std::map<std::uint64_t, int> seen;
  auto out = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
  gear::rng g{77};
  for (int call = 0; call < max_calls && buf.size() > 0; ++call) {
    buf.sample(out, gear::window{}, g);
    const host_batch h = copy_host_batch(out);
    for (auto k : h.keys) ++seen[m.id(k)];
  }
  return seen;
}

}  // namespace host_test
