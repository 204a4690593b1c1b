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

}  // namespace gear_test
