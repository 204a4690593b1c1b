#pragma once
// What every call of a buffer checks first, shared by the buffer's parts: the stream it may not
// be captured on, the shape a buffer may have, the numbers that tell buffers apart.

#include <atomic>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/error.hpp>
#include <string>

namespace gear::detail {

template <class T> inline constexpr bool dependent_false = false;

/// A stream that is never used for a CUDA call: host-storage buffers take it where the shared
/// code path expects a stream.
inline cuda::stream_ref no_stream() noexcept { return cuda::stream_ref{cudaStream_t{}}; }

/// True while `stream` is capturing a CUDA graph (or its capture was invalidated). Throws
/// errc::cuda_error.
[[nodiscard]] inline bool stream_capturing(cuda::stream_ref stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  GEAR_CUDA_TRY(cudaStreamIsCapturing(stream.get(), &status));
  return status != cudaStreamCaptureStatusNone;
}
/// Throws errc::invalid_argument while `stream` captures a CUDA graph: the call's host
/// bookkeeping would not be replayed with its GPU work.
inline void refuse_capture(cuda::stream_ref stream) {
  GEAR_REQUIRE(!stream_capturing(stream), errc::invalid_argument,
               "this call cannot be captured into a CUDA graph (its host bookkeeping would not be "
               "replayed): of a buffer's calls only sample_async with a gear::device_rng and "
               "update_priorities_async from device memory can (replay_buffer only); make it "
               "outside the capture");
}

/// Throws errc::invalid_argument unless a buffer of `capacity` slots of `max_length` steps may
/// be made.
inline void check_buffer_shape(std::int64_t capacity, std::int64_t max_length) {
  GEAR_REQUIRE(capacity >= 1 && capacity <= (std::int64_t{1} << 40), errc::invalid_argument,
               "capacity must be in [1, 2^40], got " + std::to_string(capacity));
  GEAR_REQUIRE(max_length >= 1, errc::invalid_argument,
               "max_length must be at least 1, got " + std::to_string(max_length));
}

/// A process-wide number per buffer, stamped into its reservations.
inline std::uint64_t next_buffer_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace gear::detail
