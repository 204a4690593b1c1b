// Built by the three consumer projects in this folder (add_subdirectory, FetchContent,
// find_package) with a plain C++ compiler: a host-storage buffer round trip through gear::gear.
#include <cstdio>
#include <gear/gear.hpp>
#include <vector>

using spec = gear::spec<gear::column<"obs", float, 3>, gear::column<"action", std::int32_t>>;
using buffer =
    gear::replay_buffer<spec, gear::storage::host, gear::select::uniform, gear::transport::local>;

int main() {
  buffer buf{gear::capacity{8}, gear::max_length{4}};
  const std::vector<std::int64_t> lengths{4, 2};
  std::vector<float> obs(6 * 3);
  std::vector<std::int32_t> action(6);
  for (int t = 0; t < 6; ++t) {
    action[t] = t;
    for (int e = 0; e < 3; ++e) obs[t * 3 + e] = static_cast<float>(10 * t + e);
  }
  std::vector<gear::key> keys(2);
  buf.insert({lengths, {gear::input(obs.data(), {3}), gear::input(action.data())}}, keys);

  auto batch = buf.make_batch(gear::batch_size{16}, gear::window_length{2});
  gear::rng rng{7};
  buf.sample(batch, gear::window{.length = 2, .from = gear::anchor::end}, rng);
  // Every row must end with the last step of its trajectory: action 3 (first) or 5 (second).
  for (std::int64_t r = 0; r < 16; ++r) {
    const std::int32_t last = batch.column<"action">()(r, 1);
    const bool first = batch.keys()[r] == keys[0];
    if (last != (first ? 3 : 5) || batch.column<"obs">()(r, 1, 2) != 10.0f * last + 2) {
      std::printf("consumer: wrong row %lld\n", static_cast<long long>(r));
      return 1;
    }
  }
  std::printf("gear %s: inserted %lld trajectories, sampled %lld rows correctly\n",
              gear::version_string, static_cast<long long>(buf.size()),
              static_cast<long long>(batch.batch_size()));
  return 0;
}
