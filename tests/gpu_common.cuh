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

}  // namespace gear_test
