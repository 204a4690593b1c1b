#pragma once
// A ring of pinned staging areas for host data that stream-ordered copies (or kernels, through
// the mapping) take to the GPU: the caller fills the next area at once, and the copies read it
// when the stream gets to them. An
// area is refilled only after its last copies have run, so a caller waits on the host only when
// its stream is `Areas` fills behind (with one area it waited for the previous fill's copies on
// every call, behind whatever the stream was doing then).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>

namespace gear::detail {

template <std::size_t Areas>
class staging_ring {
  static_assert(Areas >= 1);

 public:
  /// The next area, of at least `bytes`, once its last copies have run (waiting on the host for
  /// them if they have not). An area too small is replaced by one twice as large, or `bytes`.
  /// Until copied() it gives the same area again. Throws errc::out_of_memory, errc::cuda_error,
  /// with the ring as it was.
  [[nodiscard]] std::byte* acquire(std::size_t bytes) {
    area& a = areas_[next_];
    if (a.copied.get() == nullptr)
      a.copied = event::make();
    else if (!event_reached(a.copied.get()))  // a query costs less than a wait on a done event
      GEAR_CUDA_TRY(cudaEventSynchronize(a.copied.get()));
    if (a.host.size() < bytes)
      a.host = allocation(memory_kind::pinned_host, std::max(bytes, 2 * a.host.size()));
    return a.host.data();
  }

  /// Gives every area at least `bytes` now (replay_buffer::reserve_staging), waiting on the host
  /// for the last copies from an area it replaces. All or nothing: throws errc::out_of_memory or
  /// errc::cuda_error with the ring as it was.
  void reserve(std::size_t bytes) {
    std::array<allocation, Areas> larger;
    for (std::size_t i = 0; i < Areas; ++i)
      if (areas_[i].host.size() < bytes) larger[i] = allocation(memory_kind::pinned_host, bytes);
    for (std::size_t i = 0; i < Areas; ++i)
      if (larger[i].size() != 0 && areas_[i].copied.get() != nullptr)
        GEAR_CUDA_TRY(cudaEventSynchronize(areas_[i].copied.get()));
    for (std::size_t i = 0; i < Areas; ++i)
      if (larger[i].size() != 0) areas_[i].host = std::move(larger[i]);
  }

  /// The GPU's address of the area acquire() gave (mapped pinned memory), for kernels that read
  /// it in place of a copy.
  [[nodiscard]] std::byte* device_address() const noexcept {
    return areas_[next_].host.device_data();
  }

  /// Ends a fill: the copies from the area acquire() gave are enqueued on `stream`. The next
  /// acquire() takes the next area. Throws errc::cuda_error, once the stream has run those copies
  /// (so that the area is never refilled under them).
  void copied(cuda::stream_ref stream) {
    try {
      GEAR_CUDA_TRY(cudaEventRecord(areas_[next_].copied.get(), stream.get()));
    } catch (...) {
      (void)cudaStreamSynchronize(stream.get());
      throw;
    }
    next_ = (next_ + 1) % Areas;
  }

 private:
  struct area {
    allocation host;  // pinned
    event copied;     // recorded after the area's last copies
  };
  std::array<area, Areas> areas_;
  std::size_t next_ = 0;
};

}  // namespace gear::detail
