#pragma once
// gear::device_rng: the random stream of samples that CUDA graphs replay.
//
// gear::rng keeps its call number on the host and passes each draw to the kernels by value, so
// a sample captured into a CUDA graph would draw the same rows at every replay. A device_rng keeps
// the call number in device memory instead: the sample's kernels read it, and the sample's last
// kernel advances it. Every replay of a captured
//
//   buffer.sample_async(batch, window, device_rng, stream);
//
// then draws as the next eager call would, and the k-th sample of device_rng(seed) draws exactly
// what the k-th sample of gear::rng(seed) draws from the same contents (the same Philox numbers,
// the same kernels).
//
// What such a sample reads at run time, not at capture: the buffer's committed trajectories and
// their count (from the device mirror), the priorities (select::prioritized), the call number.
// What is fixed at capture: the batch, the window, the policy's settings. So a replay samples the
// buffer as it is when the replay runs in its stream's order, like an eager call enqueued there.
// See replay_buffer::sample_async for what a buffer sampled so must keep to (one stream; a policy
// that selects from device state).
//
// A device_rng lives on the device current at construction and is used on one stream, the stream
// of its first sample; a sample on another stream throws errc::invalid_argument. Not thread-safe,
// like gear::rng: one thread (or one captured graph) draws from it at a time.

#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/memory.hpp>
#include <gear/error.hpp>
#include <gear/rng.hpp>
#include <string>

namespace gear {

class device_rng {
 public:
  /// A stream of draws on the current device whose first sample takes call number `first_call`
  /// (0: the draws of gear::rng(seed), in order). Throws errc::no_device, errc::out_of_memory,
  /// errc::cuda_error.
  explicit device_rng(std::uint64_t seed, std::uint64_t first_call = 0)
      : seed_(seed), device_(current_device()), words_(memory_kind::device, sizeof(words)) {
    // On a private stream, waited for: a plain cudaMemcpy from pageable memory may return before
    // its DMA ends, and the legacy stream does not order the caller's non-blocking streams.
    const words initial{first_call, 0, 0};
    cudaStream_t init{};
    GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&init, cudaStreamNonBlocking));
    const cudaError_t copied =
        cudaMemcpyAsync(words_.data(), &initial, sizeof initial, cudaMemcpyHostToDevice, init);
    const cudaError_t synced = cudaStreamSynchronize(init);
    GEAR_CUDA_TRY(cudaStreamDestroy(init));
    GEAR_CUDA_TRY(copied);
    GEAR_CUDA_TRY(synced);
  }

  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }
  /// The GPU whose memory holds the call number.
  [[nodiscard]] int device() const noexcept { return device_; }

  /// The call number the next sample takes, as of `stream`'s order (synchronises `stream`). With
  /// gear::rng(seed) this is what calls() counts. Throws errc::cuda_error.
  [[nodiscard]] std::uint64_t calls(cuda::stream_ref stream) const {
    std::uint64_t call = 0;
    GEAR_CUDA_TRY(
        cudaMemcpyAsync(&call, words_.data(), sizeof call, cudaMemcpyDeviceToHost, stream.get()));
    GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    return call;
  }

  /// The device words the sample kernels read and advance (for gear's kernels).
  [[nodiscard]] detail::draw_counter* counter() const noexcept {
    return words_.as<detail::draw_counter>();
  }

  /// Throws errc::invalid_argument unless a sample of a buffer on `device` may draw from this
  /// stream on `stream`. Changes nothing.
  void check_use(int device, cudaStream_t stream) const {
    GEAR_REQUIRE(device == device_, errc::invalid_argument,
                 "this gear::device_rng lives on GPU " + std::to_string(device_) +
                     ", the buffer on GPU " + std::to_string(device) +
                     "; make the device_rng with that GPU current");
    GEAR_REQUIRE(!bound_ || stream == stream_, errc::invalid_argument,
                 "this gear::device_rng draws on one stream, and an earlier sample used another; "
                 "make one device_rng per stream");
  }
  /// Binds it to `stream` (a sample that check_use accepted is being enqueued there).
  void bind(cudaStream_t stream) noexcept {
    stream_ = stream;
    bound_ = true;
  }

 private:
  using words = detail::draw_counter;

  static int current_device() {
    GEAR_REQUIRE(detail::gpu_available(), errc::no_device,
                 "gear::device_rng needs a CUDA GPU and none is usable");
    int d = 0;
    GEAR_CUDA_TRY(cudaGetDevice(&d));
    return d;
  }

  std::uint64_t seed_;
  int device_;
  detail::allocation words_;
  cudaStream_t stream_{};
  bool bound_ = false;
};

}  // namespace gear
