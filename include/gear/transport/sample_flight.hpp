#pragma once
// gear::transport::sample_flight: what a remote learner (remote_learner.hpp) keeps for one sample
// between sample_begin and sample_end (and unpack_reply, which completes its batch from a shard's
// reply), and flight_spares, the storage of ended ones kept for the
// next, so that a learner's sample allocates nothing once its sizes were seen; and
// check_sample_request, what a sample's arguments must be.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <gear/batch.hpp>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/split.hpp>
#include <gear/key.hpp>
#include <gear/transport/fabric_memory.hpp>
#include <gear/transport/reply_slice.hpp>
#include <gear/window.hpp>
#include <string>
#include <utility>
#include <vector>

namespace gear::transport {

/// Throws unless a sample into `out` of window `w` suits a learner whose shards hold trajectories
/// of up to `shortest` steps and whose slices hold `max_batch` rows of `max_window` steps:
/// errc::batch_mismatch (a batch moved from, or of another window length), errc::wrong_memory
/// (not in host memory), errc::empty_window, errc::window_out_of_range (as a buffer's sample; also
/// a window longer than `shortest`, which the shards refuse), errc::invalid_argument (too large).
template <class Batch>
void check_sample_request(const Batch& out, const window& w, std::int64_t shortest,
                          std::int64_t max_batch, std::int64_t max_window) {
  detail::check_batch_memory(out);
  GEAR_REQUIRE(host_accessible(out.where()), errc::wrong_memory,
               "a remote learner fills batches in host memory");
  GEAR_REQUIRE(w.length == out.window_length(), errc::batch_mismatch,
               "the window has " + std::to_string(w.length) + " steps, the batch " +
                   std::to_string(out.window_length()));
  detail::check_window(w, shortest);
  GEAR_REQUIRE(w.length <= shortest, errc::window_out_of_range,
               "a remote sample's window is at most the shards' max_length (" +
                   std::to_string(shortest) + " steps), got " + std::to_string(w.length));
  GEAR_REQUIRE(out.batch_size() <= max_batch && out.window_length() <= max_window,
               errc::invalid_argument,
               "this learner's slices hold " + std::to_string(max_batch) + " rows of " +
                   std::to_string(max_window) + " steps");
}

/// A sample in flight: its batch, its reply area, each shard's rows and reply layout, the mass
/// M split by.
template <class Batch>
struct sample_flight {
  Batch* out = nullptr;
  std::size_t area = 0;
  std::vector<fabric::region> grants;  // its batch's columns, registered for it alone: on each
                                       // inlet its shards write into (remote_client.hpp)
  std::vector<std::size_t> sent;  // the shards it asked (or will: held)
  bool held = false;              // its requests are held back (held_requests.hpp)
  std::vector<std::int64_t> share;
  std::vector<detail::remote::reply_layout> layouts;
  std::vector<detail::remote::shard_share> split;  // the snapshot it was split by
  double total = 0;

  /// True when shard s was asked for its rows (or will be: held).
  [[nodiscard]] bool asked(std::size_t s) const noexcept {
    return std::find(sent.begin(), sent.end(), s) != sent.end();
  }
};

/// Copies one shard's k rows' mask, keys and probabilities (made global: that shard's mass in the
/// split, the split's `total`) from its reply's meta part `from` (layout l) into rows
/// [at, at + k) of `out` and of `probabilities`; their columns are there already.
template <class Batch>
void unpack_reply(Batch& out, const std::byte* from, const detail::remote::reply_layout& l,
                  std::int64_t at, std::int64_t k, double shard_mass, double total,
                  std::vector<double>& probabilities) {
  const auto length = static_cast<std::size_t>(out.window_length());
  const auto first = static_cast<std::size_t>(at), rows = static_cast<std::size_t>(k);
  std::memcpy(out.mask_data() + first * length, from + l.mask_at, rows * length);
  std::memcpy(out.keys_data() + first, from + l.keys_at, rows * sizeof(key));
  for (std::size_t i = 0; i < rows; ++i) {
    float local = 0;
    std::memcpy(&local, from + l.probabilities_at + i * sizeof(float), sizeof(float));
    const double p = detail::remote::global_probability(shard_mass, total, local);
    probabilities[first + i] = p;
    out.probabilities_data()[first + i] = static_cast<float>(p);
  }
}

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
    f.held = false;
    return f;
  }
  void recycle(sample_flight<Batch>&& f) noexcept {
    f.out = nullptr;
    f.area = 0;
    f.grants.clear();  // (deregistered by then: end_grant)
    spare_.push_back(std::move(f));
  }

 private:
  std::vector<sample_flight<Batch>> spare_;
};

}  // namespace gear::transport
