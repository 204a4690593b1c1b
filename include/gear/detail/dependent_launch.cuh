#pragma once
// Programmatic dependent launch (compute capability 9.0 and later). A gather launched this way
// is placed on the GPU while the kernel before it on its stream is still finishing: once every
// block of that kernel has allowed it (allow_dependents) or exited. Its blocks then wait
// (wait_for_prerequisites) until that kernel has finished and its writes are visible, before they
// read or write any memory; so stream order holds as before, and what the gather saves is the
// launch gap after a kernel of gear's on its stream: a publish, a selection, or the previous
// sample's gather (bench/HISTORY.md, "The gather as a programmatic dependent launch"). A kernel
// of the user's before it has allowed nothing: the gather then starts as it finishes.
// A kernel launched this way reads through coherent loads only (no __ldg, no const __restrict__):
// the non-coherent path may serve lines cached before the wait.

#include <cuda_runtime.h>

#include <atomic>
#include <gear/detail/cuda.hpp>
#include <utility>

namespace gear::detail {

/// Lets the next kernel on this stream, if launched as a programmatic dependent, be placed now.
/// It still waits for this whole launch before it touches memory.
__device__ inline void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/// Waits until the kernel this one was launched after has finished and its writes are visible;
/// returns at once for a kernel launched without the attribute. Before it, a kernel launched as a
/// dependent touches no memory.
__device__ inline void wait_for_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// True when `Kernel` was compiled for compute capability 9.0 or later on the current device
/// (its PTX version, asked of the driver once per device): only then does it carry the wait.
/// (PTX of an older architecture, compiled at run time for a newer device, has the wait compiled
/// out, and a dependent launch would let it read too early.)
template <auto Kernel>
bool carries_the_wait() {
  constexpr int cached_devices = 64;
  static std::atomic<int> versions[cached_devices] = {};  // 0: not asked yet
  const int device = current_device();
  if (device < cached_devices)
    if (const int known = versions[device].load(std::memory_order_relaxed); known > 0)
      return known >= 90;
  cudaFuncAttributes attributes{};
  GEAR_CUDA_TRY(cudaFuncGetAttributes(&attributes, Kernel));
  if (device < cached_devices) versions[device].store(attributes.ptxVersion, std::memory_order_relaxed);
  return attributes.ptxVersion >= 90;
}

/// Launches Kernel<<<grid, block, 0, stream>>>(args...) as a programmatic dependent of the work
/// before it on `stream` where the kernel carries the wait (carries_the_wait), plainly otherwise.
/// Kernel must call wait_for_prerequisites before it touches memory. Checks the launch
/// (errc::cuda_error).
template <auto Kernel, class... Args>
void launch_dependent(dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  if (!carries_the_wait<Kernel>()) {
    Kernel<<<grid, block, 0, stream>>>(std::forward<Args>(args)...);
    GEAR_CHECK_LAUNCH("a kernel launch");
    return;
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  GEAR_CUDA_TRY(cudaLaunchKernelEx(&config, Kernel, std::forward<Args>(args)...));
}

}  // namespace gear::detail
