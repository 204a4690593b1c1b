#pragma once
// The journal's kernel: applies one call's slot records to the device mirror, in stream order.

#include <algorithm>
#include <cuda/stream_ref>
#include <gear/detail/buffer/mirror.hpp>
#include <gear/detail/buffer/staging.hpp>
#include <gear/detail/cuda.hpp>
#include <gear/detail/dependent_launch.cuh>
#include <gear/detail/tuning.hpp>

namespace gear::detail {

/// Applies records [first, n) with stride `stride` (n: the larger of the two counts); the
/// thread with first == 0 also writes the live count. Threads of a kernel or of one block.
__device__ inline void apply_journal_part(const journal_args& a, std::int64_t first,
                                          std::int64_t stride) {
  const std::int64_t n = a.count > a.index_count ? a.count : a.index_count;
  if (first == 0) *a.mirror.live = a.live;
  for (std::int64_t i = first; i < n; i += stride) {
    if (i < a.count) apply_slot_record(a.mirror, a.capacity, a.records[i]);
    if (i < a.index_count) a.mirror.dense[a.index[i].position] = a.index[i].slot;
  }
}

template <class Args>  // always journal_args; a template so that headers define it once per use
__global__ void journal_apply_kernel(const Args a) {
  allow_dependents();  // a gather after it may be placed now (dependent_launch.cuh)
  apply_journal_part(a, blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x,
                     std::int64_t{gridDim.x} * blockDim.x);
}

/// An apply run by the last block of another launch to read the metadata it changes, in place of
/// a launch of its own: the gather of a sample that removes the rows it returns (gather.cuh's
/// epilogue). `arrivals`: a word that is 0 when that launch starts (selection_workspace).
/// `done`, if its word is set: written once the apply is done, when nothing of the launch reads
/// the staging the records (and the rows the launch gathers) came from any more (staging.hpp's
/// signals).
struct journal_epilogue {
  journal_args journal;
  unsigned* arrivals = nullptr;
  staging_pool::signal done{};
  static constexpr bool present = true;
  __device__ void operator()() const {
    apply_journal_part(journal, threadIdx.x, blockDim.x);
    if (done.word == nullptr) return;
    __syncthreads();  // every thread of the block has read its records
    if (threadIdx.x == 0) {
      __threadfence_system();
      *static_cast<volatile std::uint64_t*>(done.word) = done.value;
    }
  }
};

/// An apply run beside another launch's own work by all of its threads, in place of a launch of
/// its own: the scatter of an insert (scatter.cuh), whose bytes no later work in stream order can
/// see before the launch has ended. Records of one apply name distinct slots, so the order of
/// their threads does not matter.
struct journal_beside {
  journal_args journal;
  static constexpr bool present = true;
  __device__ void operator()(std::int64_t first, std::int64_t stride) const {
    apply_journal_part(journal, first, stride);
  }
};

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
