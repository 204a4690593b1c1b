#pragma once
// Element types a column may hold, and their runtime tags.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace gear {

/// Runtime tag of a column's element type, used to check inputs against the spec.
enum class dtype : std::uint8_t {
  f32,
  f64,
  f16,
  bf16,
  i8,
  i16,
  i32,
  i64,
  u8,
  u16,
  u32,
  u64,
  boolean
};

/// The dtype tag of T; only the types listed in dtype are allowed.
template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __half> ||
    std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, std::int8_t> ||
    std::is_same_v<T, std::int16_t> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint8_t> ||
    std::is_same_v<T, std::uint16_t> || std::is_same_v<T, std::uint32_t> ||
    std::is_same_v<T, std::uint64_t> || std::is_same_v<T, bool>;

template <class T>
requires is_element_type_v<T>
inline constexpr dtype dtype_of = [] {
  if constexpr (std::is_same_v<T, float>)
    return dtype::f32;
  else if constexpr (std::is_same_v<T, double>)
    return dtype::f64;
  else if constexpr (std::is_same_v<T, __half>)
    return dtype::f16;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return dtype::bf16;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return dtype::i8;
  else if constexpr (std::is_same_v<T, std::int16_t>)
    return dtype::i16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return dtype::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return dtype::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return dtype::u8;
  else if constexpr (std::is_same_v<T, std::uint16_t>)
    return dtype::u16;
  else if constexpr (std::is_same_v<T, std::uint32_t>)
    return dtype::u32;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return dtype::u64;
  else
    return dtype::boolean;
}();

/// Bytes per element of a dtype.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f64:
    case dtype::i64:
    case dtype::u64:
      return 8;
    case dtype::f32:
    case dtype::i32:
    case dtype::u32:
      return 4;
    case dtype::f16:
    case dtype::bf16:
    case dtype::i16:
    case dtype::u16:
      return 2;
    case dtype::i8:
    case dtype::u8:
    case dtype::boolean:
      return 1;
  }
  return 0;
}

/// A short name of a dtype ("f32", "bf16", ...), for error messages.
constexpr std::string_view to_string(dtype t) noexcept {
  constexpr std::string_view names[] = {"f32", "f64", "f16", "bf16", "i8",  "i16",    "i32",
                                        "i64", "u8",  "u16", "u32",  "u64", "boolean"};
  return names[static_cast<int>(t)];
}

}  // namespace gear
