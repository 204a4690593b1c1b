#pragma once
// sharded_buffer's view of its shards' selection: the policy they select with now (their
// exponents agree), the snapshot of their masses a sample splits by, and the sample's
// probabilities and weights made those of the union.

#include <cstddef>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/remote/split.hpp>
#include <gear/detail/shard_streams.hpp>
#include <gear/error.hpp>
#include <string>
#include <vector>

namespace gear::detail {

/// The policy the shards select with now: `built` (the sharded buffer's, as constructed) with
/// the exponents every shard has (shard(s).selection_state().set_exponents changes one shard's).
/// Throws errc::invalid_argument if two shards' exponents differ: the union's law would be
/// neither's.
template <class Selection, class Shards>
Selection common_selection(const Selection& built, const Shards& shards) {
  if constexpr (requires { built.alpha; }) {
    Selection now = built;
    for (std::size_t s = 0; s < shards.size(); ++s) {
      const auto& p = shards[s]->selection_state().policy();
      GEAR_REQUIRE(s == 0 || (p.alpha == now.alpha && p.beta == now.beta), errc::invalid_argument,
                   "shard " + std::to_string(s) + " has exponents alpha " +
                       std::to_string(p.alpha) + ", beta " + std::to_string(p.beta) +
                       " and shard 0 alpha " + std::to_string(now.alpha) + ", beta " +
                       std::to_string(now.beta) +
                       ": set them on every shard at once (sharded_buffer::set_exponents)");
      now.alpha = p.alpha;
      now.beta = p.beta;
    }
    return now;
  } else {
    return built;
  }
}

/// sharded_buffer's masses to split a sample by, into `snapshot`: sizes (uniform: size() counts
/// a device shard's landing inserts, which its sample draws from only once published, so until
/// then such a shard gets rows in proportion to more than it draws from; each row's reported
/// probability is still exact for how it was drawn); the host
/// tree's root (storage::host); on the GPU, the root each shard's last sample read back once it
/// has arrived (until then the one before), read at once (synchronising with `stream`) by the
/// first sample, after a failed one (`fresh` false), and for a shard whose last snapshot found
/// it empty or without mass (a read-back from before its first trajectories would otherwise
/// keep them out of the next sample; a shard whose priorities are all 0 is read every time).
/// The other way round stays approximate: a shard whose priorities all became 0 since its last
/// read-back still gets rows by its old mass for one sample, and a tree of zeros draws those
/// uniformly (probabilities reported as drawn).
/// A host tree's root is read while calls through shard(s) may change the tree: total() reads
/// the copy of it the state keeps atomic.
template <bool Prioritized, bool OnDevice, class Shards>
void take_shard_snapshot(Shards& shards, const std::vector<int>& devices, shard_streams& streams,
                         std::vector<remote::shard_share>& snapshot, bool fresh,
                         cuda::stream_ref stream) {
  bool forked = false;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::int64_t size = shards[s]->size();
    if constexpr (!Prioritized) {
      snapshot[s] = {static_cast<double>(size), size, true};
    } else if constexpr (!OnDevice) {
      snapshot[s] = {size > 0 ? shards[s]->selection_state().total() : 0.0, size, true};
    } else {
      double mass = snapshot[s].mass;  // kept while a newer read-back is on its way
      const bool had_none = snapshot[s].size == 0 || !(snapshot[s].mass > 0);
      if (size == 0) {
        mass = 0;
      } else if (!fresh || had_none || (!streams.mass_read(s, mass) && !streams.mass_sent(s))) {
        if (!forked) streams.fork(stream);  // on the caller's device, before any scope
        forked = true;
        streams.start(s);
        const device_scope scope(devices[s]);
        mass = shards[s]->selection_state().total(streams.of(s));  // synchronises
      }
      snapshot[s] = {mass, size, true};
    }
  }
}

/// Turns the shards' local probabilities into global ones and writes the union's weights
/// (sharded_buffer's sample, once every shard wrote its rows).
template <bool OnDevice, class Parts>
void make_global(float* probabilities, float* weights, const Parts& parts, double beta,
                 cuda::stream_ref stream) {
  if constexpr (OnDevice) {
#if defined(GEAR_DEVICE_BACKEND)
    globalize_on_device(probabilities, weights, parts, beta, stream);
#else
    static_assert(!OnDevice, "gear: a sharded GPU buffer needs <gear/gear.cuh>, compiled by nvcc");
#endif
  } else {
    (void)stream;
    globalize_on_host(probabilities, weights, parts, beta);
  }
}

}  // namespace gear::detail
