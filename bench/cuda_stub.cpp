// libgear_cuda_stub.so: a stand-in for the CUDA runtime with no GPU behind it, to profile the host
// side of gear's enqueue paths on a machine without one (perf, valgrind). Preloaded in front of a
// program that links the runtime as a shared library (gear_enqueue_calls does):
//
//   LD_PRELOAD=build/bench/libgear_cuda_stub.so perf record build/bench/gear_enqueue_calls
//
// It reports one device (compute capability 9.0, 132 multiprocessors) and does, on the host and
// at once, what the host can: allocations are malloc, copies and memsets are memcpy and memset,
// events and streams are handles that are always complete. With GEAR_STUB_SLOW=1 in the
// environment the device is slow instead: a recorded event stays incomplete until a
// synchronisation (of its own, its stream's or the device's), so that staging stays in flight as
// long as it can; with GEAR_STUB_TRACE_ALLOCATIONS=1 every allocation prints its size and the
// calls that made it. Kernels are not run: launches return
// success and do nothing, so device results are garbage. Use it for where the host time goes
// (which calls, which loops), never for a result or a figure of the GPU's: the host's cost of
// each driver call is not modelled (they take nanoseconds here).

#include <cuda_runtime_api.h>

#include <execinfo.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

namespace {

std::mutex mutex;
std::map<const char*, std::pair<std::size_t, cudaMemoryType>> allocations;  // base -> size, kind
dim3 config_grid, config_block;
std::size_t config_shared = 0;
cudaStream_t config_stream = nullptr;

bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] == '1';
}
const bool slow = env_on("GEAR_STUB_SLOW");
// GEAR_STUB_QUERIES=k: a recorded event completes at a random one of the next k queries of it.
const int queries_to_complete = std::getenv("GEAR_STUB_QUERIES") != nullptr
                                    ? std::atoi(std::getenv("GEAR_STUB_QUERIES"))
                                    : 0;
std::map<cudaEvent_t, int> queries_left;
unsigned random_state = 12345;
const bool trace_allocations = env_on("GEAR_STUB_TRACE_ALLOCATIONS");
std::set<cudaEvent_t> incomplete;  // recorded and not yet synchronised (GEAR_STUB_SLOW)

void* allocate(std::size_t bytes, cudaMemoryType kind) {
  if (trace_allocations) {
    std::fprintf(stderr, "gear_cuda_stub: %s of %zu bytes\n",
                 kind == cudaMemoryTypeDevice ? "cudaMalloc" : "cudaHostAlloc", bytes);
    void* frames[24];
    backtrace_symbols_fd(frames, backtrace(frames, 24), 2);
  }
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (p == nullptr) return nullptr;
  const std::lock_guard held(mutex);
  allocations[static_cast<const char*>(p)] = {bytes, kind};
  return p;
}
void release(void* p) {
  if (p == nullptr) return;
  {
    const std::lock_guard held(mutex);
    allocations.erase(static_cast<const char*>(p));
  }
  std::free(p);
}
cudaMemoryType kind_of(const void* p) {
  const std::lock_guard held(mutex);
  const auto* c = static_cast<const char*>(p);
  auto it = allocations.upper_bound(c);
  if (it == allocations.begin()) return cudaMemoryTypeUnregistered;
  --it;
  return c < it->first + it->second.first + 1 ? it->second.second : cudaMemoryTypeUnregistered;
}
// Handles for events and streams: distinct, never dereferenced by the program.
template <class Handle>
Handle make_handle() {
  return reinterpret_cast<Handle>(std::malloc(16));
}

}  // namespace

extern "C" {

// ---- registration and launches (what nvcc's host code calls) ----------------------------------
void** __cudaRegisterFatBinary(void*) {
  static void* handle = nullptr;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {}
void __cudaRegisterFunction(void**, const char*, char*, const char*, int, uint3*, uint3*, dim3*,
                            dim3*, int*) {}
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, CUstream_st* stream) {
  config_grid = grid;
  config_block = block;
  config_shared = shared;
  config_stream = stream;
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  *grid = config_grid;
  *block = config_block;
  *shared = config_shared;
  *static_cast<cudaStream_t*>(stream) = config_stream;
  return cudaSuccess;
}
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* fun) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(fun));
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaLaunchCooperativeKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void*, int,
                                                                   size_t, unsigned) {
  *blocks = 8;
  return cudaSuccess;
}

// ---- devices and errors -------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void*) {
  *attributes = cudaFuncAttributes{};
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 << 10; break;
    default: *value = 1;
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  const std::lock_guard held(mutex);
  incomplete.clear();
  queries_left.clear();
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cudaStubError"; }
const char* cudaGetErrorString(cudaError_t) { return "an error of the CUDA stub"; }

// ---- memory -------------------------------------------------------------------------------------
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = allocate(bytes, cudaMemoryTypeDevice);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = allocate(bytes, cudaMemoryTypeHost);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  release(p);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  release(p);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned) {
  *device = host;
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof(*a));
  a->type = kind_of(p);
  a->device = 0;
  a->devicePointer = a->type == cudaMemoryTypeUnregistered ? nullptr : const_cast<void*>(p);
  a->hostPointer = a->type == cudaMemoryTypeDevice ? nullptr : const_cast<void*>(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t) {
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                 size_t count, cudaMemcpyAttributes*, size_t*, size_t,
                                 cudaStream_t) {
  for (size_t i = 0; i < count; ++i) std::memcpy(dsts[i], srcs[i], sizes[i]);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}

// ---- streams and events -------------------------------------------------------------------------
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = make_handle<cudaStream_t>();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned, int) {
  *s = make_handle<cudaStream_t>();
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::free(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {  // every stream: streams are not told apart
  const std::lock_guard held(mutex);
  incomplete.clear();
  queries_left.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = make_handle<cudaEvent_t>();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
// No GPU time passes here: every span between two events is 0.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  {
    const std::lock_guard held(mutex);
    incomplete.erase(e);
  }
  std::free(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  const std::lock_guard held(mutex);
  if (slow) incomplete.insert(e);
  if (queries_to_complete > 0) {
    random_state = random_state * 1103515245u + 12345u;
    queries_left[e] = static_cast<int>((random_state >> 16) % queries_to_complete);
  }
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  const std::lock_guard held(mutex);
  if (auto it = queries_left.find(e); it != queries_left.end() && it->second > 0) {
    --it->second;
    return cudaErrorNotReady;
  }
  return incomplete.count(e) != 0 ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  const std::lock_guard held(mutex);
  incomplete.erase(e);
  queries_left.erase(e);
  return cudaSuccess;
}

}  // extern "C"
