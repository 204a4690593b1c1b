#pragma once
// Host-side copies of packed trajectories into slots, spread over several threads when large:
// one CPU thread cannot saturate host memory bandwidth, which host-to-pinned inserts need.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <system_error>
#include <thread>

namespace gear::detail {

/// Bytes below which a host copy stays on the calling thread, and bytes per extra thread.
inline constexpr std::int64_t parallel_copy_grain = std::int64_t{4} << 20;
/// Most threads one host copy uses.
inline constexpr unsigned max_copy_threads = 16;

/// Threads worth using for a copy of `bytes` bytes.
inline unsigned copy_threads_for(std::int64_t bytes) noexcept {
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const auto wanted =
      static_cast<unsigned>(std::min<std::int64_t>(bytes / parallel_copy_grain, 64));
  return std::clamp(wanted, 1u, std::min(hardware, max_copy_threads));
}

/// Runs f(t) for t in [0, n): t = 0 on the calling thread, the others on their own threads. If a
/// thread cannot be started, the calling thread runs its share.
template <class F>
void parallel_for(unsigned n, F&& f) {
  if (n <= 1) {
    f(0u);
    return;
  }
  std::jthread workers[max_copy_threads];
  for (unsigned t = 1; t < n && t < max_copy_threads; ++t) {
    try {
      workers[t] = std::jthread([&f, t] { f(t); });
    } catch (const std::system_error&) {
      f(t);
    }
  }
  f(0u);
}  // jthreads join here

/// Copies share `part` of `parts` of one packed column into slots: the bytes
/// [total * part / parts, total * (part + 1) / parts) of the packed source, where trajectory i
/// (lengths[i] steps of step_bytes) goes to dst_of(i).
template <class DstOf>
void copy_packed_share(const std::byte* src, std::span<const std::int64_t> lengths,
                       std::int64_t step_bytes, DstOf&& dst_of, unsigned part, unsigned parts) {
  std::int64_t total = 0;
  for (std::int64_t l : lengths) total += l * step_bytes;
  const std::int64_t lo = total * part / parts, hi = total * (part + 1) / parts;
  std::int64_t at = 0;
  for (std::size_t i = 0; i < lengths.size() && at < hi; ++i) {
    const std::int64_t bytes = lengths[i] * step_bytes;
    const std::int64_t from = std::max(lo, at), to = std::min(hi, at + bytes);
    if (from < to)
      std::memcpy(dst_of(i) + (from - at), src + from, static_cast<std::size_t>(to - from));
    at += bytes;
  }
}

}  // namespace gear::detail
