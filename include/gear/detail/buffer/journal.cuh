#pragma once
// The journal's kernel: applies one call's slot records to the device mirror, in stream order.

#include <algorithm>
#include <cuda/stream_ref>
#include <gear/detail/buffer/mirror.hpp>
#include <gear/detail/cuda.hpp>
#include <gear/detail/tuning.hpp>

namespace gear::detail {

/// One call's records (mapped pinned memory, read zero-copy) and the mirror they change: slot
/// records, and the dense index's changes.
struct journal_args {
  const slot_record* records = nullptr;
  std::int64_t count = 0;
  const index_record* index = nullptr;
  std::int64_t index_count = 0;
  slot_mirror mirror{};
  std::int64_t capacity = 1;
  std::int64_t live = 0;  ///< the live count once these records are applied (mirror.live)
};

template <class Args>  // always journal_args; a template so that headers define it once per use
__global__ void journal_apply_kernel(const Args a) {
  const std::int64_t n = a.count > a.index_count ? a.count : a.index_count;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.mirror.live = a.live;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    if (i < a.count) apply_slot_record(a.mirror, a.capacity, a.records[i]);
    if (i < a.index_count) a.mirror.dense[a.index[i].position] = a.index[i].slot;
  }
}

/// Launches the apply on `stream`; checks the launch, never synchronises. An apply of no records
/// launches nothing: the live count changes only with slot records.
inline void apply_journal_on_device(const journal_args& a, cuda::stream_ref stream) {
  const std::int64_t n = std::max(a.count, a.index_count);
  if (n <= 0) return;
  constexpr int threads = tuning::journal_threads;
  const std::int64_t wanted = (n + threads - 1) / threads;
  const auto blocks =
      static_cast<unsigned>(std::min<std::int64_t>(wanted, tuning::journal_max_blocks));
  journal_apply_kernel<<<blocks, threads, 0, stream.get()>>>(a);
  GEAR_CHECK_LAUNCH("journal_apply_kernel");
}

}  // namespace gear::detail
