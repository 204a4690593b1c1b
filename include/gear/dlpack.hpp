#pragma once
// gear::to_dlpack: a batch's outputs as DLPack tensors, for a framework to use in place, with no
// copy: PyTorch (at::fromDLPack, torch.from_dlpack), JAX, CuPy, TVM. Needs <dlpack/dlpack.h>
// (Debian: libdlpack-dev); the rest of gear does not.
//
//   auto out = buf.make_batch(gear::batch_size{256}, gear::window_length{64});
//   at::Tensor obs = at::fromDLPack(gear::to_dlpack<"obs">(out));     // [256, 64, 4, 84, 84]
//   at::Tensor mask = at::fromDLPack(gear::mask_to_dlpack(out));       // [256, 64], uint8
//   at::Tensor w = at::fromDLPack(gear::weights_to_dlpack(out));       // [256], float32
//   for (;;) buf.sample_async(out, window, rng, stream);                // refills the same tensors
//
// Each tensor views the batch's memory, compact and row-major (strides null, byte_offset 0), on
// the batch's device: kDLCUDA and the GPU the memory is on for GPU buffers' batches, kDLCPU for
// storage::host's (a batch made by hand in pinned memory: kDLCUDAHost, which not every framework
// takes). It does not own the bytes: keep the batch alive, and not moved from, while the
// tensor is in use; read it after the sample that fills it (on that sample's stream, or after
// synchronising it). Every sample into the batch refills the same bytes, so export once per batch.
// The tensor's deleter (frameworks call it when they let go) frees only the tensor's own record.
//
// Element types map to DLPack's codes: float and double (kDLFloat), __half (kDLFloat, 16 bits),
// __nv_bfloat16 (kDLBfloat), signed and unsigned integers (kDLInt, kDLUInt). bool has no code in
// DLPack before 0.8 (Debian 12 ships 0.6): it is exported as 8-bit unsigned integers, 0 or 1.
// Keys are 16-byte records (gear::key) with no DLPack type: read them with batch::keys().

#if !__has_include(<dlpack/dlpack.h>)
#error "gear/dlpack.hpp needs <dlpack/dlpack.h>: install libdlpack-dev (Debian) or DLPack's header"
#endif
#include <dlpack/dlpack.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <gear/batch.hpp>
#include <gear/detail/cuda.hpp>
#include <gear/spec.hpp>
#include <memory>
#include <span>
#include <type_traits>

namespace gear {
namespace detail {

/// What a tensor made by gear owns: its DLManagedTensor (first, so that its address is the
/// record's) and the shape it points to.
struct dlpack_record {
  DLManagedTensor managed{};
  std::array<std::int64_t, 2 + max_rank> shape{};
};

/// DLPack's type of T (a gear element type).
template <class T>
constexpr DLDataType dlpack_type_of() noexcept {
  constexpr auto bits = static_cast<std::uint8_t>(8 * sizeof(T));
  if constexpr (std::is_same_v<T, bool>)
    return {kDLUInt, 8, 1};
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return {kDLBfloat, 16, 1};
  else if constexpr (std::is_same_v<T, __half> || std::is_floating_point_v<T>)
    return {kDLFloat, bits, 1};
  else if constexpr (std::is_signed_v<T>)
    return {kDLInt, bits, 1};
  else
    return {kDLUInt, bits, 1};
}

/// The DLPack device of memory of kind `where` at `p`. Throws errc::cuda_error.
inline DLDevice dlpack_device_of(const void* p, memory_kind where) {
  if (where == memory_kind::host) return {kDLCPU, 0};
  if (where == memory_kind::pinned_host) return {kDLCUDAHost, 0};
  return {kDLCUDA, memory_of(p).ordinal};
}

/// A tensor of T viewing `data` (in the memory of `b`, which holds memory) with the given shape.
template <class T, class Batch>
DLManagedTensor* make_dlpack(const Batch& b, void* data, std::span<const std::int64_t> shape) {
  auto record = std::make_unique<dlpack_record>();
  std::copy(shape.begin(), shape.end(), record->shape.begin());
  DLTensor& t = record->managed.dl_tensor;
  t.data = data;
  t.device = dlpack_device_of(data, b.where());
  t.ndim = static_cast<int>(shape.size());
  t.dtype = dlpack_type_of<T>();
  t.shape = record->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  record->managed.manager_ctx = record.get();
  record->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<dlpack_record*>(self->manager_ctx);
  };
  return &record.release()->managed;
}

}  // namespace detail

/// Column I of `b` as a [B, L, shape...] tensor (see above). The caller owns the tensor: hand it
/// to a framework, or call its deleter. Throws errc::batch_mismatch (a batch moved from),
/// errc::cuda_error; std::bad_alloc.
template <std::size_t I, trajectory_spec Spec>
[[nodiscard]] DLManagedTensor* to_dlpack(const batch<Spec>& b) {
  static_assert(I < Spec::num_columns, "gear::to_dlpack<I>: the spec has no column I");
  detail::check_batch_memory(b);
  using column = typename Spec::template column_t<I>;
  std::array<std::int64_t, 2 + column::rank> shape{b.batch_size(), b.window_length()};
  std::copy(column::shape.begin(), column::shape.end(), shape.begin() + 2);
  return detail::make_dlpack<typename column::element_type>(b, b.column_data(I), shape);
}

/// The column called Name of `b` as a [B, L, shape...] tensor: to_dlpack<I>.
template <fixed_string Name, trajectory_spec Spec>
[[nodiscard]] DLManagedTensor* to_dlpack(const batch<Spec>& b) {
  constexpr std::size_t i = Spec::index_of(Name.view());
  static_assert(i < Spec::num_columns,
                "gear::to_dlpack<Name>: the spec has no column of that name");
  return to_dlpack<i>(b);
}

/// The mask of `b` as a [B, L] tensor of uint8 (1 where a position holds a step). These three
/// throw as to_dlpack does.
template <trajectory_spec Spec>
[[nodiscard]] DLManagedTensor* mask_to_dlpack(const batch<Spec>& b) {
  detail::check_batch_memory(b);
  const std::array<std::int64_t, 2> shape{b.batch_size(), b.window_length()};
  return detail::make_dlpack<std::uint8_t>(b, b.mask_data(), shape);
}

/// The probabilities of `b`'s rows as a [B] tensor of float32.
template <trajectory_spec Spec>
[[nodiscard]] DLManagedTensor* probabilities_to_dlpack(const batch<Spec>& b) {
  detail::check_batch_memory(b);
  const std::array<std::int64_t, 1> shape{b.batch_size()};
  return detail::make_dlpack<float>(b, b.probabilities_data(), shape);
}

/// The importance weights of `b`'s rows as a [B] tensor of float32.
template <trajectory_spec Spec>
[[nodiscard]] DLManagedTensor* weights_to_dlpack(const batch<Spec>& b) {
  detail::check_batch_memory(b);
  const std::array<std::int64_t, 1> shape{b.batch_size()};
  return detail::make_dlpack<float>(b, b.weights_data(), shape);
}

}  // namespace gear
