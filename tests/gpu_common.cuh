#pragma once
// Shared by the gpu suites.

#include <gear/gear.cuh>

namespace gear_test {

/// A non-blocking stream owned for the length of a test.
struct stream_holder {
  cudaStream_t s{};
  stream_holder() { GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~stream_holder() { (void)cudaStreamDestroy(s); }
  stream_holder(const stream_holder&) = delete;
  stream_holder& operator=(const stream_holder&) = delete;
  operator cuda::stream_ref() const { return cuda::stream_ref{s}; }
};

/// Holds a stream for `ms` milliseconds (a template: headers define it once per program).
template <int = 0>
__global__ void spin(long long ms) {
  const long long start = clock64();
  // clock64 counts SM cycles; 2 GHz is above the H200's boost clock, so this spins at least ms.
  while (clock64() - start < ms * 2'000'000) {
  }
}
inline void hold(cuda::stream_ref s, long long ms = 50) {
  spin<><<<1, 1, 0, s.get()>>>(ms);
  GEAR_CHECK_LAUNCH("spin");
}

/// Waits until *open is set by the host, or about 10 s at most (a bounded loop).
template <int = 0>
__global__ void wait_for_gate(const volatile int* open) {
  const long long start = clock64();
  while (*open == 0 && clock64() - start < 20'000'000'000LL) {
  }
}

/// Holds a stream until the host opens the gate: work enqueued behind it starts only after
/// open(), however long the host takes to enqueue it (a loaded machine, a sanitizer). Where a
/// test asserts what a call sees of work still queued, a timed hold would be a race.
class gate {
 public:
  gate() {
    GEAR_CUDA_TRY(cudaHostAlloc(&flag_, sizeof *flag_, cudaHostAllocMapped));
    *flag_ = 0;
    const cudaError_t mapped =
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag_), flag_, 0);
    if (mapped != cudaSuccess) (void)cudaFreeHost(flag_);
    GEAR_CUDA_TRY(mapped);
  }
  gate(const gate&) = delete;
  gate& operator=(const gate&) = delete;
  ~gate() {
    open();
    if (held_ != nullptr) (void)cudaStreamSynchronize(held_);
    (void)cudaFreeHost(flag_);
  }
  void hold(cudaStream_t s) {
    held_ = s;
    wait_for_gate<><<<1, 1, 0, s>>>(device_flag_);
    GEAR_CHECK_LAUNCH("wait_for_gate");
  }
  void open() noexcept { __atomic_store_n(flag_, 1, __ATOMIC_RELEASE); }

 private:
  int* flag_ = nullptr;
  int* device_flag_ = nullptr;
  cudaStream_t held_ = nullptr;
};

}  // namespace gear_test
