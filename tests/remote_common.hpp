#pragma once
// Shared by the distributed-buffer tests (host and GPU shards): a spec whose rows say which
// trajectory they came from, and trajectories of it packed for an insert.

#include <cstdint>
#include <gear/insert.hpp>
#include <gear/spec.hpp>
#include <vector>

namespace remote_test {

using spec = gear::spec<gear::column<"id", std::int64_t>, gear::column<"obs", float, 4>>;

/// Element k of step `step` of trajectory `id`.
inline float obs_of(std::int64_t id, std::int64_t step, int k) {
  return static_cast<float>(id * 1000 + step * 10 + k);
}

/// Trajectories with ids `ids`, trajectory i of length 1 + i % max_length, packed.
struct packed {
  std::vector<std::int64_t> lengths, id;
  std::vector<float> obs;
  packed(const std::vector<std::int64_t>& ids, std::int64_t max_length) {
    for (std::int64_t i : ids) {
      lengths.push_back(1 + i % max_length);
      for (std::int64_t s = 0; s < lengths.back(); ++s) {
        id.push_back(i);
        for (int k = 0; k < 4; ++k) obs.push_back(obs_of(i, s, k));
      }
    }
  }
  [[nodiscard]] gear::trajectories<spec> view() const {
    return {lengths, {gear::input(id.data()), gear::input(obs.data(), {4})}};
  }
};

}  // namespace remote_test
