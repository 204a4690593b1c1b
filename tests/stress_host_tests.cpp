// Stress, host storage: 8 threads insert, write, sample, update priorities and erase on one
// buffer with no lock of their own (tests/stress.hpp). CI builds this suite with ThreadSanitizer;
// GEAR_STRESS_OPS sets the operations per thread (default 2500: 2 * 10^4 in all).

#include <gear/gear.hpp>
#include <gear/sharded_buffer.hpp>

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdlib>

#include "stress.hpp"

namespace {

struct no_streams {
  cuda::stream_ref get(int) const { return gear::detail::no_stream(); }
  void sync(int) const {}
};

template <class Batch>
struct host_view {
  std::span<const gear::key> keys;
  std::span<const std::uint8_t> mask;
  std::span<const std::int64_t> v;
};

/// A batch's keys, mask and column 0, where they already are (host memory).
constexpr auto host_fetch = [](auto& batch, cuda::stream_ref) {
  const std::int64_t n = batch.batch_size() * batch.window_length();
  return host_view<void>{
      {batch.keys_data(), static_cast<std::size_t>(batch.batch_size())},
      {batch.mask_data(), static_cast<std::size_t>(n)},
      {reinterpret_cast<const std::int64_t*>(batch.column_data(0)), static_cast<std::size_t>(n * 3)}};
};

}  // namespace

TEST_CASE("stress: 8 threads on one host buffer, no lock of theirs: no torn or mislabeled row") {
  const char* env = std::getenv("GEAR_STRESS_OPS");
  const std::int64_t ops = env != nullptr ? std::atoll(env) : 2500;
  gear::replay_buffer<gear_stress::spec, gear::storage::host, gear::select::prioritized> buf{
      gear::capacity{256}, gear::max_length{gear_stress::max_len}};
  no_streams streams;
  const auto r = gear_stress::run(buf, 8, ops, 42, streams, host_fetch);
  gear_stress::check(r, 8, ops);
}

TEST_CASE("stress: 8 threads on one sharded host buffer (3 shards), no lock of theirs") {
  const char* env = std::getenv("GEAR_STRESS_OPS");
  const std::int64_t ops = env != nullptr ? std::atoll(env) : 2500;
  gear::sharded_buffer<gear_stress::spec, gear::storage::host, gear::select::prioritized> buf(
      {0, 0, 0}, gear::capacity{96}, gear::max_length{gear_stress::max_len}, {},
      gear::insert_route::round_robin);
  no_streams streams;
  const auto r = gear_stress::run(buf, 8, ops, 43, streams, host_fetch);
  gear_stress::check(r, 8, ops);
}
