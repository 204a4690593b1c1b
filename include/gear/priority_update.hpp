#pragma once
// What a priority update did.

#include <cstdint>

namespace gear {

/// The outcome of replay_buffer::update_priorities from host memory: pairs whose key named a live
/// trajectory were applied; pairs whose trajectory had been evicted or removed since it was
/// sampled were skipped. A key named twice counts once per occurrence.
struct priority_update_result {
  std::int64_t applied = 0;
  std::int64_t stale = 0;

  friend constexpr bool operator==(const priority_update_result&,
                                   const priority_update_result&) = default;
};

}  // namespace gear
