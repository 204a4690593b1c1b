#pragma once
// Owning allocations in the three kinds of memory gear places data in.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <gear/detail/cuda.hpp>
#include <gear/error.hpp>
#include <gear/memory_resource.hpp>
#include <new>
#include <string>
#include <utility>

namespace gear {

/// Where bytes live.
enum class memory_kind : std::uint8_t {
  host,         ///< pageable host memory; only the CPU reads it
  pinned_host,  ///< page-locked, mapped host memory; the CPU and (zero-copy) the GPU read it
  device,       ///< GPU memory
};

/// True when the CPU can dereference memory of this kind.
constexpr bool host_accessible(memory_kind k) noexcept { return k != memory_kind::device; }
/// True when GPU kernels can dereference memory of this kind.
constexpr bool device_accessible(memory_kind k) noexcept { return k != memory_kind::host; }

namespace detail {

/// Where a caller's pointer points, as kernels and the CPU may use it.
struct pointer_memory {
  bool device = false;        ///< device or managed memory
  bool managed = false;       ///< managed memory (any GPU may read it)
  bool gpu_readable = false;  ///< kernels may dereference the pointer as it is
  int ordinal = -1;           ///< the GPU of device memory
};

/// Classifies `p` with cudaPointerGetAttributes. Registered host memory counts as GPU-readable
/// only where its GPU address is its CPU address. Throws errc::cuda_error.
inline pointer_memory memory_of(const void* p) {
  cudaPointerAttributes attributes{};
  GEAR_CUDA_TRY(cudaPointerGetAttributes(&attributes, p));
  pointer_memory m;
  m.managed = attributes.type == cudaMemoryTypeManaged;
  m.device = attributes.type == cudaMemoryTypeDevice || m.managed;
  m.ordinal = attributes.device;
  m.gpu_readable =
      (m.device || attributes.type == cudaMemoryTypeHost) && attributes.devicePointer == p;
  return m;
}

inline constexpr std::size_t allocation_alignment = 256;

/// Pinned and device allocations made so far in this process (cudaHostAlloc, cudaMalloc through
/// detail::allocation): what tests count to show that a run of calls allocates nothing.
inline std::atomic<std::uint64_t> gpu_allocations{0};

/// A move-only allocation of `bytes` bytes of one memory kind, 256-byte aligned. Pinned memory
/// may be write-combined (`write_combined`): the CPU's writes bypass its caches and the GPU's
/// reads are not snooped, which may speed up copies to the GPU; the CPU reads it slowly.
class allocation {
 public:
  allocation() = default;
  allocation(memory_kind kind, std::size_t bytes, bool write_combined = false)
      : bytes_(bytes), kind_(kind) {
    if (bytes == 0) return;
    switch (kind) {
      case memory_kind::host:
        if (GEAR_INJECTED_FAULT() == cudaSuccess)
          ptr_ = ::operator new (bytes, std::align_val_t{allocation_alignment}, std::nothrow);
        if (ptr_ == nullptr)
          throw error(errc::out_of_memory,
                      "host allocation of " + std::to_string(bytes) + " bytes");
        break;
      case memory_kind::pinned_host:
        GEAR_CUDA_TRY(cudaHostAlloc(
            &ptr_, bytes,
            cudaHostAllocMapped | cudaHostAllocPortable |
                (write_combined ? cudaHostAllocWriteCombined : cudaHostAllocDefault)));
        try {
          GEAR_CUDA_TRY(cudaHostGetDevicePointer(&device_ptr_, ptr_, 0));
        } catch (...) {  // a constructor that throws runs no destructor
          (void)cudaFreeHost(ptr_);
          ptr_ = nullptr;
          throw;
        }
        gpu_allocations.fetch_add(1, std::memory_order_relaxed);
        return;
      case memory_kind::device:
        GEAR_CUDA_TRY(cudaMalloc(&ptr_, bytes));
        gpu_allocations.fetch_add(1, std::memory_order_relaxed);
        break;
    }
    device_ptr_ = ptr_;
  }
  /// `bytes` bytes of `kind` from `from`, checked as memory_resource.hpp says, or gear's own
  /// allocation where `from` is empty. Throws errc::out_of_memory, errc::wrong_memory,
  /// errc::misaligned_pointer, errc::cuda_error; what it takes is given back when it throws.
  allocation(memory_kind kind, std::size_t bytes, memory_resource_ref from) {
    if (!from) {
      allocation(kind, bytes).swap(*this);
      return;
    }
    kind_ = kind;
    if (bytes == 0) return;
    const std::string what = std::string(kind_name(kind)) + " memory resource";
    const auto failed = [&](const std::string& why) {
      return error(errc::out_of_memory, "the " + what + " could not allocate " +
                                            std::to_string(bytes) + " bytes: " + why);
    };
    void* p = nullptr;
    try {
      p = from.allocate(bytes, allocation_alignment);
    } catch (const std::exception& e) {
      throw failed(e.what());
    } catch (...) {
      throw failed("it threw an exception of a type not derived from std::exception");
    }
    if (p == nullptr)
      throw error(errc::out_of_memory, "the " + what + " returned null for " +
                                           std::to_string(bytes) + " bytes");
    allocation taken;  // gives p back if a check below throws
    taken.ptr_ = taken.device_ptr_ = p;
    taken.bytes_ = bytes;
    taken.kind_ = kind;
    taken.from_ = from;
    GEAR_REQUIRE(reinterpret_cast<std::uintptr_t>(p) % allocation_alignment == 0,
                 errc::misaligned_pointer,
                 "the " + what + " returned memory aligned to fewer than " +
                     std::to_string(allocation_alignment) + " bytes");
    if (kind != memory_kind::host) {
      taken.device_ = current_device();
      taken.device_ptr_ = gpu_address_of(p, kind, taken.device_, what);
      gpu_allocations.fetch_add(1, std::memory_order_relaxed);
    }
    taken.swap(*this);
  }
  allocation(allocation&& o) noexcept { swap(o); }
  allocation& operator=(allocation&& o) noexcept {
    allocation(std::move(o)).swap(*this);
    return *this;
  }
  allocation(const allocation&) = delete;
  allocation& operator=(const allocation&) = delete;
  ~allocation() { release(); }

  /// The address the CPU uses (for device memory: the device address, not dereferenceable).
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(ptr_); }
  /// The address kernels use (differs from data() only for mapped memory without unified
  /// addressing).
  [[nodiscard]] std::byte* device_data() const noexcept {
    return static_cast<std::byte*>(device_ptr_);
  }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_; }
  [[nodiscard]] memory_kind kind() const noexcept { return kind_; }

  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return reinterpret_cast<T*>(ptr_);
  }
  template <class T>
  [[nodiscard]] T* device_as() const noexcept {
    return reinterpret_cast<T*>(device_ptr_);
  }

  void swap(allocation& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(device_ptr_, o.device_ptr_);
    std::swap(bytes_, o.bytes_);
    std::swap(kind_, o.kind_);
    std::swap(from_, o.from_);
    std::swap(device_, o.device_);
  }

 private:
  void release() noexcept {
    if (ptr_ == nullptr) return;
    // Errors while freeing cannot be reported from a destructor; the memory is gone either way.
    if (from_) {
      give_back();
      return;
    }
    switch (kind_) {
      case memory_kind::host:
        ::operator delete (ptr_, std::align_val_t{allocation_alignment});
        break;
      case memory_kind::pinned_host:
        (void)cudaFreeHost(ptr_);
        break;
      case memory_kind::device:
        (void)cudaFree(ptr_);
        break;
    }
    ptr_ = device_ptr_ = nullptr;
  }

  static const char* kind_name(memory_kind kind) noexcept {
    if (kind == memory_kind::host) return "host";
    return kind == memory_kind::pinned_host ? "pinned" : "device";
  }

  /// Where kernels on `device` read `p`, memory of `kind` from a resource, or errc::wrong_memory
  /// (errc::cuda_error where the runtime cannot classify it).
  static void* gpu_address_of(void* p, memory_kind kind, int device, const std::string& what) {
    if (kind == memory_kind::pinned_host) {
      void* mapped = nullptr;
      const cudaError_t status = cudaHostGetDevicePointer(&mapped, p, 0);
      if (status == cudaSuccess && mapped != nullptr) return mapped;
      (void)cudaGetLastError();
      throw error(errc::wrong_memory,
                  "the " + what + " returned memory the GPU cannot map "
                  "(cudaHostGetDevicePointer: " + std::string(cudaGetErrorName(status)) +
                      "): allocate it with cudaHostAlloc and cudaHostAllocMapped, or register "
                      "it with cudaHostRegisterMapped");
    }
    const pointer_memory m = memory_of(p);
    if (m.managed || (m.device && m.ordinal == device)) return p;
    const std::string found =
        m.device ? "device memory of GPU " + std::to_string(m.ordinal) : "host memory";
    throw error(errc::wrong_memory,
                "the " + what + " returned memory that is not device or managed memory of GPU " +
                    std::to_string(device) + " (" + found + ")");
  }

  /// Hands resource memory back once its GPU has finished the work queued on it (a pool may
  /// hand it out again at once; cudaFree would have waited the same way), with that GPU current.
  void give_back() noexcept {
    int previous = -1;
    const bool switched = device_ >= 0 && cudaGetDevice(&previous) == cudaSuccess &&
                          cudaSetDevice(device_) == cudaSuccess;
    // A failure here has no one to report it to: cleared below, not left pending for the caller.
    bool failed = device_ >= 0 && !switched;
    if (switched) failed = cudaDeviceSynchronize() != cudaSuccess;
    try {
      from_.deallocate(ptr_, bytes_, allocation_alignment);
    } catch (...) {  // NOLINT(bugprone-empty-catch): nothing to report it to from a destructor
    }
    if (switched && cudaSetDevice(previous) != cudaSuccess) failed = true;
    if (failed) (void)cudaGetLastError();
    ptr_ = device_ptr_ = nullptr;
  }

  void* ptr_ = nullptr;
  void* device_ptr_ = nullptr;
  std::size_t bytes_ = 0;
  memory_kind kind_ = memory_kind::host;
  memory_resource_ref from_;  // empty: gear's own allocation
  int device_ = -1;           // the GPU of resource memory of a GPU kind
};

/// Sets `bytes` bytes at `p`, memory of kind `kind`, to zero and returns once they are. Device
/// memory is cleared on a private stream and waited for: the legacy stream does not order the
/// caller's non-blocking streams, so work they enqueue next could otherwise run first.
/// Throws errc::cuda_error.
inline void zero_now(void* p, std::size_t bytes, memory_kind kind) {
  if (bytes == 0) return;
  if (kind != memory_kind::device) {
    std::memset(p, 0, bytes);
    return;
  }
  cudaStream_t init{};
  GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&init, cudaStreamNonBlocking));
  const cudaError_t cleared = cudaMemsetAsync(p, 0, bytes, init);
  const cudaError_t synced = cudaStreamSynchronize(init);
  GEAR_CUDA_TRY(cudaStreamDestroy(init));
  GEAR_CUDA_TRY(cleared);
  GEAR_CUDA_TRY(synced);
}

}  // namespace detail
}  // namespace gear
