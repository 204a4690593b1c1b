#pragma once
// The kernel that publishes landing inserts (landing.hpp) in one launch: it places their bytes,
// uploaded already into the device part of their staging, into their slots; applies the settle's
// slot records to the mirror; and, in its last block, signals every staging lease it read as
// free (staging.hpp's signals), so that the settle records no event and queries none later.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/buffer/journal.cuh>
#include <gear/detail/buffer/landing_state.hpp>
#include <gear/detail/buffer/staging.hpp>
#include <gear/detail/copy.cuh>
#include <gear/detail/cuda.hpp>
#include <gear/detail/dependent_launch.cuh>
#include <gear/detail/last_block.cuh>
#include <gear/detail/tuning.hpp>

namespace gear::detail {

/// One publish: the records (`journal`), the pieces and the signals all live in the settle's own
/// lease of mapped pinned memory, whose signal, if it has one, is the last (or in the launch's
/// parameters: landing_publish_inline); `arrivals` is a device word that is 0 between publishes.
struct landing_publish_args {
  journal_args journal;
  const landing_piece* pieces = nullptr;
  std::int64_t piece_count = 0;
  const staging_pool::signal* signals = nullptr;
  std::int64_t signal_count = 0;
  unsigned* arrivals = nullptr;
};

/// A small publish travels in the launch's parameters instead (records, index changes, pieces
/// and signals packed into `data` at the offsets given): the kernel then reads nothing from host
/// memory, whose reads queue behind the uploads filling the bus.
inline constexpr std::size_t landing_inline_bytes = 3072;
struct landing_publish_inline {
  landing_publish_args args;  // its pointers into the lease are unused
  std::uint32_t index_at = 0, pieces_at = 0, signals_at = 0;
  alignas(16) std::byte data[landing_inline_bytes];
};
static_assert(sizeof(landing_publish_inline) <= 4096, "kernel parameters are at most 4 KiB");

/// The publish's pointers: a lease's as given, or the launch's own parameters'.
__device__ inline const landing_publish_args& publish_args_of(const landing_publish_args& a) { return a; }
__device__ inline landing_publish_args publish_args_of(const landing_publish_inline& p) {
  landing_publish_args a = p.args;
  a.journal.records = reinterpret_cast<const slot_record*>(p.data);
  a.journal.index = reinterpret_cast<const index_record*>(p.data + p.index_at);
  a.pieces = reinterpret_cast<const landing_piece*>(p.data + p.pieces_at);
  a.signals = reinterpret_cast<const staging_pool::signal*>(p.data + p.signals_at);
  return a;
}

// Up to 512 blocks of 256 threads, about 4 a multiprocessor (on an H100 a learner beside 8 actors
// did as well with 128 blocks of 64 KiB chunks: bench/HISTORY.md, "Small publishes ...").
inline constexpr int landing_threads = 256;
inline constexpr std::int64_t landing_max_blocks = 512;

template <class Args>  // landing_publish_args or _inline (a template: headers define it once)
__global__ void __launch_bounds__(landing_threads)
    landing_publish_kernel(const __grid_constant__ Args parameters) {
  allow_dependents();  // a gather after it may be placed now (dependent_launch.cuh)
  const landing_publish_args& a = publish_args_of(parameters);
  // The pieces, a tile at a time into shared memory (from a lease they are read from mapped host
  // memory: one round trip per tile, not one per piece).
  __shared__ landing_piece tile[landing_threads];
  std::int64_t chunk_index = 0;  // chunks of the pieces before this one, over all blocks
  for (std::int64_t base = 0; base < a.piece_count; base += landing_threads) {
    const std::int64_t in_tile = min64(landing_threads, a.piece_count - base);
    __syncthreads();  // the previous tile is no longer read
    if (threadIdx.x < in_tile) tile[threadIdx.x] = a.pieces[base + threadIdx.x];
    __syncthreads();
    for (std::int64_t p = 0; p < in_tile; ++p) {
      const landing_piece piece = tile[p];
      const std::int64_t chunks = (piece.bytes + landing_chunk - 1) / landing_chunk;
      const std::int64_t blocks = gridDim.x;
      // This block's chunks of the piece: those whose overall index is blockIdx.x modulo blocks.
      for (std::int64_t j = (blockIdx.x - chunk_index % blocks + blocks) % blocks; j < chunks;
           j += blocks) {
        const std::int64_t at = j * landing_chunk;
        block_copy(piece.dst + at, piece.src + at, min64(landing_chunk, piece.bytes - at));
      }
      chunk_index += chunks;
    }
  }
  apply_journal_part(a.journal, blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x,
                     std::int64_t{gridDim.x} * blockDim.x);
  if (a.signal_count == 0) return;  // the same for every block
  if (!last_block_to_arrive(a.arrivals)) return;
  // Every block has read its pieces and records: the staging is free. The signals' stores
  // follow every read of the launch (the fences of last_block_to_arrive, then this one, system
  // wide: the host reads the words). The last signal frees the lease the signals themselves are
  // read from, if they have one: it goes once every thread has read and written the others.
  __threadfence_system();
  for (std::int64_t i = threadIdx.x; i < a.signal_count - 1; i += blockDim.x) {
    const staging_pool::signal s = a.signals[i];
    *static_cast<volatile std::uint64_t*>(s.word) = s.value;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const staging_pool::signal own = a.signals[a.signal_count - 1];
    __threadfence_system();
    *static_cast<volatile std::uint64_t*>(own.word) = own.value;
  }
}

/// Launches the publish `a` on `stream`, its kernel given `parameters` (`a` itself, or the
/// landing_publish_inline that carries it): a block per chunk up to landing_max_blocks, and at
/// least a thread per record up to journal_max_blocks (the rest stride). Checks the launch, never
/// synchronises.
template <class Args>
void launch_landing_publish(const landing_publish_args& a, const Args& parameters,
                            std::int64_t chunks, cuda::stream_ref stream) {
  const std::int64_t records = std::max(a.journal.count, a.journal.index_count);
  const std::int64_t for_records = (records + landing_threads - 1) / landing_threads;
  const std::int64_t blocks = std::min(
      std::max({std::min(chunks, landing_max_blocks), for_records, std::int64_t{1}}),
      tuning::journal_max_blocks);
  landing_publish_kernel<<<static_cast<unsigned>(blocks), landing_threads, 0, stream.get()>>>(
      parameters);
  GEAR_CHECK_LAUNCH("landing_publish_kernel");
}

}  // namespace gear::detail
