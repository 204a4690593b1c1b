// One logical replay buffer over several processes: shards hold the trajectories, actors insert
// into them with one-sided writes, a learner samples them as one buffer (each shard selects its
// share; probabilities are the union's) and sends priority updates back to the shards that own
// the keys. Every role is a gear::replay_buffer with transport::libfabric: a shard has storage,
// actors and the learner have storage::none. One program, three roles; run.sh starts them on one
// machine. Across machines, give every process the same provider and each shard's blob file (any
// shared directory or copy).
//
//   distributed shard   <dir> <id> [provider]     serves until <dir>/stop appears
//   distributed actor   <dir> <shards> <first id> <count> [provider]
//   distributed learner <dir> <shards> <batches> [provider]
//
// The provider is a libfabric provider name: "tcp;ofi_rxm" (default), "shm" (one host),
// "verbs;ofi_rxm" (InfiniBand), "efa" (AWS). Host storage here: the example runs without a GPU.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <gear/distributed.hpp>
#include <iterator>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

using spec = gear::spec<gear::column<"obs", float, 16>, gear::column<"reward", float>>;
using selection = gear::select::prioritized;
using shard_t =
    gear::replay_buffer<spec, gear::storage::host, selection, gear::transport::libfabric>;
using client_t =
    gear::replay_buffer<spec, gear::storage::none, selection, gear::transport::libfabric>;
constexpr std::int64_t max_length = 32;
namespace fs = std::filesystem;

/// The transport every role shares: provider, token (the same for every process of a job).
gear::transport::libfabric transport_of(int argc, char** argv, int at) {
  gear::transport::libfabric t;
  if (argc > at) t.fabric.provider = argv[at];
  const char* token = std::getenv("GEAR_EXAMPLE_TOKEN");
  t.token = token != nullptr ? token : "example-token";
  return t;
}

/// Waits (at most 60 s) for a file to appear; its bytes.
std::vector<std::byte> wait_for(const fs::path& file) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(file)) {
    if (std::chrono::steady_clock::now() > until)
      throw std::runtime_error("no " + file.string() + " within 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // written whole (renamed in)
  std::ifstream in(file, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

std::vector<std::vector<std::byte>> blobs(const fs::path& dir, int shards) {
  std::vector<std::vector<std::byte>> out;
  for (int s = 0; s < shards; ++s)
    out.push_back(wait_for(dir / ("shard" + std::to_string(s) + ".blob")));
  return out;
}

int shard(const fs::path& dir, std::uint32_t id, gear::transport::libfabric t) {
  t.shard = id;
  shard_t buf{gear::capacity{4096}, gear::max_length{max_length}, selection{}, t};
  const fs::path blob = dir / ("shard" + std::to_string(id) + ".blob");
  {
    std::ofstream out(blob.string() + ".tmp", std::ios::binary);
    out.write(reinterpret_cast<const char*>(buf.address().data()),
              static_cast<std::streamsize>(buf.address().size()));
  }
  fs::rename(blob.string() + ".tmp", blob);
  std::printf("shard %u: serving on %s\n", id, t.fabric.provider.c_str());
  std::fflush(stdout);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(dir / "stop") && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto stats = buf.stats();
  std::printf("shard %u: %lld trajectories stored, %llu inserted, %llu refused\n", id,
              static_cast<long long>(buf.size()), static_cast<unsigned long long>(stats.inserted),
              static_cast<unsigned long long>(stats.refused.total()));
  return stats.refused.total() == 0 ? 0 : 1;
}

int actor(const fs::path& dir, int shards, std::int64_t first, std::int64_t count,
          gear::transport::libfabric t) {
  t.shards = blobs(dir, shards);
  client_t client(t);
  std::vector<std::int64_t> lengths;
  std::vector<float> obs, reward;
  for (std::int64_t i = first; i < first + count; ++i) {
    lengths.push_back(1 + i % max_length);
    for (std::int64_t s = 0; s < lengths.back(); ++s) {
      for (int k = 0; k < 16; ++k) obs.push_back(static_cast<float>(i + s + k));
      reward.push_back(static_cast<float>(i % 7));
    }
  }
  // Half with their keys (the call waits for the shards), half without (the call returns once
  // the writes are posted; flush waits for the acknowledgements, and throws a shard's refusal).
  const std::size_t half = lengths.size() / 2;
  std::vector<gear::key> keys(half);
  std::int64_t steps = 0;
  for (std::size_t i = 0; i < half; ++i) steps += lengths[i];
  const std::span<const std::int64_t> all(lengths);
  if (half > 0)
    client.insert({all.first(half), {gear::input(obs.data(), {16}), gear::input(reward.data())}},
                  keys);
  client.insert({all.subspan(half),
                 {gear::input(obs.data() + steps * 16, {16}), gear::input(reward.data() + steps)}});
  client.flush();
  // One more, step by step, as an environment loop would write it.
  auto w = client.make_writer();
  for (std::int64_t s = 0; s < 5; ++s) {
    float o[16] = {};
    const float r = 1.0f;
    w.append(o, &r);
  }
  const gear::key k = w.commit();
  std::printf("actor: %lld trajectories stored over %d shards, the last one at shard %u\n",
              static_cast<long long>(count + 1), shards, k.shard);
  return 0;
}

int learner(const fs::path& dir, int shards, std::int64_t batches, gear::transport::libfabric t) {
  t.shards = blobs(dir, shards);
  t.max_batch = 256;
  t.max_window = 8;
  client_t client(t, selection{.alpha = 0.6, .beta = 0.4});
  auto batch = client.make_batch(gear::batch_size{256}, gear::window_length{8});
  gear::rng g{1};
  std::vector<float> priorities(256);
  for (std::int64_t b = 0; b < batches; ++b) {
    client.sample(batch, gear::window{.length = 8, .from = gear::anchor::random}, g);
    // A "TD error" per row: the mean reward of its window, as the next priority.
    const auto reward = batch.column<"reward">();
    const auto mask = batch.mask();
    for (std::int64_t r = 0; r < 256; ++r) {
      float sum = 0;
      for (std::int64_t s = 0; s < 8; ++s) sum += mask(r, s) ? reward(r, s) : 0.0f;
      priorities[static_cast<std::size_t>(r)] = 0.1f + sum / 8;
    }
    const auto keys = batch.keys();
    const gear::priority_update_result u =
        client.update_priorities({keys.data(), keys.size()}, priorities);
    if ((b + 1) % 10 == 0)
      std::printf("learner: batch %lld of %lld, %lld priorities applied, %lld stale\n",
                  static_cast<long long>(b + 1), static_cast<long long>(batches),
                  static_cast<long long>(u.applied), static_cast<long long>(u.stale));
  }
  std::printf("learner: %lld trajectories in the union\n", static_cast<long long>(client.size()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string role = argc > 1 ? argv[1] : "";
    if (role == "shard" && argc >= 4)
      return shard(argv[2], std::atoi(argv[3]), transport_of(argc, argv, 4));
    if (role == "actor" && argc >= 6)
      return actor(argv[2], std::atoi(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]),
                   transport_of(argc, argv, 6));
    if (role == "learner" && argc >= 5)
      return learner(argv[2], std::atoi(argv[3]), std::atoll(argv[4]), transport_of(argc, argv, 5));
    std::fprintf(stderr, "usage: see the top of examples/distributed/distributed.cpp\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argc > 1 ? argv[1] : "distributed", e.what());
    return 1;
  }
}
