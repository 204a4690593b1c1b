#pragma once
// gear::transport::remote_learner: samples batches from remote shards (shard_server.hpp) as if
// they were one buffer, with no buffer of its own (decentralised selection).
//
// At construction it greets every shard (hello) and grants each a slice of its own registered
// memory that only that shard may write (the meta part of its replies; on shm on an inlet of that
// shard's: remote_client.hpp). A sample splits the batch's B rows across the shards by their
// selection masses (detail/remote/split.hpp: Multinomial(B, M_s / M), from a snapshot: every
// shard's status at the first sample, then the masses the last replies carried; a shard whose reply
// said 0 or did not come is asked again), registers the batch's columns for the sample alone and
// asks each shard for its share; each shard selects and gathers its rows with its own policy and
// writes them with one-sided writes: each column's rows straight into the batch, then the rest
// (header, mask, keys, probabilities, footer) into its slice. The learner counts the writes, checks
// every reply against the request (header and footer) and copies the small parts into the batch.
// Each row's probability is global, P_i = (M_s / M) * (p_i / M'_s): the union's p_i / M when
// nothing changed since the snapshot. Importance weights follow the local formula over the union
// with options.beta (0: all 1). Rows come grouped by shard. sample_begin / sample_end split a
// sample in two, so that the shards' work and the transfers overlap a training step.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <gear/batch.hpp>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/fingerprint.hpp>
#include <gear/detail/remote/split.hpp>
#include <gear/priority_update.hpp>
#include <gear/rng.hpp>
#include <gear/select/uniform.hpp>
#include <gear/transport/held_requests.hpp>
#include <gear/transport/remote_client.hpp>
#include <gear/transport/reply_slice.hpp>
#include <gear/transport/sample_flight.hpp>
#include <gear/window.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gear::transport {

template <class Spec, class Selection = select::uniform>
class remote_learner : public remote_client {
 public:
  struct options {
    libfabric_config fabric;
    std::int64_t max_batch = 1024;  ///< rows of one sample, at most
    std::int64_t max_window = 64;   ///< steps of its window, at most
    double beta = 0;                ///< importance-sampling exponent (0: weights all 1)
    std::chrono::milliseconds deadline{30000};
    std::string token;  ///< the shards' handshake token
    /// A shard found lost (no answer by the deadline, a failed transfer) is left out from then
    /// on: later samples split over the other shards, with probabilities and weights over their
    /// union, and its keys' updates and erases count as stale. The call that finds it lost still
    /// throws errc::peer_lost (its sample cannot be completed), unless it was a status request
    /// of sample_begin, which then goes on without it. False: every call needs every shard.
    bool skip_lost_shards = false;
    /// While every shard a new sample asks is serving this many earlier samples or more (their
    /// replies not in), its requests are held back and go with the next ones', this many
    /// samples' to a shard in one message, or sooner: at its own sample_end, at an update or
    /// erase, and at a sample_end that finds the shards less busy. Over tcp a send costs the
    /// learner's thread what receiving a 64 KiB reply does. With fewer in flight (two, say: one
    /// training, the next coming) every request goes at once. 1 (never held) to
    /// max_samples_in_flight / 2.
    std::size_t requests_per_message = 4;
  };

  /// Connects to every shard whose address blob is given (same spec and selection policy).
  /// Throws errc::peer_mismatch, errc::peer_lost (no welcome by the deadline), ...
  remote_learner(std::span<const std::vector<std::byte>> shard_blobs, options o)
      : remote_client(shard_blobs, o.fabric, o.deadline, detail::remote::spec_fingerprint<Spec>(),
                      detail::remote::selection_fingerprint<Selection>(), o.token),
        options_(std::move(o)),
        slices_(links_.size()),
        held_(links_.size()) {
    namespace remote = detail::remote;
    std::int64_t per_step = 64;  // bytes of a row's step (its columns, its mask), and room
    for (const std::int64_t b : Spec::step_bytes) per_step += b;
    GEAR_REQUIRE(options_.max_batch >= 1 && options_.max_window >= 1 &&
                     options_.max_batch <= (std::int64_t{1} << 31) &&
                     options_.max_window <= (std::int64_t{1} << 62) / options_.max_batch / per_step,
                 errc::invalid_argument,
                 "max_batch and max_window must be at least 1, a batch of them below 2^62 bytes");
    GEAR_REQUIRE(options_.requests_per_message >= 1 &&
                     options_.requests_per_message <= max_samples_in_flight / 2,
                 errc::invalid_argument,
                 "requests_per_message must be in [1, " +
                     std::to_string(max_samples_in_flight / 2) + "], got " +
                     std::to_string(options_.requests_per_message));
    skip_lost_ = options_.skip_lost_shards;
    flights_.reserve(max_samples_in_flight);
    reply_bytes_ = static_cast<std::size_t>(
        remote::layout_reply(Spec::step_bytes, options_.max_batch, options_.max_window).meta_bytes);
    open_inlets(options_.fabric);  // on shm, an endpoint per shard to write into
    for (std::size_t s = 0; s < slices_.size(); ++s)  // a reply area per sample, on s's inlet
      slices_[s].open(inlet(inlet_of(s)), reply_bytes_);
    greet([&](std::size_t s) {
      remote::hello h;
      h.role = remote::peer_role::learner;
      h.spec_fingerprint = remote::spec_fingerprint<Spec>();
      h.selection_fingerprint = remote::selection_fingerprint<Selection>();
      h.hostname = "learner";
      h.slice_address = slices_[s].region.remote_address;
      h.slice_key.resize(sizeof(std::uint64_t));
      std::memcpy(h.slice_key.data(), &slices_[s].region.key, sizeof(std::uint64_t));
      h.slice_bytes = slices_[s].memory->size();
      h.max_rows = options_.max_batch;
      h.max_window = options_.max_window;
      return h;
    });
  }
  ~remote_learner() { close(); }

  /// Samples out.batch_size() rows of window `w` (w.length == out.window_length()) into `out`
  /// (host-accessible memory), drawing from `g`: sample_begin, then sample_end. Throws as they do.
  void sample(batch<Spec>& out, const window& w, rng& g) {
    sample_begin(out, w, g);
    sample_end(out);
  }

  /// Starts a sample into `out`: splits its rows across the shards and sends every request (or
  /// holds them: options.requests_per_message); the shards select, gather and write meanwhile (a
  /// training step can run). Up to max_samples_in_flight samples may be in flight, into different
  /// batches, ended in any order: with two, a shard gathers the next share while the last one is
  /// on the wire. `out` must stay alive until sample_end; the shards write into its columns
  /// meanwhile. Throws, sending nothing, errc::invalid_argument (as many in flight as allowed, one
  /// into `out` already, a batch larger than the slices, memory an earlier sample's cut-off reply
  /// may still write into: see sample_end), errc::wrong_memory, errc::batch_mismatch; empty_window,
  /// window_out_of_range (check_sample_request); errc::empty_buffer when no shard holds anything
  /// or every mass is 0; errc::transport_error (its memory cannot be registered).
  /// Throws errc::peer_lost when a request cannot go, after the shards already asked have
  /// answered (or the deadline passed).
  void sample_begin(batch<Spec>& out, const window& w, rng& g) {
    namespace remote = detail::remote;
    const std::int64_t rows = out.batch_size(), length = out.window_length();
    GEAR_REQUIRE(flights_.size() < max_samples_in_flight, errc::invalid_argument,
                 std::to_string(max_samples_in_flight) +
                     " samples are in flight: sample_end one before the next sample_begin");
    for (const flight& other : flights_)
      GEAR_REQUIRE(other.out != &out, errc::invalid_argument,
                   "a sample into this batch is in flight: sample_end it first");
    check_sample_request(out, w, shortest_max_length(), options_.max_batch, options_.max_window);
    // The masses to split by: the last replies', asked again of every shard the snapshot
    // has none for (the first sample; a shard that was empty, and so got no rows to say more).
    const bool first_sample = snapshot_.size() != links_.size();
    snapshot_.resize(links_.size(), {0, 0, true});
    for (std::size_t s = 0; s < links_.size(); ++s) {
      if (lost_[s]) {
        snapshot_[s] = {0, 0, false};
      } else if (first_sample || snapshot_[s].mass <= 0) {
        const auto st = guarded(s, [&] { return status(s); });
        snapshot_[s] =
            st ? remote::shard_share{st->mass, st->size, true} : remote::shard_share{0, 0, false};
      }
    }
    GEAR_REQUIRE(std::find(lost_.begin(), lost_.end(), false) != lost_.end(), errc::peer_lost,
                 "every shard of this learner is lost");
    const rng_draw draw = g.next();
    flight f = spares_.take();  // an ended one's storage: no allocation per sample
    f.out = &out;
    while (std::any_of(flights_.begin(), flights_.end(),  // a reply area not in use
                       [&](const flight& other) { return other.area == f.area; }))
      ++f.area;
    remote::split_with_replacement(snapshot_, rows, draw, f.share, upto_);
    f.total = remote::live_mass(snapshot_);
    f.split = snapshot_;
    f.layouts.resize(links_.size());
    // The batch's columns, registered for this sample alone: the shards write their rows there.
    std::byte* const columns = out.column_data(0);
    const std::size_t last = Spec::num_columns - 1;
    const auto column_bytes = [&](std::size_t c) {
      return static_cast<std::size_t>(rows * length * Spec::step_bytes[c]);
    };
    const std::size_t granted =
        static_cast<std::size_t>(out.column_data(last) - columns) + column_bytes(last);
    const auto at = reinterpret_cast<std::uintptr_t>(columns);
    for (const auto& [from, to] : tainted_)
      GEAR_REQUIRE(to <= at || at + granted <= from, errc::invalid_argument,
                   "a shard's reply to an earlier sample into this batch's memory was cut off by "
                   "the deadline and may still land there: sample into another batch");
    f.sent.reserve(links_.size());  // no allocation once requests are out
    tainted_.reserve(tainted_.size() + max_samples_in_flight);  // end_grant never allocates
    remote::sample_request& r = request_;  // one per shard, every field set anew
    r.column_address.resize(Spec::num_columns);
    f.grants.assign(inlet_count(), {});  // registered below, on the inlets its shards write into
    const auto until = clock::now() + deadline_;
    std::int64_t first = 0;  // the shard's first row
    bool sent = false;       // its requests went (or were given up)
    held_.begin_sample();
    try {
      for (std::size_t s = 0; s < links_.size(); first += f.share[s], ++s) {
        if (f.share[s] == 0) continue;
        fabric::region& grant = f.grants[inlet_of(s)];
        if (grant.mr == nullptr)
          grant = inlet(inlet_of(s)).register_memory(columns, granted, FI_REMOTE_WRITE);
        f.layouts[s] = remote::layout_reply(Spec::step_bytes, f.share[s], length);
        std::byte* reply = area(s, f.area);
        std::memset(reply, 0, remote::reply_header_bytes);  // poisoned
        std::memset(reply + f.layouts[s].footer_at, 0, remote::reply_footer_bytes);
        slices_[s].expect(f.area, next_request_++ % remote::max_cq_index);
        r.request = slices_[s].request[f.area];
        r.reply_offset = f.area * reply_bytes_;
        r.incarnation = links_[s].blob.incarnation;
        r.rows = f.share[s];
        r.win = w;
        r.seed = draw.seed;
        r.call = draw.call * remote::max_peers + s;  // a stream of its own per shard
        r.mass_used = snapshot_[s].mass;
        r.reply_bytes = static_cast<std::uint64_t>(f.layouts[s].meta_bytes);
        r.batch_address = grant.remote_address;
        r.batch_key = grant.key;
        r.batch_bytes = granted;
        for (std::size_t c = 0; c < Spec::num_columns; ++c)
          r.column_address[c] = grant.remote_address +
                                static_cast<std::uint64_t>(out.column_data(c) - columns +
                                                           first * length * Spec::step_bytes[c]);
        message_ = remote::encode(r, std::move(message_));
        remote::stamp_sender(message_, links_[s].welcome->peer_index);
        held_.add(s, message_);
        f.sent.push_back(s);  // reserved
      }
      held_.end_sample();
      f.held = true;
      if (!may_hold()) {
        sent = true;
        if (!send_held(until, &f))  // a shard its request could not go to (a send that throws
                                    // has posted nothing)
          for (std::size_t s = 0; s < links_.size(); ++s)
            if (f.share[s] > 0 && !f.asked(s)) lost(s, "acceptance of a sample request");
      }
    } catch (...) {  // nothing may land in the batch once this throws
      if (!sent) {
        held_.cancel_sample();
        f.sent.clear();
      }
      end_grant(f, until);
      spares_.recycle(std::move(f));
      throw;
    }
    flights_.push_back(std::move(f));
  }

  /// Ends the sample in flight into `out`: waits for every share (bounded by the deadline), checks
  /// every reply (header and footer, poisoned before the request) and only then completes the
  /// batch given to sample_begin (`out`, the same: its columns are in, its keys and masks are
  /// copied) with global probabilities and weights. Throws errc::invalid_argument (none in flight,
  /// another batch), errc::empty_buffer (a shard could not sample), errc::peer_lost,
  /// errc::transport_error (a reply that does not hold up); the sample is over either way and the
  /// batch's contents are then unspecified. A reply that had not started by the deadline (and a
  /// grace of up to a second) is refused when it comes, and its shard is lost to this learner.
  /// One cut off in the middle may still finish into the batch when this learner polls (tcp and
  /// shm without cross-memory attach copy in pieces): this learner then refuses to sample into
  /// that memory again, and it must stay allocated until the learner is destroyed.
  void sample_end(batch<Spec>& out) {
    namespace remote = detail::remote;
    const auto it = std::find_if(flights_.begin(), flights_.end(),
                                 [&](const flight& f) { return f.out == &out; });
    GEAR_REQUIRE(it != flights_.end(), errc::invalid_argument,
                 "sample_end of a batch with no sample in flight");
    const auto until = clock::now() + deadline_;
    if (it->held) (void)send_held(until);  // a shard that failed is not asked: finish says so
    flight f = std::move(*it);
    flights_.erase(it);
    try {
      finish(out, f, until);
    } catch (...) {  // nothing may land in the batch once this throws
      end_grant(f, until);
      spares_.recycle(std::move(f));
      throw;
    }
    end_grant(f, until);
    spares_.recycle(std::move(f));
    if (!may_hold()) (void)send_held(until);  // what this call's polls saw: the shards less busy
  }

  /// Sets the priorities of `keys` (host spans of one size) at the shards that own them, which
  /// skip and count stale pairs (ticket, incarnation) and pairs whose p^alpha they cannot weigh
  /// (past float's range at their alpha), applying the rest. Returns the totals. Throws, sending
  /// nothing, errc::invalid_argument (sizes differ), invalid_priority (NaN, negative, infinite),
  /// key_out_of_range (a shard this learner does not know); errc::peer_lost (no answer).
  priority_update_result update_priorities(std::span<const key> keys,
                                           std::span<const float> priorities) {
    GEAR_REQUIRE(keys.size() == priorities.size(), errc::invalid_argument,
                 std::to_string(keys.size()) + " keys, " + std::to_string(priorities.size()) +
                     " priorities");
    for (std::size_t i = 0; i < keys.size(); ++i)
      GEAR_REQUIRE(std::isfinite(priorities[i]) && priorities[i] >= 0, errc::invalid_priority,
                   "priority " + std::to_string(i) + " is " + std::to_string(priorities[i]));
    return send_updates(keys, priorities, false);
  }

  /// Trajectories the shards hold together, as each reports it now (lost shards left out, with
  /// options.skip_lost_shards). Throws errc::peer_lost.
  [[nodiscard]] std::int64_t size() {
    std::int64_t total = 0;
    for (std::size_t s = 0; s < links_.size(); ++s)
      if (!lost_[s])
        if (const auto st = guarded(s, [&] { return status(s); })) total += st->size;
    return total;
  }

  /// Removes the trajectories `keys` at the shards that own them. Unlike a local erase, which
  /// refuses a batch with a stale key, each shard removes what it still holds and counts the rest
  /// (evicted, already removed, an older incarnation's) as stale: shards cannot refuse together.
  /// Returns the removed (applied) and stale counts. Throws, sending nothing,
  /// errc::key_out_of_range (a key of a shard this learner does not know); errc::peer_lost when a
  /// shard does not answer.
  priority_update_result erase(std::span<const key> keys) { return send_updates(keys, {}, true); }

 private:
  /// Sends each shard its keys' updates (or removals), in messages of what one holds, and sums
  /// the answers. Checks every key's shard before sending anything.
  priority_update_result send_updates(std::span<const key> keys, std::span<const float> priorities,
                                      bool erase) {
    namespace remote = detail::remote;
    detail::check_not_null(keys.data(), keys.size(), "keys");
    detail::check_not_null(priorities.data(), priorities.size(), "priorities");
    std::vector<remote::update> updates(links_.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      std::size_t s = 0;
      while (s < links_.size() && links_[s].blob.shard != keys[i].shard) ++s;
      GEAR_REQUIRE(s < links_.size(), errc::key_out_of_range,
                   "key " + std::to_string(i) + " names shard " + std::to_string(keys[i].shard) +
                       ", which this learner is not connected to");
      updates[s].entries.push_back(
          {keys[i].ticket, keys[i].incarnation, erase ? 0.0f : priorities[i]});
    }
    priority_update_result total;
    for (std::size_t s = 0; s < links_.size(); ++s)
      if (lost_[s]) {  // left out (skip_lost_shards): its keys are stale
        total.stale += static_cast<std::int64_t>(updates[s].entries.size());
        updates[s].entries.clear();
      }
    const auto until = clock::now() + deadline_;
    (void)send_held(until);  // the samples begun before go first
    const std::size_t per_message = remote::update_capacity(remote::default_max_message);
    for (std::size_t s = 0; s < links_.size(); ++s)
      for (std::size_t at = 0; at < updates[s].entries.size(); at += per_message) {
        const auto from = updates[s].entries.begin() + static_cast<std::ptrdiff_t>(at);
        const auto n = std::min(per_message, updates[s].entries.size() - at);
        auto bytes = remote::encode(remote::update{
            .entries = {from, from + static_cast<std::ptrdiff_t>(n)}, .erase = erase});
        remote::stamp_sender(bytes, links_[s].welcome->peer_index);
        update_answer_.reset();
        awaited_ = s;
        guarded(
            s,
            [&] {
              send(bytes, s, until);
              wait_until([&] { return update_answer_.has_value(); }, until, s, "update result");
              return true;
            },
            true);
        total.applied += update_answer_->applied;
        total.stale += update_answer_->stale;
      }
    return total;
  }

  void on_message(std::span<const std::byte> message, detail::remote::message_type type,
                  std::optional<std::size_t> from) override {
    if (type != detail::remote::message_type::update_result) return;
    const auto r = detail::remote::parse_update_result(message, {});
    if (r && r.value.incarnation == links_[awaited_].blob.incarnation && from_shard(from, awaited_))
      update_answer_ = r.value;
  }

  using flight = sample_flight<batch<Spec>>;
  [[nodiscard]] std::byte* area(std::size_t s, std::size_t a) const { return slices_[s].area(a); }
  [[nodiscard]] bool reply_in(std::size_t s, std::size_t a) const { return slices_[s].reply_in(a); }

  void on_remote_write(const detail::remote::cq_data& d) override {
    for (std::size_t s = 0; s < links_.size(); ++s)
      if (links_[s].blob.shard == d.peer) slices_[s].note(d);  // (maybe before sample_begin ends)
  }

  [[nodiscard]] bool may_hold() const {
    return held_.may_hold(flights_, options_.requests_per_message,
                          [&](std::size_t s, std::size_t a) { return reply_in(s, a); });
  }
  /// Sends the held requests (held_requests::send); a shard whose message could not go
  /// (try_send) is left out of those samples' `sent`, and their sample_end throws
  /// errc::peer_lost naming it.
  bool send_held(clock::time_point until, flight* also = nullptr) noexcept {
    return held_.send(
        flights_, also, [&](std::size_t s, auto message) { return try_send(message, s, until); },
        [&](std::size_t s) { return links_[s].welcome->peer_index; });
  }

  /// The body of sample_end: waits for every share, checks every reply, then completes the batch.
  void finish(batch<Spec>& out, const flight& f, clock::time_point until) {
    namespace remote = detail::remote;
    const std::int64_t rows = out.batch_size(), length = out.window_length();
    for (std::size_t s = 0; s < links_.size(); ++s) {
      if (f.share[s] > 0) snapshot_[s].mass = 0;  // asked again unless its reply says (below)
      if (f.share[s] > 0 && lost_[s]) lost(s, "sample reply (it was lost meanwhile)");
      if (f.share[s] > 0 && !f.asked(s)) lost(s, "acceptance of a sample request");
    }
    for (std::size_t s = 0; s < links_.size(); ++s)
      if (f.share[s] > 0)
        guarded(
            s,
            [&] {
              wait_until([&] { return reply_in(s, f.area); }, until, s, "sample reply");
              return true;
            },
            true);
    std::vector<remote::reply_header>& headers = headers_;
    headers.assign(links_.size(), {});
    for (std::size_t s = 0; s < links_.size(); ++s) {
      if (f.share[s] == 0) continue;
      const std::span<const std::byte> slice(area(s, f.area),
                                             static_cast<std::size_t>(f.layouts[s].meta_bytes));
      remote::reply_header h;
      std::memcpy(&h, slice.data(), sizeof(h));
      GEAR_REQUIRE(!(h.magic == remote::reply_magic && h.request == slices_[s].request[f.area] &&
                     h.rows == 0),
                   errc::empty_buffer,
                   "shard " + std::to_string(links_[s].blob.shard) + " could not sample its " +
                       std::to_string(f.share[s]) + " rows");
      const auto checked =
          remote::check_reply(slice, slices_[s].request[f.area], links_[s].blob.incarnation,
                              f.share[s], length, Spec::step_bytes);
      GEAR_REQUIRE(checked, errc::transport_error,
                   "shard " + std::to_string(links_[s].blob.shard) + "'s reply is refused (" +
                       std::string(remote::to_string(checked.why)) + ": " + checked.what + ")");
      headers[s] = checked.value;
    }
    std::vector<double>& probabilities = probabilities_;
    probabilities.assign(static_cast<std::size_t>(rows), 0.0);
    std::int64_t at = 0, union_size = 0;
    for (const auto& m : f.split) union_size += m.live ? m.size : 0;
    for (std::size_t s = 0; s < links_.size(); ++s) {
      if (f.share[s] == 0) continue;
      unpack_reply(out, area(s, f.area), f.layouts[s], at, f.share[s], f.split[s].mass, f.total,
                   probabilities);
      at += f.share[s];
    }
    remote::importance_weights(probabilities, union_size, options_.beta,
                               {out.weights_data(), static_cast<std::size_t>(rows)}, upto_);
    // The next snapshot: what the replies say the shards held when they selected.
    for (std::size_t s = 0; s < links_.size(); ++s)
      if (f.share[s] > 0) snapshot_[s] = {headers[s].mass, headers[s].size, true};
  }

  /// Ends flight f's registrations of its batch once every shard it asked has written all of its
  /// reply, or a grace (up to a second) past `until` is over: a write that starts later is
  /// refused (on tcp and verbs that ends the pair, on shm it never completes at the shard: the
  /// shard is lost to this learner). A write already under way when the registration ends may
  /// still finish into the batch on providers that copy in pieces (tcp, shm without CMA): the
  /// batch's memory is then taken out of use for this learner (sample_begin refuses it).
  void end_grant(flight& f, clock::time_point until) noexcept {
    if (!ep_) return;  // closed: its registrations with it
    const auto grace =
        std::max(until, clock::now() + std::min(deadline_, std::chrono::milliseconds(1000)));
    const auto all_in = [&](bool count_lost) {
      for (const std::size_t s : f.sent)
        if ((count_lost || !lost_[s]) && !reply_in(s, f.area)) return false;
      return true;
    };
    while (!all_in(false) && clock::now() <= grace) {
      try {
        if (poll() == 0) std::this_thread::yield();
      } catch (const error&) {  // a failed transfer: that shard's reply will not come
      }
    }
    const auto grant = std::ranges::find_if(f.grants, [](const auto& g) { return g.mr != nullptr; });
    if (grant != f.grants.end() && !all_in(true)) {  // every grant covers the same memory
      const auto from = reinterpret_cast<std::uintptr_t>(grant->base);
      tainted_.push_back({from, from + grant->bytes});
    }
    for (std::size_t i = 0; i < f.grants.size(); ++i) inlet(i).deregister(f.grants[i]);
  }

  options options_;
  std::vector<reply_slice> slices_;  // their memory outlives the endpoints (closed by close())
  held_requests held_;               // requests held back (options.requests_per_message)
  std::vector<detail::remote::shard_share> snapshot_;
  std::uint32_t next_request_ = 0;
  std::optional<detail::remote::update_result> update_answer_;
  std::size_t awaited_ = 0;      // the shard whose update answer is awaited
  std::vector<flight> flights_;  // reserved: a begun sample is recorded without allocating
  flight_spares<batch<Spec>> spares_;
  // Kept between samples so that a sample allocates nothing once its sizes were seen: the request
  // and its encoding, the split's scratch, sample_end's headers and probabilities.
  detail::remote::sample_request request_;
  std::vector<std::byte> message_;
  std::vector<double> upto_;  // scratch: the split's running masses, then the weights
  std::vector<detail::remote::reply_header> headers_;
  std::vector<double> probabilities_;
  // Batch memory a cut-off reply may still write into: [from, to) of this process's addresses,
  // one range per cut-off sample for the learner's life (reserved ahead of each sample).
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> tainted_;
  std::size_t reply_bytes_ = 0;  // one reply area: max_batch rows of max_window steps
};

}  // namespace gear::transport
