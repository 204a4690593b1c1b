#pragma once
// gear::memory_resource_ref and gear::memory_resources: where a buffer's slots take their memory
// from, when it is not gear's own allocation.
//
// A buffer's slots (capacity x max_length steps of every column: most of its memory) are
// allocated once, when the buffer is built, in each kind of memory its columns are placed in
// (layout.hpp). By default gear allocates them itself: `operator new` for storage::host,
// `cudaHostAlloc` (mapped, portable) for pinned host memory, `cudaMalloc` for device memory. A
// program that pools its memory (a pool shared with a training framework, memory registered
// with a NIC, huge pages) hands the buffer a resource per kind instead:
//
//   my_device_pool pool;                     // any object with allocate / deallocate, below
//   gear::replay_buffer<spec, gear::storage::device> buf(
//       gear::capacity{1 << 20}, gear::max_length{64}, {}, {}, {.device = pool});
//
// A resource is any object with
//
//   void* allocate(std::size_t bytes, std::size_t alignment);
//   void deallocate(void* p, std::size_t bytes, std::size_t alignment);
//
// the shape of std::pmr::memory_resource and of the cuda::mr resources of CCCL 3.0 (the CUDA 13.0
// toolkit's; later CCCL versions name that pair allocate_sync / deallocate_sync: wrap such a
// resource in a struct of the shape above). The buffer keeps a reference, not a copy: the
// resource must outlive the buffer. What the buffer checks of the memory it is given, before
// using any of it (each refusal gives the memory back and throws, leaving nothing allocated):
//
// - every kind: the address is aligned to 256 bytes (gear asks for that alignment);
// - pinned host memory: the GPU can map it (`cudaHostGetDevicePointer` succeeds: memory from
//   `cudaHostAlloc` with `cudaHostAllocMapped`, or host memory registered with
//   `cudaHostRegisterMapped`); kernels read it at the mapped address;
// - device memory: `cudaPointerGetAttributes` calls it device memory of the buffer's GPU (the
//   device current when the buffer is built, current while it allocates), or managed memory.
//
// A resource that throws, or returns null, fails the buffer's construction with
// errc::out_of_memory naming the kind, the size and the resource's own message (what() of a
// std::exception). The slots go back to their resource when the buffer is destroyed, after the
// buffer's GPU has finished the work queued on it (as cudaFree waits) and with that GPU current:
// a pool may hand them out again at once. Staging, selection state and batches are gear's own
// allocations (call_limits.hpp sizes staging up front).
//
// A sharded_buffer hands its one set of resources to every shard, each shard's device current
// while it allocates and gives back: there a resource allocates on the current device (as
// cudaMalloc does), or keeps a pool per device and picks one by cudaGetDevice.

#include <concepts>
#include <cstddef>
#include <memory>
#include <type_traits>

namespace gear {

/// Something a buffer can take memory from (see above).
template <class R>
concept memory_resource = requires(R& r, void* p, std::size_t n) {
  { r.allocate(n, n) } -> std::convertible_to<void*>;
  r.deallocate(p, n, n);
};

/// A non-owning reference to a memory_resource; empty (the default): gear allocates itself.
class memory_resource_ref {
 public:
  constexpr memory_resource_ref() noexcept = default;
  template <memory_resource R>
    requires(!std::derived_from<std::remove_cv_t<R>, memory_resource_ref>)
  memory_resource_ref(R& resource) noexcept  // NOLINT: converts implicitly, as a reference does
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(resource)))),
        allocate_([](void* o, std::size_t bytes, std::size_t alignment) -> void* {
          return static_cast<R*>(o)->allocate(bytes, alignment);
        }),
        deallocate_([](void* o, void* p, std::size_t bytes, std::size_t alignment) {
          static_cast<R*>(o)->deallocate(p, bytes, alignment);
        }) {}

  /// True when it refers to a resource.
  [[nodiscard]] explicit operator bool() const noexcept { return object_ != nullptr; }
  /// The resource's allocate: what it returns or throws. Requires a resource.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment) const {
    return allocate_(object_, bytes, alignment);
  }
  /// The resource's deallocate. Requires a resource.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) const {
    deallocate_(object_, p, bytes, alignment);
  }
  /// Whether both refer to the same object.
  friend bool operator==(const memory_resource_ref& a, const memory_resource_ref& b) noexcept {
    return a.object_ == b.object_;
  }

 private:
  void* object_ = nullptr;
  void* (*allocate_)(void*, std::size_t, std::size_t) = nullptr;
  void (*deallocate_)(void*, void*, std::size_t, std::size_t) = nullptr;
};

/// The resource a buffer's slots take each kind of memory from; an empty one: gear's own
/// allocation. Only the kinds the buffer's storage places columns in are used.
struct memory_resources {
  memory_resource_ref host{};    ///< pageable host memory (storage::host)
  memory_resource_ref pinned{};  ///< page-locked host memory the GPU maps (pinned_host, mixed)
  memory_resource_ref device{};  ///< memory of the buffer's GPU (device, mixed)
};

}  // namespace gear
