#pragma once
// Block-wide byte copies and fills, with the widest accesses the alignment allows.

#include <cstddef>
#include <cstdint>
#include <gear/detail/column_blocks.hpp>
#include <gear/detail/tuning.hpp>
#include <gear/spec.hpp>

namespace gear::detail {

__device__ constexpr std::int64_t min64(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
__device__ constexpr std::int64_t max64(std::int64_t a, std::int64_t b) { return a < b ? b : a; }

/// Threads [0, stride) of a group, this one `tid`, copy n bytes from src to dst (16-, 4- or
/// 1-byte accesses by alignment).
__device__ inline void group_copy(std::byte* dst, const std::byte* src, std::int64_t n, int tid,
                                  int stride) {
  const auto align = reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src);
  std::int64_t done = 0;
  if ((align & 15) == 0) {
    // All loads of an unrolled group are issued before its stores, so each thread keeps
    // copy_vectors_per_thread reads in flight: that hides PCIe latency for zero-copy sources.
    constexpr int unroll = tuning::copy_vectors_per_thread;
    const std::int64_t vectors = n / 16;
    auto* d = reinterpret_cast<uint4*>(dst);
    const auto* s = reinterpret_cast<const uint4*>(src);
    std::int64_t i = tid;
    for (; i + (unroll - 1) * stride < vectors; i += unroll * stride) {
      uint4 v[unroll];
#pragma unroll
      for (int u = 0; u < unroll; ++u) v[u] = s[i + u * stride];
#pragma unroll
      for (int u = 0; u < unroll; ++u) d[i + u * stride] = v[u];
    }
    for (; i < vectors; i += stride) d[i] = s[i];
    done = vectors * 16;
  } else if ((align & 3) == 0) {
    const std::int64_t words = n / 4;
    auto* d = reinterpret_cast<std::uint32_t*>(dst);
    const auto* s = reinterpret_cast<const std::uint32_t*>(src);
    for (std::int64_t i = tid; i < words; i += stride) d[i] = s[i];
    done = words * 4;
  }
  for (std::int64_t i = done + tid; i < n; i += stride) dst[i] = src[i];
}

/// Threads [0, stride) of a group, this one `tid`, write n zero bytes at dst.
__device__ inline void group_zero(std::byte* dst, std::int64_t n, int tid, int stride) {
  std::int64_t done = 0;
  if ((reinterpret_cast<std::uintptr_t>(dst) & 15) == 0) {
    const std::int64_t vectors = n / 16;
    auto* d = reinterpret_cast<uint4*>(dst);
    for (std::int64_t i = tid; i < vectors; i += stride) d[i] = make_uint4(0, 0, 0, 0);
    done = vectors * 16;
  }
  for (std::int64_t i = done + tid; i < n; i += stride) dst[i] = std::byte{0};
}

/// The block copies n bytes from src to dst.
__device__ inline void block_copy(std::byte* dst, const std::byte* src, std::int64_t n) {
  group_copy(dst, src, n, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}
/// The block writes n zero bytes at dst.
__device__ inline void block_zero(std::byte* dst, std::int64_t n) {
  group_zero(dst, n, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

}  // namespace gear::detail
