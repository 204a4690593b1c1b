// libgear_cuda_calls.so: counts and times the CUDA runtime calls of a program that links the
// runtime as a shared library, when preloaded (LD_PRELOAD). Each wrapped entry point looks the
// runtime's own up once (dlsym RTLD_NEXT) and, while counting is on, adds the call and its wall
// time to a table. The program turns counting on and off and prints the table through three
// functions it finds with dlsym (gear_enqueue_calls does): where the host time of one call goes.
// Not thread-safe: one thread counts.

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <ctime>

namespace {

constexpr int max_entries = 64;
struct entry {
  const char* name;
  unsigned long long calls;
  unsigned long long ns;
};
entry table[max_entries];
int entries = 0;
bool counting = false;

unsigned long long now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<unsigned long long>(t.tv_sec) * 1000000000ull +
         static_cast<unsigned long long>(t.tv_nsec);
}
entry& entry_of(const char* name) {
  for (int i = 0; i < entries; ++i)
    if (table[i].name == name) return table[i];
  if (entries == max_entries) return table[max_entries - 1];  // never: fewer are wrapped
  table[entries] = {name, 0, 0};
  return table[entries++];
}
template <class F>
F next_definition(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" {
/// Clears the table and starts counting.
void gear_calls_reset() {
  for (int i = 0; i < entries; ++i) table[i].calls = table[i].ns = 0;
  counting = true;
}
/// Stops (false) or resumes (true) counting.
void gear_calls_count(bool on) { counting = on; }
/// Prints each entry point called, per `per` calls of the program's own (calls, microseconds),
/// then their total, and stops counting.
void gear_calls_print(const char* label, double per) {
  counting = false;
  double total = 0;
  for (int i = 0; i < entries; ++i) {
    if (table[i].calls == 0) continue;
    total += static_cast<double>(table[i].ns);
    std::printf("  %-40s %6.2f calls %7.2f us\n", table[i].name,
                static_cast<double>(table[i].calls) / per,
                static_cast<double>(table[i].ns) / per / 1e3);
  }
  std::printf("  %s: CUDA runtime calls %.2f us per call\n", label, total / per / 1e3);
}
}

// One wrapper per entry point: the same signature, counted while counting is on.
#define GEAR_COUNTED(name, params, args)                                     \
  extern "C" cudaError_t name params {                                       \
    static const auto real_ = next_definition<cudaError_t(*) params>(#name); \
    if (!counting) return real_ args;                                        \
    const unsigned long long start_ = now_ns();                              \
    const cudaError_t status_ = real_ args;                                  \
    entry& entry_ = entry_of(#name);                                         \
    ++entry_.calls;                                                          \
    entry_.ns += now_ns() - start_;                                          \
    return status_;                                                          \
  }

// Kernel launches (<<<>>> goes through __cudaLaunchKernel since CUDA 13).
GEAR_COUNTED(__cudaLaunchKernel,
             (cudaKernel_t k, dim3 g, dim3 b, void** a, size_t shared, cudaStream_t s),
             (k, g, b, a, shared, s))
GEAR_COUNTED(cudaLaunchKernel,
             (const void* k, dim3 g, dim3 b, void** a, size_t shared, cudaStream_t s),
             (k, g, b, a, shared, s))
GEAR_COUNTED(cudaLaunchCooperativeKernel,
             (const void* k, dim3 g, dim3 b, void** a, size_t shared, cudaStream_t s),
             (k, g, b, a, shared, s))
// Events and streams.
GEAR_COUNTED(cudaEventRecord, (cudaEvent_t e, cudaStream_t s), (e, s))
GEAR_COUNTED(cudaEventQuery, (cudaEvent_t e), (e))
GEAR_COUNTED(cudaEventSynchronize, (cudaEvent_t e), (e))
GEAR_COUNTED(cudaEventCreateWithFlags, (cudaEvent_t * e, unsigned flags), (e, flags))
GEAR_COUNTED(cudaStreamWaitEvent, (cudaStream_t s, cudaEvent_t e, unsigned flags), (s, e, flags))
GEAR_COUNTED(cudaStreamIsCapturing, (cudaStream_t s, cudaStreamCaptureStatus* status), (s, status))
GEAR_COUNTED(cudaStreamSynchronize, (cudaStream_t s), (s))
GEAR_COUNTED(cudaStreamQuery, (cudaStream_t s), (s))
GEAR_COUNTED(cudaDeviceSynchronize, (), ())
// Errors and devices.
GEAR_COUNTED(cudaPeekAtLastError, (), ())
GEAR_COUNTED(cudaGetLastError, (), ())
GEAR_COUNTED(cudaGetDevice, (int* d), (d))
GEAR_COUNTED(cudaSetDevice, (int d), (d))
GEAR_COUNTED(cudaDeviceGetAttribute, (int* v, cudaDeviceAttr a, int d), (v, a, d))
GEAR_COUNTED(cudaPointerGetAttributes, (cudaPointerAttributes * a, const void* p), (a, p))
// Copies and memory.
GEAR_COUNTED(cudaMemcpyAsync,
             (void* dst, const void* src, size_t n, cudaMemcpyKind k, cudaStream_t s),
             (dst, src, n, k, s))
GEAR_COUNTED(cudaMemsetAsync, (void* p, int v, size_t n, cudaStream_t s), (p, v, n, s))
GEAR_COUNTED(cudaHostAlloc, (void** p, size_t n, unsigned flags), (p, n, flags))
GEAR_COUNTED(cudaHostGetDevicePointer, (void** p, void* h, unsigned flags), (p, h, flags))
GEAR_COUNTED(cudaMalloc, (void** p, size_t n), (p, n))
GEAR_COUNTED(cudaFree, (void* p), (p))
GEAR_COUNTED(cudaFreeHost, (void* p), (p))
