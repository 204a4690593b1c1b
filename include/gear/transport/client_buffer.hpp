#pragma once
// A pure actor or learner of a distributed buffer:
// replay_buffer<Spec, storage::none, Selection, transport::libfabric>. It stores nothing; its
// calls go to the shards whose address blobs its transport names (transport::libfabric::shards):
//
//   insert, make_writer       to the shards as the transport routes them (remote_actor.hpp):
//                             one-sided writes into each shard's staging for this client,
//                             published by completion data, acknowledged with their keys;
//   sample, sample_begin/end  the batch split across the shards by their selection masses, each
//                             shard selecting and gathering its share (remote_learner.hpp), with
//                             probabilities and importance weights over the union;
//   update_priorities, erase  to the shard each key names;
//   size                      every shard's status.
//
// The actor side connects at the first insert (or writer), the learner side at the first sample
// (or update, erase, size): a client that only inserts never greets the shards as a learner.
// Connecting waits for every shard's welcome, bounded by the transport's deadline.
//
// Threads: calls may come from any thread; the actor side and the learner side each serve one
// call at a time (a mutex each), so an actor thread and a learner thread do not wait for each
// other. Every wait is bounded by the deadline: errc::timeout (no staging space at a shard) or
// errc::peer_lost (a shard that does not answer), naming the shard.

#include <algorithm>
#include <cstdint>
#include <gear/batch.hpp>
#include <gear/detail/remote/blob.hpp>
#include <gear/detail/shard_routing.hpp>
#include <gear/error.hpp>
#include <gear/insert.hpp>
#include <gear/key.hpp>
#include <gear/priority_update.hpp>
#include <gear/replay_buffer.hpp>
#include <gear/rng.hpp>
#include <gear/select/prioritized.hpp>
#include <gear/storage/none.hpp>
#include <gear/strong_types.hpp>
#include <gear/transport/libfabric.hpp>
#include <gear/transport/remote_actor.hpp>
#include <gear/transport/remote_learner.hpp>
#include <gear/transport/remote_writer.hpp>
#include <gear/window.hpp>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace gear {

template <trajectory_spec Spec, class Selection>
class replay_buffer<Spec, storage::none, Selection, transport::libfabric> {
 public:
  using spec_type = Spec;
  using storage_type = storage::none;
  using selection_type = Selection;
  using transport_type = transport::libfabric;
  using batch_type = batch<Spec>;
  using writer_type = transport::remote_writer<replay_buffer>;
  static constexpr bool on_device = false;
  static constexpr memory_kind batch_memory = memory_kind::host;

  /// What this client did.
  struct counters {
    std::uint64_t inserted = 0;  ///< trajectories stored at a shard (keyed), or posted (keyless)
    std::uint64_t samples = 0, sampled_rows = 0;
    std::uint64_t updated = 0, erased = 0, stale = 0;  ///< pairs applied, removed, skipped
  };

  /// Checks every shard's address blob (no fabric traffic yet). Throws errc::invalid_argument
  /// (no shards, a blob that does not parse, max_batch or max_window below 1, a prioritized
  /// policy's exponents negative or not finite).
  explicit replay_buffer(transport::libfabric t, Selection selection = {})
      : transport_(std::move(t)), selection_(selection) {
    if constexpr (requires { selection.alpha; selection.beta; })
      detail::validate_exponents(selection.alpha, selection.beta);  // beta weighs the rows
    GEAR_REQUIRE(!transport_.shards.empty(), errc::invalid_argument,
                 "a client of a distributed buffer (storage::none) needs the address blob of at "
                 "least one shard in transport::libfabric::shards");
    GEAR_REQUIRE(transport_.max_batch >= 1 && transport_.max_window >= 1, errc::invalid_argument,
                 "max_batch and max_window must be at least 1");
    max_length_ = -1;
    for (std::size_t s = 0; s < transport_.shards.size(); ++s) {
      const auto b = detail::remote::parse_blob(transport_.shards[s]);
      GEAR_REQUIRE(b, errc::invalid_argument,
                   "the address blob of shard " + std::to_string(s) + " is refused (" +
                       std::string(detail::remote::to_string(b.why)) + ": " + b.what + ")");
      capacity_ += b.value.capacity;
      max_length_ =
          max_length_ < 0 ? b.value.max_length : std::min(max_length_, b.value.max_length);
    }
  }

  replay_buffer(const replay_buffer&) = delete;
  replay_buffer& operator=(const replay_buffer&) = delete;

  // ---- queries -------------------------------------------------------------------------------

  /// The shards' slots together, and the longest trajectory every shard takes.
  [[nodiscard]] std::int64_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::int64_t max_length() const noexcept { return max_length_; }
  [[nodiscard]] std::uint32_t shard_count() const noexcept { return transport_.shard_count(); }
  [[nodiscard]] const transport::libfabric& transport() const noexcept { return transport_; }
  [[nodiscard]] Selection selection() const noexcept { return selection_; }
  /// Trajectories stored by all shards, as each reports it now (asks every shard). Throws
  /// errc::peer_lost (with skip_lost_shards: leaves a shard it finds lost out, and throws not).
  [[nodiscard]] std::int64_t size() {
    const std::lock_guard held(learner_mutex_);
    return learner().size();
  }
  [[nodiscard]] counters stats() const {
    const std::lock_guard held(stats_mutex_);
    return stats_;
  }

  // ---- insert --------------------------------------------------------------------------------

  /// Inserts whole trajectories (host memory, packed as for a local insert) at the shards the
  /// transport routes them to; writes one key per trajectory, naming its shard, once every one
  /// is stored. Throws, sending nothing: errc::invalid_argument (keys_out too small),
  /// errc::empty_trajectory, errc::trajectory_too_long (past the shard's max_length or its
  /// staging); then errc::timeout (no staging space by the deadline), errc::peer_lost, or
  /// errc::invalid_argument (a shard's buffer refused a trajectory: the others stay stored, and
  /// keys_out holds their keys and gear::no_ticket for those refused; retry only those). After
  /// errc::timeout or errc::peer_lost, trajectories already written may be stored, keys unknown.
  void insert(const trajectories<Spec>& in, std::span<key> keys_out) {
    const std::lock_guard held(actor_mutex_);
    const auto mine = keys_out.first(std::min(keys_out.size(), in.lengths.size()));
    std::fill(mine.begin(), mine.end(), key{no_ticket, 0, 0});  // until a shard says stored
    const auto count_stored = [&] {
      const std::lock_guard count(stats_mutex_);
      for (const key& k : mine) stats_.inserted += k.ticket != no_ticket;
    };
    try {
      actor().insert(in, keys_out);
    } catch (...) {
      count_stored();
      throw;
    }
    count_stored();
  }

  /// Inserts without waiting for the shards' acknowledgements (no keys): returns once the
  /// trajectories are copied out of `in` and their writes posted, up to each shard's staging
  /// ring in flight. A shard's refusal is thrown by the next insert or flush of the thread that
  /// inserted it (errc::invalid_argument, naming each shard and its count); destroying waits for
  /// the acknowledgements (up to the deadline) but reports nothing: flush() first. Throws as
  /// insert(in, keys_out) does, except for keys_out. stats().inserted counts them once posted.
  void insert(const trajectories<Spec>& in) {
    const std::lock_guard held(actor_mutex_);
    actor().insert(in);
    const std::lock_guard count(stats_mutex_);
    stats_.inserted += in.lengths.size();
  }
  /// Waits until every trajectory inserted so far is acknowledged (the deadline bounds it);
  /// throws errc::invalid_argument for those of this thread's a shard refused, errc::peer_lost.
  void flush() {
    const std::lock_guard held(actor_mutex_);
    actor().flush();
  }

  /// A writer that gathers one trajectory's steps here and inserts it at commit.
  [[nodiscard]] writer_type make_writer() { return writer_type(*this, max_length_); }

  // ---- sample --------------------------------------------------------------------------------

  /// A batch of `rows` rows of `length` steps in host memory, to pass to sample().
  [[nodiscard]] batch_type make_batch(gear::batch_size rows, gear::window_length length) const {
    return batch_type(memory_kind::host, rows, length);
  }
  /// Samples out.batch_size() rows of window w over every shard: sample_begin, then sample_end.
  void sample(batch_type& out, const window& w, rng& g) {
    const std::lock_guard held(learner_mutex_);
    learner().sample(out, w, g);
    count_sample(out);
  }
  /// Splits the batch across the shards and asks each for its share; they select, gather and
  /// write meanwhile (a training step can run). `out` must live until sample_end. Up to
  /// max_samples_in_flight (8) samples may be in flight, into different batches, ended in any
  /// order: begin the next batches before training on the last, and the shards gather them while
  /// the last one crosses the wire. Throws, sending nothing, errc::invalid_argument (as many in
  /// flight as allowed, one into `out`, more than max_batch rows or max_window steps),
  /// errc::batch_mismatch, errc::empty_window, errc::window_out_of_range (also a window longer
  /// than the shards' max_length), errc::empty_buffer (no shard holds anything, or, prioritized,
  /// every shard's priority mass is 0), errc::peer_lost.
  void sample_begin(batch_type& out, const window& w, rng& g) {
    const std::lock_guard held(learner_mutex_);
    learner().sample_begin(out, w, g);
  }
  /// Waits for every share (bounded by the deadline), checks each reply and completes `out` (the
  /// shards wrote its columns) with global probabilities and weights. Throws
  /// errc::invalid_argument (none in flight, another batch), errc::empty_buffer (a shard could
  /// not sample), errc::peer_lost, errc::transport_error (a reply that does not hold up); the
  /// sample is over either way, and `out` is then as remote_learner::sample_end says.
  void sample_end(batch_type& out) {
    const std::lock_guard held(learner_mutex_);
    learner().sample_end(out);
    count_sample(out);
  }

  // ---- priorities and removal ----------------------------------------------------------------

  /// Sets the priorities of `keys` at the shards they name; stale pairs are skipped and counted,
  /// and so is a pair whose p^alpha its shard cannot weigh (past float's range at its alpha).
  /// Throws, sending nothing, errc::invalid_argument (sizes differ), errc::invalid_priority,
  /// errc::key_out_of_range (a shard not among the transport's); then errc::peer_lost.
  priority_update_result update_priorities(std::span<const key> keys,
                                           std::span<const float> priorities) {
    const std::lock_guard held(learner_mutex_);
    return tally(learner().update_priorities(keys, priorities), stats_.updated);
  }
  /// Removes the trajectories `keys` at the shards they name. Each shard removes what it still
  /// holds and counts the rest stale (a local erase refuses the whole call instead: shards
  /// cannot refuse together). Returns removed (applied) and stale. Throws, sending nothing,
  /// errc::key_out_of_range, errc::null_pointer; then errc::peer_lost.
  priority_update_result erase(std::span<const key> keys) {
    const std::lock_guard held(learner_mutex_);
    return tally(learner().erase(keys), stats_.erased);
  }

 private:
  using actor_type = transport::remote_actor<Spec>;
  using learner_type = transport::remote_learner<Spec, Selection>;

  actor_type& actor() {  // with actor_mutex_ held
    if (!actor_) {
      typename actor_type::options o;
      o.fabric = transport_.fabric;
      o.route = transport_.route;
      o.ring_blocks = transport_.ring_blocks;
      o.deadline = transport_.deadline;
      o.token = transport_.token;
      actor_ = std::make_unique<actor_type>(transport_.shards, std::move(o));
    }
    return *actor_;
  }
  learner_type& learner() {  // with learner_mutex_ held
    if (!learner_) {
      typename learner_type::options o;
      o.fabric = transport_.fabric;
      o.max_batch = transport_.max_batch;
      o.max_window = transport_.max_window;
      o.skip_lost_shards = transport_.skip_lost_shards;
      o.requests_per_message = transport_.requests_per_message;
      o.beta = detail::beta_of(selection_);
      o.deadline = transport_.deadline;
      o.token = transport_.token;
      learner_ = std::make_unique<learner_type>(transport_.shards, std::move(o));
    }
    return *learner_;
  }
  /// Counts an update's (or erase's) pairs: applied into `applied`, the rest as stale.
  priority_update_result tally(const priority_update_result& r, std::uint64_t& applied) {
    const std::lock_guard count(stats_mutex_);
    applied += static_cast<std::uint64_t>(r.applied);
    stats_.stale += static_cast<std::uint64_t>(r.stale);
    return r;
  }
  void count_sample(const batch_type& out) {
    const std::lock_guard count(stats_mutex_);
    ++stats_.samples;
    stats_.sampled_rows += static_cast<std::uint64_t>(out.batch_size());
  }

  transport::libfabric transport_;
  Selection selection_;
  std::int64_t capacity_ = 0, max_length_ = 0;
  std::mutex actor_mutex_, learner_mutex_;
  std::unique_ptr<actor_type> actor_;
  std::unique_ptr<learner_type> learner_;
  mutable std::mutex stats_mutex_;
  counters stats_;
};

}  // namespace gear
