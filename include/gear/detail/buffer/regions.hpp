#pragma once
// Slot bytes: one allocation per memory kind a spec's columns are placed in (layout.hpp), and each
// column's geometry as the CPU and as kernels address it.

#include <array>
#include <cstddef>
#include <cstdint>
#include <gear/detail/memory.hpp>
#include <gear/error.hpp>
#include <gear/layout.hpp>
#include <string>

namespace gear::detail {

template <class Spec>
struct slot_regions {
  static constexpr std::size_t num_columns = Spec::num_columns;

  std::array<allocation, 3> memory{};
  std::array<column_geometry, num_columns> host{};    ///< CPU addresses
  std::array<column_geometry, num_columns> kernel{};  ///< addresses selection and kernels use

  /// Allocates `capacity` slots of `max_length` steps, each kind from its resource in `from`
  /// (memory_resource.hpp). Throws errc::out_of_memory, errc::wrong_memory,
  /// errc::misaligned_pointer, errc::cuda_error.
  slot_regions(const std::array<memory_kind, num_columns>& placement, std::int64_t capacity,
               std::int64_t max_length, const memory_resources& from = {}) {
    constexpr memory_kind kinds[] = {memory_kind::host, memory_kind::pinned_host,
                                     memory_kind::device};
    const memory_resource_ref resources[] = {from.host, from.pinned, from.device};
    for (std::size_t k = 0; k < 3; ++k) {
      std::int64_t slot_bytes = 0;
      std::array<std::int64_t, num_columns> offset{};
      constexpr std::int64_t most = std::int64_t{1} << 62;
      for (std::size_t c = 0; c < num_columns; ++c) {
        if (placement[c] != kinds[k]) continue;
        offset[c] = slot_bytes;
        // Checked before the product: max_length x step bytes must not wrap.
        GEAR_REQUIRE(max_length <= (most - slot_bytes - segment_alignment) / Spec::step_bytes[c],
                     errc::out_of_memory,
                     "a slot of " + std::to_string(max_length) + " steps would take more than "
                     "2^62 bytes (column " + std::to_string(c) + ": " +
                         std::to_string(Spec::step_bytes[c]) + " bytes a step)");
        slot_bytes += segment_bytes(Spec::step_bytes[c], max_length);
      }
      if (slot_bytes == 0) continue;
      GEAR_REQUIRE(slot_bytes <= most / capacity, errc::out_of_memory,
                   std::to_string(capacity) + " slots of " + std::to_string(slot_bytes) +
                       " bytes would take more than 2^62 bytes");
      memory[k] =
          allocation(kinds[k], static_cast<std::size_t>(slot_bytes * capacity), resources[k]);
      for (std::size_t c = 0; c < num_columns; ++c) {
        if (placement[c] != kinds[k]) continue;
        host[c] = {memory[k].data() + offset[c], slot_bytes, Spec::step_bytes[c]};
        kernel[c] = {memory[k].device_data() + offset[c], slot_bytes, Spec::step_bytes[c]};
      }
    }
  }
};

}  // namespace gear::detail
