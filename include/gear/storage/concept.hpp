#pragma once
// The storage policy concept.
//
// A storage policy says where the bytes of each column live. It is a small tag type with
//
//   template <std::size_t NumColumns>
//   static constexpr std::array<memory_kind, NumColumns> placement();
//
// giving the memory kind of every column. gear allocates one region per kind in use (see
// layout.hpp) and decides where selection and gathering run from it: on the CPU when every column
// is in pageable host memory, otherwise on the GPU (which reads pinned host memory zero-copy).
// Pageable host memory cannot be mixed with GPU placements, since the GPU cannot read it.

#include <array>
#include <concepts>
#include <cstddef>
#include <gear/detail/memory.hpp>

namespace gear {

template <class S, std::size_t NumColumns>
concept storage_policy_for = requires {
  { S::template placement<NumColumns>() } -> std::same_as<std::array<memory_kind, NumColumns>>;
};

namespace detail {

/// True when a storage placement runs selection and gathering on the GPU.
template <std::size_t N>
constexpr bool executes_on_device(const std::array<memory_kind, N>& placement) noexcept {
  for (memory_kind k : placement)
    if (k != memory_kind::host) return true;
  return false;
}

/// True unless pageable host columns are mixed with GPU-side columns.
template <std::size_t N>
constexpr bool placement_consistent(const std::array<memory_kind, N>& placement) noexcept {
  bool any_host = false, any_gpu = false;
  for (memory_kind k : placement) (k == memory_kind::host ? any_host : any_gpu) = true;
  return !(any_host && any_gpu);
}

template <memory_kind Kind>
struct uniform_placement {
  template <std::size_t N>
  static constexpr std::array<memory_kind, N> placement() noexcept {
    std::array<memory_kind, N> p{};
    p.fill(Kind);
    return p;
  }
};

}  // namespace detail
}  // namespace gear
