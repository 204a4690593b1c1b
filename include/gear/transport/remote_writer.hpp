#pragma once
// gear::transport::remote_writer: the writer of a distributed buffer's client
// (replay_buffer<Spec, storage::none, Selection, transport::libfabric>::make_writer). The same
// calls as gear::writer:
//
//   auto w = client.make_writer();
//   for (...) w.append(obs_ptr, &action, &reward, &done);   // one pointer per column
//   gear::key k = w.commit();                               // the key names its shard
//
// Steps gather here, in host memory, copied during append; commit inserts the trajectory as one
// remote insert (to the shard the transport routes it to). Nothing reaches a shard before commit,
// so a writer dropped uncommitted leaves nothing behind anywhere. A writer must not outlive its
// client.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <gear/error.hpp>
#include <gear/insert.hpp>
#include <gear/key.hpp>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gear::transport {

template <class Client>
class remote_writer {
  using spec = typename Client::spec_type;
  static constexpr std::size_t columns = spec::num_columns;

 public:
  remote_writer(Client& client, std::int64_t max_length)
      : client_(&client), max_length_(max_length) {}
  remote_writer(remote_writer&& o) noexcept
      : client_(std::exchange(o.client_, nullptr)),
        max_length_(o.max_length_),
        steps_(std::exchange(o.steps_, 0)),
        data_(std::move(o.data_)) {}
  remote_writer& operator=(remote_writer&&) = delete;
  remote_writer(const remote_writer&) = delete;
  remote_writer& operator=(const remote_writer&) = delete;

  /// Steps appended and not yet committed.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  /// Appends one step: one pointer per column, in spec order, each to one step's elements in host
  /// memory, copied before the call returns. Throws (appending nothing) errc::writer_full past
  /// the shards' max_length, errc::null_pointer, errc::invalid_reservation after commit.
  template <class... T>
  void append(const T*... step) {
    static_assert(sizeof...(T) == columns, "remote_writer::append: one pointer per column");
    [&]<std::size_t... C>(std::index_sequence<C...>) {
      static_assert(
          (std::is_same_v<std::remove_cv_t<T>, typename spec::template column_t<C>::element_type> &&
           ...),
          "remote_writer::append: pointer types must match the spec's column types");
    }
    (std::make_index_sequence<columns>{});
    check_open();
    GEAR_REQUIRE(steps_ < max_length_, errc::writer_full,
                 "trajectory already has max_length = " + std::to_string(max_length_) + " steps");
    const void* ptrs[] = {static_cast<const void*>(step)...};
    for (std::size_t c = 0; c < columns; ++c)
      GEAR_REQUIRE(ptrs[c] != nullptr, errc::null_pointer,
                   "column '" + std::string(spec::names[c]) + "': step pointer is null");
    for (std::size_t c = 0; c < columns; ++c)  // all the room first: a failure appends nothing
      data_[c].reserve(data_[c].size() + static_cast<std::size_t>(spec::step_bytes[c]));
    for (std::size_t c = 0; c < columns; ++c) {
      const auto bytes = static_cast<std::size_t>(spec::step_bytes[c]);
      const std::size_t at = data_[c].size();
      data_[c].resize(at + bytes);
      std::memcpy(data_[c].data() + at, ptrs[c], bytes);
    }
    ++steps_;
  }

  /// Inserts the steps written so far as one trajectory and returns its key. Throws (the writer
  /// stays open, its steps kept) errc::empty_trajectory with no steps, and as the client's
  /// insert does (errc::timeout, errc::peer_lost). After errc::timeout or errc::peer_lost the
  /// trajectory may still have been stored (its acknowledgement was what failed to come): a
  /// commit retried then may store it twice.
  key commit() {
    check_open();
    GEAR_REQUIRE(steps_ >= 1, errc::empty_trajectory, "the writer has no steps to commit");
    const std::int64_t lengths[] = {steps_};
    trajectories<spec> in{lengths, {}, memory_kind::host};
    [&]<std::size_t... C>(std::index_sequence<C...>) {
      ((in.columns[C] = detail::column_input_of<spec, C>(data_[C].data())), ...);
    }
    (std::make_index_sequence<columns>{});
    key k{};
    client_->insert(in, std::span<key>(&k, 1));
    client_ = nullptr;
    return k;
  }

 private:
  void check_open() const {
    GEAR_REQUIRE(client_ != nullptr, errc::invalid_reservation,
                 "the writer has been committed (or moved from)");
  }

  Client* client_;
  std::int64_t max_length_;
  std::int64_t steps_ = 0;
  std::vector<std::byte> data_[columns];
};

}  // namespace gear::transport
