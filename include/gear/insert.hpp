#pragma once
// Inputs of insert(): a batch of whole trajectories, each column packed back to back.
//
//   column c:  [traj 0: len0 steps][traj 1: len1 steps]...   (steps of shape c, no padding)

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <gear/detail/memory.hpp>
#include <gear/dtype.hpp>
#include <gear/error.hpp>
#include <gear/spec.hpp>
#include <initializer_list>
#include <span>
#include <string>

namespace gear {

/// One column of an insert: the packed steps of every trajectory, and what the caller says they
/// are (checked against the spec).
struct column_input {
  const void* data = nullptr;
  dtype type = dtype::u8;
  int rank = 0;
  std::array<std::int64_t, max_rank> shape{};
};

/// Describes packed column data: `input(obs, {4, 84, 84})`, `input(reward)` for scalars.
template <class T>
requires is_element_type_v<T> column_input input(const T* data,
                                                 std::initializer_list<std::int64_t> shape = {}) {
  column_input in{data, dtype_of<T>, static_cast<int>(shape.size()), {}};
  GEAR_REQUIRE(shape.size() <= max_rank, errc::wrong_shape,
               "a per-step shape has at most 6 dimensions");
  std::size_t i = 0;
  for (std::int64_t e : shape) in.shape[i++] = e;
  return in;
}

/// A batch of whole trajectories to insert.
template <trajectory_spec Spec>
struct trajectories {
  /// Length of each trajectory, in host memory; its size is the number of trajectories.
  std::span<const std::int64_t> lengths;
  /// One input per column of the spec, in spec order.
  std::array<column_input, Spec::num_columns> columns;
  /// Where the column data lives: memory_kind::host (pageable or pinned) or memory_kind::device.
  memory_kind source = memory_kind::host;
};

namespace detail {

/// Checks one column input against column c of Spec (type, shape, pointer).
template <trajectory_spec Spec, std::size_t C>
void check_column_input(const column_input& in) {
  using col = typename Spec::template column_t<C>;
  GEAR_REQUIRE(in.data != nullptr, errc::null_pointer,
               "column '" + std::string(col::name) + "': data is null");
  GEAR_REQUIRE(in.type == col::type, errc::wrong_type,
               "column '" + std::string(col::name) + "': expected " +
                   std::string(to_string(col::type)) + ", got " + std::string(to_string(in.type)));
  GEAR_REQUIRE(in.rank >= 0 && in.rank <= static_cast<int>(max_rank), errc::wrong_shape,
               "column '" + std::string(col::name) + "': rank " + std::to_string(in.rank) +
                   " of its per-step shape is outside [0, " + std::to_string(max_rank) + "]");
  const bool same = in.rank == static_cast<int>(col::rank) &&
                    std::equal(col::shape.begin(), col::shape.end(), in.shape.begin());
  if (!same) {
    auto show = [](const std::int64_t* s, std::size_t n) {
      std::string out = "[";
      for (std::size_t i = 0; i < n; ++i) out += (i ? "," : "") + std::to_string(s[i]);
      return out + "]";
    };
    throw error(errc::wrong_shape, "column '" + std::string(col::name) + "': per-step shape " +
                                       show(in.shape.data(), static_cast<std::size_t>(in.rank)) +
                                       ", the spec says " + show(col::shape.data(), col::rank));
  }
  GEAR_REQUIRE(reinterpret_cast<std::uintptr_t>(in.data) % sizeof(typename col::element_type) == 0,
               errc::misaligned_pointer,
               "column '" + std::string(col::name) + "': data is not aligned to its element size");
}

/// The input of column C of Spec packed at `data` (its type and shape as the spec says).
template <trajectory_spec Spec, std::size_t C>
column_input column_input_of(const void* data) {
  using col = typename Spec::template column_t<C>;
  column_input in{data, col::type, static_cast<int>(col::rank), {}};
  if constexpr (col::rank > 0)  // (a scalar column has no shape to copy)
    for (std::size_t i = 0; i < col::rank; ++i) in.shape[i] = col::shape[i];
  return in;
}

}  // namespace detail
}  // namespace gear
