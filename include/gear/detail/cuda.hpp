#pragma once
// Checked CUDA runtime calls. Every runtime call and every kernel launch in gear goes through
// GEAR_CUDA_TRY / GEAR_CHECK_LAUNCH, which turn a failure into gear::error(errc::cuda_error).
// GEAR_CHECK_LAUNCH reads the thread's last launch error, so it would also report an earlier
// failed launch of the caller's that nobody checked, as this launch's: the buffer's calls check
// for such an error first, before they change anything (buffer_core::check_usable).

#include <cuda_runtime_api.h>

#include <atomic>
#include <gear/error.hpp>
#include <string>

/// Evaluates a cudaError_t expression and throws gear::error if it is not cudaSuccess.
#define GEAR_CUDA_TRY(expr)                                                \
  do {                                                                     \
    cudaError_t gear_status_ = GEAR_INJECTED_FAULT();                      \
    if (gear_status_ == cudaSuccess) gear_status_ = (expr);                \
    if (gear_status_ != cudaSuccess) {                                     \
      (void)cudaGetLastError();                                            \
      ::gear::detail::throw_cuda(gear_status_, #expr, __FILE__, __LINE__); \
    }                                                                      \
  } while (0)

// Fault injection for tests: a program built with GEAR_FAULT_INJECTION defined (in every
// translation unit) can make the n-th checked CUDA call or allocation from now on this thread fail
// (gear::detail::fault_injection), to test what each failure leaves behind. Otherwise free.
#if defined(GEAR_FAULT_INJECTION)
#define GEAR_INJECTED_FAULT() ::gear::detail::fault_injection::hit()
namespace gear::detail::fault_injection {
/// > 0: the countdown-th checked call from now fails (with cudaErrorMemoryAllocation); 0: none.
inline thread_local long countdown = 0;
/// Checked calls made so far on this thread.
inline thread_local long calls = 0;
inline cudaError_t hit() noexcept {
  ++calls;
  if (countdown > 0 && --countdown == 0) return cudaErrorMemoryAllocation;
  return cudaSuccess;
}
}  // namespace gear::detail::fault_injection
#else
#define GEAR_INJECTED_FAULT() cudaSuccess
#endif

/// Checks the kernel launch just made (configuration and launch errors).
#define GEAR_CHECK_LAUNCH(name) GEAR_CUDA_TRY((static_cast<void>(name), cudaGetLastError()))

namespace gear::detail {

[[noreturn]] inline void throw_cuda(cudaError_t status, const char* what, const char* file,
                                    int line) {
  const errc code = status == cudaErrorMemoryAllocation ? errc::out_of_memory
                    : (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver)
                        ? errc::no_device
                        : errc::cuda_error;
  throw error(code, std::string(what) + " failed: " + cudaGetErrorName(status) + " (" +
                        cudaGetErrorString(status) + ") at " + file + ":" + std::to_string(line));
}

/// True when a CUDA device is present and usable. Never throws.
inline bool gpu_available() noexcept {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

/// The device a gear call made current for its duration (device_scope, core.hpp) on this
/// thread, or -1 outside such a call. Inside one, nothing changes the current device, so the
/// per-device caches below need not ask the runtime for it on every launch.
inline thread_local int scoped_device = -1;

/// The current device: the call's own (scoped_device) inside a gear call, else cudaGetDevice.
/// Throws errc::cuda_error.
inline int current_device() {
  if (scoped_device >= 0) return scoped_device;
  int device = 0;
  GEAR_CUDA_TRY(cudaGetDevice(&device));
  return device;
}

/// Streaming multiprocessors of the current device (current_device()): the count is asked of the
/// driver once per device.
inline int multiprocessors() {
  constexpr int cached_devices = 64;
  static std::atomic<int> counts[cached_devices] = {};  // 0: not asked yet
  const int device = current_device();
  if (device < cached_devices)
    if (const int known = counts[device].load(std::memory_order_relaxed); known > 0) return known;
  int count = 0;
  GEAR_CUDA_TRY(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  if (device < cached_devices) counts[device].store(count, std::memory_order_relaxed);
  return count;
}

/// True once the work before the event's last record has finished (or it was never recorded).
/// Throws errc::cuda_error.
inline bool event_reached(cudaEvent_t e) {
  const cudaError_t status = cudaEventQuery(e);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  GEAR_CUDA_TRY(status);
  return true;
}

/// An owned CUDA event (timing disabled), created on demand.
class event {
 public:
  event() = default;
  static event make() {
    event e;
    GEAR_CUDA_TRY(cudaEventCreateWithFlags(&e.handle_, cudaEventDisableTiming));
    return e;
  }
  event(event&& o) noexcept : handle_(o.handle_) { o.handle_ = nullptr; }
  event& operator=(event&& o) noexcept {
    if (this != &o) {
      reset();
      handle_ = o.handle_;
      o.handle_ = nullptr;
    }
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { reset(); }

  [[nodiscard]] cudaEvent_t get() const noexcept { return handle_; }

 private:
  void reset() noexcept {
    if (handle_ != nullptr) (void)cudaEventDestroy(handle_);
    handle_ = nullptr;
  }
  cudaEvent_t handle_ = nullptr;
};

}  // namespace gear::detail
