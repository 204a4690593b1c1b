#pragma once
// The journal's kernel: applies one call's slot records to the device mirror, in stream order.

#include <cuda/stream_ref>
#include <gear/detail/buffer/mirror.hpp>
#include <gear/detail/cuda.hpp>
#include <gear/detail/tuning.hpp>

namespace gear::detail {

/// One call's records (mapped pinned memory, read zero-copy) and the mirror they change.
struct journal_args {
  const slot_record* records = nullptr;
  std::int64_t count = 0;
  slot_mirror mirror{};
  std::int64_t capacity = 1;
};

template <class Args>  // always journal_args; a template so that headers define it once per use
__global__ void journal_apply_kernel(const Args a) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < a.count;
       i += std::int64_t{gridDim.x} * blockDim.x)
    apply_slot_record(a.mirror, a.capacity, a.records[i]);
}

/// Launches the apply on `stream`; checks the launch, never synchronises.
inline void apply_journal_on_device(const journal_args& a, cuda::stream_ref stream) {
  if (a.count <= 0) return;
  constexpr int threads = tuning::journal_threads;
  const std::int64_t wanted = (a.count + threads - 1) / threads;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>(wanted, tuning::journal_max_blocks));
  journal_apply_kernel<<<blocks, threads, 0, stream.get()>>>(a);
  GEAR_CHECK_LAUNCH("journal_apply_kernel");
}

}  // namespace gear::detail
