#pragma once
// Copies chosen rows of one batch into another of the same spec and window: row j of `to` takes
// every part (the columns, the mask, the key, the slot, the probability and the weight) of row
// from[j] of `source` (rank_sampler: a rank's rows of a step's joint batch). row_copy.cuh does it
// on the GPU.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <gear/batch.hpp>
#include <gear/key.hpp>
#include <gear/spec.hpp>

namespace gear::detail {

/// The parts of two batches' rows: part p of a row is row_bytes[p] bytes at base + row *
/// row_bytes[p].
struct row_parts {
  static constexpr int max_parts = static_cast<int>(max_columns) + 5;
  std::byte* to[max_parts] = {};
  const std::byte* from[max_parts] = {};
  std::int64_t row_bytes[max_parts] = {};
  int count = 0;

  void add(void* t, const void* f, std::int64_t bytes) noexcept {
    to[count] = static_cast<std::byte*>(t);
    from[count] = static_cast<const std::byte*>(f);
    row_bytes[count] = bytes;
    ++count;
  }
  /// Requires the batches to share their spec and window length.
  template <trajectory_spec Spec>
  static row_parts of(const batch<Spec>& to, const batch<Spec>& from) noexcept {
    row_parts p;
    const std::int64_t steps = to.window_length();
    for (std::size_t c = 0; c < Spec::num_columns; ++c)
      p.add(to.column_data(c), from.column_data(c), steps * Spec::step_bytes[c]);
    p.add(to.mask_data(), from.mask_data(), steps);
    p.add(to.keys_data(), from.keys_data(), sizeof(key));
    p.add(to.slots_data(), from.slots_data(), sizeof(std::int64_t));
    p.add(to.probabilities_data(), from.probabilities_data(), sizeof(float));
    p.add(to.weights_data(), from.weights_data(), sizeof(float));
    return p;
  }
};

/// Row j of `p.to` = row rows_from[j] of `p.from`, for j in [0, rows).
inline void copy_rows_on_host(const row_parts& p, const std::int32_t* rows_from,
                              std::int64_t rows) {
  for (std::int64_t j = 0; j < rows; ++j)
    for (int k = 0; k < p.count; ++k)
      std::memcpy(p.to[k] + j * p.row_bytes[k], p.from[k] + rows_from[j] * p.row_bytes[k],
                  static_cast<std::size_t>(p.row_bytes[k]));
}

}  // namespace gear::detail
