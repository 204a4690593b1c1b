// The distributed buffer with GPU shards (storage::device and mixed, prioritized), in one process
// over tcp;ofi_rxm loopback: a client's inserts land in device memory; its samples carry the
// bytes its keys name (the shard samples on its own stream and copies its share to the host);
// its priority updates and erases land on the device shard; a key a shard's own device sample
// returns (shard id and incarnation) is accepted by a priority update from device memory; a key
// of another incarnation fails that update on the GPU and changes nothing.
// Exits 77 (skipped) where no GPU is usable.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <gear/gear.cuh>
// The transport after gear.cuh: a GPU shard calls its buffer on a stream.
#include <gear/distributed.hpp>
#include <map>
#include <vector>

#include "gpu_common.cuh"
#include "remote_common.hpp"

namespace {

using remote_test::spec;
using selection = gear::select::prioritized;
constexpr std::int64_t max_length = 5;

using remote_test::obs_of;
/// Trajectories of ids `ids` (trajectory i of length 1 + i % max_length).
struct packed : remote_test::packed {
  explicit packed(const std::vector<std::int64_t>& ids) : remote_test::packed(ids, max_length) {}
};

template <class T>
std::vector<T> to_host(const T* p, std::int64_t n) {
  std::vector<T> out(static_cast<std::size_t>(n));
  GEAR_CUDA_TRY(cudaMemcpy(out.data(), p, out.size() * sizeof(T), cudaMemcpyDefault));
  return out;
}

template <class Storage>
void device_shard() {
  using shard_t = gear::replay_buffer<spec, Storage, selection, gear::transport::libfabric>;
  using client_t =
      gear::replay_buffer<spec, gear::storage::none, selection, gear::transport::libfabric>;
  gear::transport::libfabric st;
  st.shard = 2;
  st.token = "gpu";
  shard_t shard(gear::capacity{32}, gear::max_length{max_length}, selection{}, st);
  gear::transport::libfabric ct;
  ct.token = "gpu";
  ct.deadline = std::chrono::milliseconds(10000);
  ct.max_batch = 64;
  ct.max_window = max_length;
  ct.shards = {shard.address()};
  client_t client(ct);

  const packed in({1, 2, 3, 4, 5, 6});
  std::vector<gear::key> keys(6);
  client.insert(in.view(), keys);
  std::map<std::uint64_t, std::int64_t> id_of;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CHECK(keys[i].shard == 2);
    CHECK(keys[i].incarnation == shard.incarnation());
    CHECK(shard.contains(keys[i]));
    id_of[keys[i].ticket] = static_cast<std::int64_t>(i) + 1;
  }
  CHECK(shard.size() == 6);

  // Remote samples from the device shard: bytes as the keys say, probabilities in (0, 1].
  auto b = client.make_batch(gear::batch_size{48}, gear::window_length{1});
  gear::rng g{11};
  for (int round = 0; round < 5; ++round) {
    client.sample(b, gear::window{1, 0}, g);
    for (std::int64_t r = 0; r < 48; ++r) {
      const gear::key k = b.keys_data()[r];
      REQUIRE(id_of.count(k.ticket) == 1);
      CHECK(k.incarnation == shard.incarnation());
      CHECK(b.column<0>()(r, 0) == id_of[k.ticket]);
      CHECK(b.column<1>()(r, 0, 3) == obs_of(id_of[k.ticket], 0, 3));
      CHECK(b.probabilities_data()[r] > 0.0f);
      CHECK(b.probabilities_data()[r] <= 1.0f);
    }
  }

  // Remote priority update: the device shard's priorities change; a row sampled afterwards
  // follows them (trajectory 1 at 1000, the rest near 0: every row is trajectory 1).
  std::vector<float> p(6, 1e-6f);
  p[0] = 1000.0f;
  const auto r = client.update_priorities(keys, p);
  CHECK(r.applied == 6);
  client.sample(b, gear::window{1, 0}, g);
  int hits = 0;
  for (std::int64_t row = 0; row < 48; ++row) hits += b.keys_data()[row] == keys[0];
  CHECK(hits >= 46);

  // The shard's own device sample names it; those keys, in device memory, update on the GPU.
  gear_test::stream_holder s;
  auto lb = shard.make_batch(gear::batch_size{8}, gear::window_length{1});
  shard.sample(lb, gear::window{1, 0}, g, s);
  const auto local = to_host(lb.keys_data(), 8);
  for (const gear::key& k : local) {
    CHECK(k.shard == 2);
    CHECK(k.incarnation == shard.incarnation());
  }
  std::vector<float> ones(8, 1.0f);
  gear::detail::allocation dp(gear::memory_kind::device, 8 * sizeof(float));
  GEAR_CUDA_TRY(cudaMemcpy(dp.data(), ones.data(), 8 * sizeof(float), cudaMemcpyHostToDevice));
  shard.update_priorities(std::span<const gear::key>(lb.keys_data(), 8),
                          std::span<const float>(dp.as<const float>(), 8),
                          gear::memory_kind::device, s);
  // A key of another incarnation, from device memory: the update fails on the GPU, changes
  // nothing.
  const auto before = shard.selection_state().priorities(s);
  gear::key stale = local[0];
  stale.incarnation ^= 1;
  gear::detail::allocation dk(gear::memory_kind::device, sizeof(gear::key));
  GEAR_CUDA_TRY(cudaMemcpy(dk.data(), &stale, sizeof stale, cudaMemcpyHostToDevice));
  CHECK_THROWS_WITH_AS(
      shard.update_priorities(std::span<const gear::key>(dk.as<const gear::key>(), 1),
                              std::span<const float>(dp.as<const float>(), 1),
                              gear::memory_kind::device, s),
      doctest::Contains("is not in this shard"), gear::error);
  const auto after = shard.selection_state().priorities(s);  // NaN marks a slot with none
  REQUIRE(after.size() == before.size());
  CHECK(std::memcmp(after.data(), before.data(), after.size() * sizeof(float)) == 0);

  // Remote erase from the device shard.
  const auto e = client.erase(std::vector<gear::key>{keys[4], keys[5]});
  CHECK(e.applied == 2);
  CHECK_FALSE(shard.contains(keys[4]));
  CHECK(shard.size() == 4);
  CHECK(client.size() == 4);
  CHECK(shard.stats().inserted == 6);
}

}  // namespace

TEST_CASE("a device shard serves a client's inserts, samples, updates and erases") {
  device_shard<gear::storage::device>();
}
TEST_CASE("a mixed shard serves a client's inserts, samples, updates and erases") {
  device_shard<gear::storage::mixed<gear::storage::pinned_host, gear::storage::device>>();
}

int main(int argc, char** argv) {
  if (!gear::detail::gpu_available()) {
    std::printf("remote_gpu_tests: no GPU; skipping\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
