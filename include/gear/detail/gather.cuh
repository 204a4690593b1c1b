#pragma once
// The fused gather kernel: one launch copies the windows of every row of every column.
//
// Column c's rows are split into chunks of tuning::copy_chunk_bytes; block b finds its column
// from the per-column block counts, then its row and chunk. Rows of one chunk or less share a
// block where the row function allows (column_blocks: up to tuning::gather_max_rows_per_block, a
// group of whole warps per row); what follows a block does for its row, a group does for its
// row there. Each block learns its row's slot
// (Rows: read from an earlier select() launch, drawn right here by the policy's row_selector, or
// read from the staging where the host chose them: fifo, lifo),
// resolves the row's window (plan_window, the same function as the host loop), copies the
// chunk's part of the valid steps and zero-fills the chunk's padding. The first block of each row
// in column 0 also writes the row's mask and key, and, when it drew the row, its slot,
// probability and weight (for prioritized rows a placeholder weight, which the last block's
// weights epilogue overwrites once every row's leaf is known).

#include <cuda/stream_ref>
#include <gear/detail/copy.cuh>
#include <gear/detail/cuda.hpp>
#include <gear/detail/dependent_launch.cuh>
#include <gear/detail/gather.hpp>
#include <gear/detail/last_block.cuh>
#include <gear/detail/tuning.hpp>
#include <gear/select/concept.hpp>
#include <utility>
#include <variant>

namespace gear::detail {

static_assert(tuning::gather_max_rows_per_block == row_group::max_groups);

/// A row function called by every thread of the block with its group (select/concept.hpp).
template <class F>
concept grouped_rows = requires(const F& f, std::int64_t row, const row_group& g) {
  { f(row, g) } -> std::same_as<selected_row>;
};
/// A row function that any thread may call on its own (`static constexpr bool per_thread`).
template <class F>
concept per_thread_rows = requires {
  { F::per_thread } -> std::convertible_to<bool>;
}
&&F::per_thread;
/// Most rows one gather block copies with row function F: a block per row for a function that
/// works as a block without saying so with a group.
template <class F>
inline constexpr int gather_rows_per_block =
    grouped_rows<F> || per_thread_rows<F> ? tuning::gather_max_rows_per_block : 1;

/// Rows chosen by an earlier select() launch.
struct stored_rows {
  const std::int64_t* slots = nullptr;
  static constexpr bool publishes = false;
  static constexpr bool per_thread = true;
  __device__ selected_row operator()(std::int64_t row) const { return {slots[row], 0.0f, 0.0f}; }
};

/// Rows drawn in the gather kernel by a policy's row function F, published to the request.
template <class F>
struct drawn_rows {
  F draw;
  std::int64_t* slots = nullptr;
  float* probabilities = nullptr;
  float* weights = nullptr;
  static constexpr bool publishes = true;
  static constexpr bool per_thread = per_thread_rows<F>;
  __device__ selected_row operator()(std::int64_t row) const requires(!grouped_rows<F>) {
    return draw(row);
  }
  __device__ selected_row operator()(std::int64_t row,
                                     const row_group& g) const requires grouped_rows<F> {
    return draw(row, g);
  }
  __device__ void read_device_counts() {
    if constexpr (requires { draw.read_device_counts(); }) draw.read_device_counts();
  }
};

/// A block of a sample drawn with a gear::device_rng has read the call number (every thread of
/// it, before the call): the last block of the sample's last kernel to get here advances the
/// number and clears the count for the next sample. Called when the block starts, not when it
/// ends: a fence there has no stores of the block's to wait for (at the end, each of 1024 blocks
/// waited for its copies to drain, 3 us per sample on the H200).
__device__ inline void arrive_draw(draw_counter& w) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence();
  const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
  if (atomicAdd(&w.finished, 1u) + 1 == blocks) {
    __threadfence();
    w.finished = 0;
    w.call += 1;
  }
}

/// Advances a device_rng's call number for a sample whose gather has no blocks (no rows).
template <class Counter>  // always draw_counter
__global__ void advance_draw_kernel(Counter* w) {
  w->call += 1;
}

/// No work after the gather's reads of metadata.
struct no_epilogue {
  static constexpr bool present = false;
};

/// Two epilogues after one arrival (they count in the same word: the batch's arrivals).
template <class First, class Second>
struct both_epilogues {
  First first;
  Second second;
  unsigned* arrivals = nullptr;
  static constexpr bool present = true;
  __device__ void operator()() const {
    first();
    __syncthreads();
    second();
  }
};
/// The epilogue of both: no_epilogue where neither has one, the one where one has.
template <class First, class Second>
auto combine_epilogues(const First& a, const Second& b) {
  if constexpr (!First::present)
    return b;
  else if constexpr (!Second::present)
    return a;
  else
    return both_epilogues<First, Second>{a, b, a.arrivals};
}
/// A row function's epilogue (row_selecting's F::epilogue()), or none.
template <class F>
auto epilogue_of(const F& f) {
  if constexpr (requires { f.epilogue(); })
    return f.epilogue();
  else
    return no_epilogue{};
}
/// Calls g with the row function, or with the alternative a std::variant of them holds.
template <class F, class G>
void with_row_function(const F& f, G&& g) {
  g(f);
}
template <class... F, class G>
void with_row_function(const std::variant<F...>& v, G&& g) {
  std::visit(std::forward<G>(g), v);
}

// Kernels in gear's headers are templates (here on the argument type, always gather_args), so that
// every translation unit that includes them can instantiate them without duplicate symbols.
// Grouped: some column's rows share blocks (g.items_per_block). A grid of a block per row takes
// the kernel without groups: the group's values are then the block's, known to the compiler, and
// the kernel keeps the registers of a plain block copy (32 where grouped code takes 64 on sm_90,
// half the resident blocks).
template <class Args, class Rows, class Epilogue, bool Grouped>
__global__ void __launch_bounds__(tuning::copy_threads)
    gather_kernel(const Args a, const column_blocks g, Rows rows, const Epilogue after) {
  // Launched as a programmatic dependent (dependent_launch.cuh): nothing is read or written
  // before the kernel before it has finished; the next sample's gather may be placed at once.
  allow_dependents();
  wait_for_prerequisites();
  int c, group = 0, lane = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  std::int64_t first, chunk;
  g.locate(blockIdx.x, c, first, chunk);
  if constexpr (Grouped)
    g.group_of(c, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), group, lane,
               threads);
  const std::int64_t row = first + group;
  const bool active = !Grouped || row < a.batch;  // a block's last groups may have no row

  rng_draw draw = a.draw;
  if (a.counter != nullptr) {  // a sample with a device_rng: the call number as of now
    draw.call = a.counter->call;
    if constexpr (requires { rows.read_device_counts(); }) rows.read_device_counts();
    arrive_draw(*a.counter);
  }
  selected_row selected{};
  if constexpr (grouped_rows<Rows>)
    selected = rows(row, row_group{group, lane, threads, active});  // every thread
  else if (active)  // every thread where a block has one row
    selected = rows(row);
  const std::int64_t slot = selected.slot;
  const window_plan p = active ? row_plan(a, draw, row, slot) : window_plan{};
  if (active && c == 0 && chunk == 0) {
    std::uint8_t* mask = a.mask + row * a.win.length;
    for (std::int64_t t = lane; t < a.win.length; t += threads)
      mask[t] = (t >= p.dst_pos && t < p.dst_pos + p.count);
    if (lane == 0) {
      a.keys[row] = row_key(a, slot);
      if constexpr (Rows::publishes) {
        rows.slots[row] = slot;
        rows.probabilities[row] = selected.probability;
        rows.weights[row] = selected.weight;
      }
    }
  }
  // Every block has read its row's metadata: the last to get here may change it (before its
  // copy, which reads slot bytes only).
  if constexpr (Epilogue::present)
    if (last_block_to_arrive(after.arrivals)) after();
  if (!active) return;

  const auto& col = a.columns[c];
  const std::int64_t row_bytes = a.win.length * col.step_bytes;
  const std::int64_t lo = chunk * tuning::copy_chunk_bytes;
  const std::int64_t hi = min64(lo + tuning::copy_chunk_bytes, row_bytes);
  const std::int64_t valid_lo = p.dst_pos * col.step_bytes;
  const std::int64_t valid_hi = valid_lo + p.count * col.step_bytes;
  std::byte* dst = col.dst + row * row_bytes;
  const std::byte* src = col.src + slot * col.slot_stride + p.src_step * col.step_bytes - valid_lo;

  const std::int64_t copy_lo = max64(lo, valid_lo), copy_hi = min64(hi, valid_hi);
  if (copy_lo < copy_hi) {
    // The fills first: nothing but the copy's own values is live in its unrolled loop.
    group_zero(dst + lo, copy_lo - lo, lane, threads);
    group_zero(dst + copy_hi, hi - copy_hi, lane, threads);
    group_copy(dst + copy_lo, src + copy_lo, copy_hi - copy_lo, lane, threads);
  } else {
    group_zero(dst + lo, hi - lo, lane, threads);
  }
}

/// How the blocks of the gather described by `a` are shared out, at most `rows_per_block` rows
/// (gather_rows_per_block of its row function) in a block.
inline column_blocks gather_blocks(const gather_args& a, int rows_per_block) {
  std::int64_t row_bytes[max_columns];
  for (int c = 0; c < a.num_columns; ++c) row_bytes[c] = a.win.length * a.columns[c].step_bytes;
  return column_blocks::make(a.num_columns, a.batch, row_bytes, rows_per_block);
}

/// Launches the gather of the rows `rows` names on `stream`, on grid g (gather_blocks with
/// gather_rows_per_block<Rows> rows a block at most), with `after` run by its last block
/// once every block has read its row's metadata (no_epilogue: nothing); checks the launch, never
/// synchronises. Expects fewer than 2^31 blocks (select_and_gather_on_device checks), and at
/// least one where `after` has work (batches and windows have a row and a step at least).
template <class Rows, class Epilogue = no_epilogue>
void gather_on_device(const gather_args& a, const column_blocks& g, const Rows& rows,
                      cuda::stream_ref stream, const Epilogue& after = {}) {
  const std::int64_t blocks = g.first_block[a.num_columns];  // < 2^31: checked by the caller
  if (blocks == 0) {
    if (a.counter != nullptr) {
      advance_draw_kernel<<<1, 1, 0, stream.get()>>>(a.counter);
      GEAR_CHECK_LAUNCH("advance_draw_kernel");
    }
    return;
  }
  bool grouped = false;
  for (int c = 0; c < a.num_columns; ++c) grouped = grouped || g.items_per_block[c] > 1;
  if constexpr (gather_rows_per_block < Rows >> 1) {
    if (grouped) {
      launch_dependent<gather_kernel<gather_args, Rows, Epilogue, true>>(
          dim3(static_cast<unsigned>(blocks)), dim3(tuning::copy_threads), stream.get(), a, g, rows,
          after);
      return;
    }
  } else {
    // The kernel without groups copies one row a block: a grid that shares blocks would lose rows.
    GEAR_REQUIRE(!grouped, errc::invalid_argument,
                 "gather: a grid whose blocks share rows, for a row function that takes a block "
                 "per row");
  }
  launch_dependent<gather_kernel<gather_args, Rows, Epilogue, false>>(
      dim3(static_cast<unsigned>(blocks)), dim3(tuning::copy_threads), stream.get(), a, g, rows,
      after);
}

/// Selects with `state` and gathers. Where the gather is small enough that one launch saves more
/// than reading every row in each of its blocks costs (tuning::fused_gather_max_waves), the gather
/// kernel reads the rows itself: drawn by the policy's row_selector, or chosen on the host
/// (with_chosen_rows); otherwise the policy's select() launch runs first. `request` and `a`
/// describe the same batch. `prepare()` runs once the rows are chosen (on the host, for a state
/// that chooses them there: host_rows() holds them) and before the gather is enqueued; it returns
/// the gather's epilogue (no_epilogue, or work for its last block).
template <class State, class Prepare>
void select_and_gather_on_device(State& state, const slot_table& table,
                                 const selection_request& request, const gather_args& a,
                                 cuda::stream_ref stream, Prepare&& prepare) {
  // A block per row: the largest grid any row function takes.
  const column_blocks row_blocks = gather_blocks(a, 1);
  // Before anything is selected or prepared: a refusal here changes nothing.
  GEAR_REQUIRE(row_blocks.first_block[a.num_columns] < (std::int64_t{1} << 31),
               errc::invalid_argument,
               "a batch this large needs more than 2^31 copy blocks; sample fewer rows at once");
  const std::int64_t one_wave = std::int64_t{multiprocessors()} * tuning::copy_blocks_per_sm;
  const auto fits = [&](const column_blocks& g) {  // small enough to draw its rows itself
    const std::int64_t blocks = g.first_block[a.num_columns];
    return blocks > 0 && blocks <= tuning::fused_gather_max_waves * one_wave;
  };
  // The gather of rows that row function `draw` gives, on its grid g.
  auto gather_drawn_on = [&](const auto& draw, const column_blocks& g) {
    using Rows = drawn_rows<std::remove_cvref_t<decltype(draw)>>;
    gather_on_device(a, g, Rows{draw, request.slots, request.probabilities, request.weights},
                     stream, combine_epilogues(prepare(), epilogue_of(draw)));
  };
  auto gather_drawn = [&](const auto& draw) {
    using Rows = drawn_rows<std::remove_cvref_t<decltype(draw)>>;
    gather_drawn_on(draw, gather_blocks(a, gather_rows_per_block<Rows>));
  };
  // The smallest grid any row function takes: where even it does not fit, no row_selector is
  // asked for (a policy may compute something to make one).
  if constexpr (row_selecting<State>) {
    auto draw = fits(gather_blocks(a, tuning::gather_max_rows_per_block))
                    ? state.row_selector(table, request)
                    : decltype(state.row_selector(table, request)){};
    if (draw) {
      bool drawn = false;
      with_row_function(*draw, [&](const auto& f) {
        using Rows = drawn_rows<std::remove_cvref_t<decltype(f)>>;
        const column_blocks g = gather_blocks(a, gather_rows_per_block<Rows>);
        if (!fits(g)) return;
        gather_drawn_on(f, g);
        drawn = true;
      });
      if (drawn) return;
    }
  }
  if constexpr (host_row_choosing<State>) {
    // Decided before the rows are chosen, on the grid of a block per row (the row function's
    // type is the state's own): the largest the gather may take.
    if (fits(row_blocks)) {
      state.with_chosen_rows(table, request, stream, gather_drawn);
      return;
    }
  }
  state.select(table, request, stream);
  gather_on_device(a, gather_blocks(a, gather_rows_per_block<stored_rows>), stored_rows{a.slots},
                   stream, prepare());
}

}  // namespace gear::detail
