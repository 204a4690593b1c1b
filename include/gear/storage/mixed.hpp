#pragma once
#include <gear/storage/concept.hpp>
#include <gear/storage/device.hpp>
#include <gear/storage/pinned_host.hpp>

namespace gear::storage {

/// Per-column placement: one of pinned_host or device for each column of the spec, in order.
/// Large columns (observations) go to pinned host memory, small hot ones (rewards, actions) to the
/// device, so a sample crosses PCIe only for what lives on the host.
///
///   gear::storage::mixed<gear::storage::pinned_host, gear::storage::device, gear::storage::device>
template <class... PerColumn>
struct mixed {
  template <std::size_t N>
  static constexpr std::array<memory_kind, N> placement() noexcept {
    static_assert(N == sizeof...(PerColumn),
                  "gear::storage::mixed: give exactly one placement per column of the spec");
    return {PerColumn::template placement<1>()[0]...};
  }
};

}  // namespace gear::storage
