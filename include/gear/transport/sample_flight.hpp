#pragma once
// gear::transport::sample_flight: what a remote learner (remote_learner.hpp) keeps for one sample
// between sample_begin and sample_end, and flight_spares, the storage of ended ones kept for the
// next, so that a learner's sample allocates nothing once its sizes were seen.

#include <cstddef>
#include <cstdint>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/split.hpp>
#include <gear/transport/fabric_memory.hpp>
#include <gear/transport/reply_slice.hpp>
#include <utility>
#include <vector>

namespace gear::transport {

/// A sample in flight: its batch, its reply area, each shard's rows and reply layout, the mass
/// M split by.
template <class Batch>
struct sample_flight {
  Batch* out = nullptr;
  std::size_t area = 0;
  fabric::region grant{};         // its batch's columns, registered for it alone
  std::vector<std::size_t> sent;  // the shards it asked
  std::vector<std::int64_t> share;
  std::vector<detail::remote::reply_layout> layouts;
  std::vector<detail::remote::shard_share> split;  // the snapshot it was split by
  double total = 0;
};

/// Ended flights, their vectors' capacity kept. A learner has at most max_samples_in_flight
/// flights begun or spare together, and room for them all here: recycle never allocates.
template <class Batch>
class flight_spares {
 public:
  flight_spares() { spare_.reserve(max_samples_in_flight); }

  /// A flight in an ended one's storage (every field to be set anew), or a new one.
  [[nodiscard]] sample_flight<Batch> take() {
    if (spare_.empty()) return {};
    sample_flight<Batch> f = std::move(spare_.back());
    spare_.pop_back();
    f.sent.clear();
    return f;
  }
  void recycle(sample_flight<Batch>&& f) noexcept {
    f.out = nullptr;
    f.area = 0;
    f.grant = {};
    spare_.push_back(std::move(f));
  }

 private:
  std::vector<sample_flight<Batch>> spare_;
};

}  // namespace gear::transport
