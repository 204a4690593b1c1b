#pragma once
// Inserting whole trajectories (replay_buffer::insert_async), in the three phases of core.hpp:
//
//   check    sizes, lengths, every column's type, shape, alignment and memory
//   acquire  one staging lease: the scatter's table (and, for host data bound for GPU columns,
//            the data itself, copied by the CPU during the call); for host data bound for
//            host-resident columns of a GPU buffer, a wait on the host for the gathers that may
//            still read the slots' evicted occupants and the writes in flight to them (events of
//            the buffer's, stream_order::wait_on_host; the caller's stream runs on)
//   change   host-resident columns written by the CPU; the selection policy's eviction hook; the
//            ring's commit records; one scatter launch that writes the GPU columns, its threads
//            applying those records to the device mirror beside the copies (a journal apply of
//            its own where nothing is scattered); the commit hook.
//
// Host memory (pageable or pinned) is read during the call; device memory by the scatter, in
// stream order. Host data for a storage whose columns are all in device memory, on a buffer used
// from more than one stream, lands instead (landing.hpp): held in staging, uploaded on the caller's
// stream, and placed in its slots and committed on the stream of a later call.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/buffer/insert_steps.hpp>
#include <gear/detail/buffer/landing.hpp>
#include <gear/detail/host_copy.hpp>
#include <gear/detail/memory.hpp>
#include <gear/detail/scatter.hpp>
#include <gear/insert.hpp>
#include <gear/key.hpp>
#include <span>
#include <string>

namespace gear::detail {

/// Throws unless `lengths` are each in [1, max_length].
inline void check_lengths(std::span<const std::int64_t> lengths, std::int64_t max_length) {
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    GEAR_REQUIRE(lengths[i] >= 1, errc::empty_trajectory,
                 "trajectory " + std::to_string(i) + " has length " + std::to_string(lengths[i]));
    GEAR_REQUIRE(lengths[i] <= max_length, errc::trajectory_too_long,
                 "trajectory " + std::to_string(i) + " has " + std::to_string(lengths[i]) +
                     " steps, max_length is " + std::to_string(max_length));
  }
}

template <class Core, class Spec>
void check_insert(const Core& b, const trajectories<Spec>& in, std::span<key> keys_out) {
  const auto count = static_cast<std::int64_t>(in.lengths.size());
  GEAR_REQUIRE(count >= 1 && count <= b.capacity_, errc::invalid_argument,
               "an insert takes 1 to capacity = " + std::to_string(b.capacity_) +
                   " trajectories, got " + std::to_string(count));
  GEAR_REQUIRE(in.lengths.data() != nullptr, errc::null_pointer, "lengths is null");
  check_not_null(keys_out.data(), keys_out.size(), "keys_out");
  GEAR_REQUIRE(
      static_cast<std::int64_t>(keys_out.size()) >= count, errc::invalid_argument,
      "keys_out holds " + std::to_string(keys_out.size()) + " keys, need " + std::to_string(count));
  check_lengths(in.lengths, b.max_length_);
  [&]<std::size_t... C>(std::index_sequence<C...>) {
    (check_column_input<Spec, C>(in.columns[C]), ...);
  }
  (std::make_index_sequence<Spec::num_columns>{});
  GEAR_REQUIRE(in.source == memory_kind::host || in.source == memory_kind::device,
               errc::wrong_memory, "insert source must be memory_kind::host or ::device");
  if constexpr (!Core::on_device) {
    GEAR_REQUIRE(in.source == memory_kind::host, errc::wrong_memory,
                 "storage::host takes trajectories from host memory only");
  } else {
    for (std::size_t c = 0; c < Spec::num_columns; ++c) {
      const pointer_memory m = memory_of(in.columns[c].data);
      const bool ok = in.source == memory_kind::device ? m.gpu_readable : !m.device;
      GEAR_REQUIRE(ok, errc::wrong_memory,
                   "column '" + std::string(Spec::names[c]) + "' is not in " +
                       (in.source == memory_kind::device ? "GPU-readable" : "host") +
                       " memory as the insert says");
    }
  }
}

/// What an insert of `count` trajectories, `steps` steps in all, into a GPU buffer stages, in one
/// lease: the scatter's rows table and room for its plan (both also in device memory when it
/// scatters), then the host data for GPU columns (one piece per column), then the commit records
/// (journal_bytes(count)).
/// replay_buffer::reserve_staging sizes its entries by it too.
template <class Core>
struct insert_staging {
  std::array<std::int64_t, Core::num_columns> staged_at{};  ///< host data for GPU column c
  std::int64_t staged_bytes = 0;                            ///< host data for GPU columns
  std::int64_t cpu_bytes = 0;   ///< host data the CPU writes into host-resident columns
  std::size_t rows_bytes = 0;   ///< the scatter's rows
  std::size_t table_bytes = 0;  ///< the scatter's rows, then room for its plan (scatter.hpp)
  bool scatters = false;        ///< device data, or host data for a GPU column

  insert_staging(std::int64_t count, std::int64_t steps, bool from_host) {
    for (std::size_t c = 0; c < Core::num_columns; ++c) {
      const std::int64_t bytes = packed_column_bytes<typename Core::spec_type>(steps, c);
      if (host_accessible(Core::placement[c])) {
        if (from_host) cpu_bytes += bytes;
      } else if (from_host) {
        staged_at[c] = staged_bytes;
        staged_bytes += bytes;
      }
    }
    scatters = !from_host || staged_bytes > 0;
    rows_bytes = static_cast<std::size_t>(
        align_up(count * std::int64_t{sizeof(scatter_row)}, segment_alignment));
    const std::int64_t plan = scatter_plan_bound(count, steps, Core::spec_type::step_bytes.data(),
                                                 static_cast<int>(Core::num_columns));
    table_bytes = rows_bytes + static_cast<std::size_t>(align_up(
                                   plan * std::int64_t{sizeof(scatter_block)}, segment_alignment));
  }
  /// Where the commit records start.
  [[nodiscard]] std::size_t records_at() const noexcept {
    return table_bytes + static_cast<std::size_t>(staged_bytes);
  }
  /// Device bytes of the lease.
  [[nodiscard]] std::size_t device_bytes() const noexcept { return scatters ? table_bytes : 0; }
};

/// Changes the ring for an insert or a commit of `lengths` and writes the keys.
template <class Core>
void commit_to_ring(Core& b, const reservation& r, std::span<const std::int64_t> lengths,
                    std::span<key> keys_out, slot_record* records = nullptr) noexcept {
  b.ring_.commit(r, lengths, records);
  for (std::int64_t i = 0; i < r.count; ++i)
    keys_out[static_cast<std::size_t>(i)] =
        b.key_of(r.first_ticket + static_cast<std::uint64_t>(i));
}

template <class Core, class Spec>
void insert_trajectories(Core& b, const trajectories<Spec>& in, std::span<key> keys_out,
                         cuda::stream_ref stream) {
  constexpr std::size_t columns = Spec::num_columns;
  check_insert(b, in, keys_out);
  const auto count = static_cast<std::int64_t>(in.lengths.size());
  if constexpr (Core::on_device) refuse_capture(stream);  // a driver call: before the mutex
  auto held = b.lock();
  b.check_usable();
  std::uint64_t first = b.ring_.next_ticket();
  auto slot = [&](std::size_t i) { return b.ring_.slot_of(first + i); };

  if constexpr (!Core::on_device) {
    std::int64_t bytes = 0;
    for (std::int64_t len : in.lengths)
      for (std::size_t c = 0; c < columns; ++c) bytes += len * Spec::step_bytes[c];
    run_evict_hook(b, first, count, stream);
    copy_host_columns(
        in, in.lengths, bytes, [](std::size_t) { return true; },
        [&](std::size_t c, std::size_t i) { return b.regions_.host[c].at(slot(i), 0); });
    const reservation r = b.reserve_in_ring(count, nullptr);
    commit_to_ring(b, r, in.lengths, keys_out);
    run_commit_hook(b, first, count, stream);
  } else {
#if defined(GEAR_DEVICE_BACKEND)
    // What goes where: GPU columns by the scatter (from staging for host data), host-resident
    // columns by the CPU (host data only).
    const bool from_host = in.source == memory_kind::host;
    std::int64_t steps = 0;
    for (std::int64_t len : in.lengths) steps += len;
    const insert_staging<Core> layout(count, steps, from_host);
    if (from_host && layout.cpu_bytes == 0 && lands(b, stream.get())) {
      land_trajectories(b, held, in, keys_out, stream, steps, layout.staged_at,
                        layout.staged_bytes);
      return;
    }
    const std::size_t records_at = layout.records_at();

    // The scatter's shape: the GPU columns it writes (host data leaves host-resident columns to
    // the CPU) and its blocks, planned where the rows differ in length (scatter.hpp). An insert
    // too large for one launch is refused here, before anything is acquired.
    scatter_args args;
    std::array<std::size_t, Core::num_columns> scatter_columns{};
    bool planned = false;
    if (layout.scatters) {
      args.count = count;
      std::int64_t shortest = in.lengths.empty() ? 0 : in.lengths[0];
      for (std::int64_t len : in.lengths) {
        args.max_count_length = std::max(args.max_count_length, len);
        shortest = std::min(shortest, len);
      }
      for (std::size_t c = 0; c < columns; ++c) {
        if (from_host && host_accessible(Core::placement[c])) continue;
        scatter_columns[static_cast<std::size_t>(args.num_columns)] = c;
        args.columns[args.num_columns++] = {nullptr, b.regions_.kernel[c].base,
                                            b.regions_.kernel[c].slot_stride,
                                            b.regions_.kernel[c].step_bytes};
      }
      // Equal lengths, or rows of one chunk per column: the grid has no empty block. A grid too
      // large to launch takes the plan whenever the plan is smaller.
      constexpr std::int64_t launchable = std::int64_t{1} << 31;
      const std::int64_t grid = scatter_grid(args).first_block[args.num_columns];
      const bool even = shortest == args.max_count_length || grid == count * args.num_columns;
      const std::int64_t plan = even ? grid : plan_scatter_blocks(args, in.lengths.data(), nullptr);
      planned = scatter_plan_pays(plan, grid) || (grid >= launchable && plan < grid);
      GEAR_REQUIRE((planned ? plan : grid) < launchable, errc::invalid_argument,
                   "an insert this large needs more than 2^31 copy blocks; insert fewer at once");
    }

    // Acquire: the staging lease, then (with the mutex let go) the host data for GPU columns
    // copied into it by the CPU.
    const staging_pool::lease lease =
        b.staging_.acquire(records_at + b.journal_bytes(count), layout.device_bytes());
    std::byte* data = lease.host + layout.table_bytes;
    if (layout.staged_bytes > 0) {
      held.unlock();
      const std::int64_t total[] = {steps};  // staged packed as given: one piece per column
      copy_host_columns(
          in, total, layout.staged_bytes,
          [](std::size_t c) { return !host_accessible(Core::placement[c]); },
          [&](std::size_t c, std::size_t) { return data + layout.staged_at[c]; });
      held.lock();
      first = b.ring_.next_ticket();
    }
    // The waits: the stream's work follows other streams' reads and writes (stream_order.hpp);
    // before the CPU overwrites evicted slots, the host waits for the reads that may have
    // selected them and the writes in flight to them (not for the rest of the caller's stream).
    try {
      b.check_usable();
      settle_landing(b, landing_force{}, stream);
      b.order_before(stream, Core::write);
      wait_for_takeovers(b, count);
      if (layout.cpu_bytes > 0) b.wait_before_cpu_write(stream);
    } catch (...) {
      b.staging_.give_back(lease);
      throw;
    }

    // The scatter's rows and sources, and its plan where it has one.
    auto* rows = reinterpret_cast<scatter_row*>(lease.host);
    std::int64_t at = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t len = in.lengths[static_cast<std::size_t>(i)];
      rows[i] = {slot(static_cast<std::size_t>(i)), at, len, first + static_cast<std::uint64_t>(i)};
      at += len;
    }
    std::size_t staged_table = static_cast<std::size_t>(count) * sizeof(scatter_row);
    if (layout.scatters) {
      args.rows = reinterpret_cast<const scatter_row*>(lease.device);
      for (int k = 0; k < args.num_columns; ++k) {
        const std::size_t c = scatter_columns[static_cast<std::size_t>(k)];
        args.columns[k].src = from_host ? lease.mapped + layout.table_bytes + layout.staged_at[c]
                                        : static_cast<const std::byte*>(in.columns[c].data);
      }
      if (planned) {
        plan_scatter_blocks(args, in.lengths.data(),
                            reinterpret_cast<scatter_block*>(lease.host + layout.rows_bytes));
        args.blocks = reinterpret_cast<const scatter_block*>(lease.device + layout.rows_bytes);
        staged_table =
            layout.rows_bytes +
            static_cast<std::size_t>(args.first_block[args.num_columns]) * sizeof(scatter_block);
      }
    }

    // Change: from here a failure leaves the buffer unusable.
    b.enqueue([&] {
      if (layout.cpu_bytes > 0)
        copy_host_columns(
            in, in.lengths, layout.cpu_bytes,
            [](std::size_t c) { return host_accessible(Core::placement[c]); },
            [&](std::size_t c, std::size_t i) { return b.regions_.host[c].at(slot(i), 0); });
      run_evict_hook(b, first, count, stream);
      // The commit: the ring's commit records, written before the launch that applies them.
      const reservation r = b.reserve_in_ring(count, nullptr);
      commit_to_ring(b, r, in.lengths, keys_out,
                     reinterpret_cast<slot_record*>(lease.host + records_at));
      const journal_args journal = b.journal_of(lease, records_at, count);
      bool applied = false;
      if (layout.scatters) {
        // Every block reads its row (and plan entry): from device memory, not over PCIe. The
        // scatter's threads apply the commit beside the copies: later work sees it with the bytes.
        GEAR_CUDA_TRY(cudaMemcpyAsync(lease.device, lease.host, staged_table,
                                      cudaMemcpyHostToDevice, stream.get()));
        applied = scatter_on_device(args, stream, journal_beside{journal});
      }
      if (!applied) apply_journal_on_device(journal, stream);
      b.staging_.release_after(lease, stream.get());
      run_commit_hook(b, first, count, stream);
      b.order_after(stream, Core::write);
    });
#else
    static_assert(dependent_false<Core>,
                  "gear: GPU storage needs <gear/gear.cuh>, compiled by nvcc");
#endif
  }
}

}  // namespace gear::detail
