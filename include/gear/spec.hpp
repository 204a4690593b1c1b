#pragma once
// Trajectory specs: the named, typed, shaped columns every trajectory of a buffer has.
//
//   using my_spec = gear::spec<gear::column<"obs", std::uint8_t, 4, 84, 84>,
//                              gear::column<"action", std::int32_t>,
//                              gear::column<"reward", float>,
//                              gear::column<"done", bool>>;
//
// A column holds one element array of the given per-step shape for every step of a trajectory.
// A column with no extents holds one scalar per step.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cuda/std/mdspan>
#include <gear/dtype.hpp>
#include <gear/ref.hpp>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace gear {

/// A string usable as a template argument (column names).
template <std::size_t N>
struct fixed_string {
  char value[N]{};
  constexpr fixed_string(const char (&s)[N]) noexcept { std::copy_n(s, N, value); }
  [[nodiscard]] constexpr std::string_view view() const noexcept { return {value, N - 1}; }
};

/// The largest number of columns a spec may have, and of dimensions a per-step shape may have.
inline constexpr std::size_t max_columns = 16;
inline constexpr std::size_t max_rank = 6;

/// One column: its name, element type and per-step extents (all positive, fixed at compile time).
template <fixed_string Name, class T, std::int64_t... Extents>
struct column {
  static_assert(is_element_type_v<T>,
                "gear::column: element type must be float, double, __half, __nv_bfloat16, "
                "bool or a fixed-width integer");
  static_assert(((Extents > 0) && ...), "gear::column: every extent must be positive");
  static_assert(sizeof...(Extents) <= max_rank, "gear::column: at most 6 per-step dimensions");

  using element_type = T;
  static constexpr std::string_view name = Name.view();
  static constexpr dtype type = dtype_of<T>;
  static constexpr std::size_t rank = sizeof...(Extents);
  static constexpr std::array<std::int64_t, rank> shape{Extents...};
  static constexpr std::int64_t elements_per_step = (std::int64_t{1} * ... * Extents);
  static constexpr std::int64_t step_bytes = elements_per_step * std::int64_t{sizeof(T)};
  /// The extents of this column in a sampled batch: [batch, window, Extents...].
  using batch_extents =
      cuda::std::extents<std::int64_t, cuda::std::dynamic_extent, cuda::std::dynamic_extent,
                         static_cast<std::size_t>(Extents)...>;
  static constexpr bool is_gear_column = true;
};

namespace detail {
template <class C>
concept is_column = C::is_gear_column;
}  // namespace detail

/// The columns of every trajectory in a buffer, in storage order.
template <class... Columns>
struct spec {
  static_assert(sizeof...(Columns) >= 1, "gear::spec: a spec needs at least one column");
  static_assert(sizeof...(Columns) <= max_columns, "gear::spec: at most 16 columns");
  static_assert((detail::is_column<Columns> && ...),
                "gear::spec: every argument must be a gear::column<name, type, extents...>");

  using columns = std::tuple<Columns...>;
  static constexpr std::size_t num_columns = sizeof...(Columns);

  template <std::size_t I>
  using column_t = std::tuple_element_t<I, columns>;

  /// The columns' element types, which is all a kernel-side view needs to know of the spec.
  using element_list = element_types<typename Columns::element_type...>;

  static constexpr std::array<std::int64_t, num_columns> step_bytes{Columns::step_bytes...};
  static constexpr std::array<dtype, num_columns> types{Columns::type...};
  static constexpr std::array<std::string_view, num_columns> names{Columns::name...};
  static constexpr std::array<std::size_t, num_columns> element_sizes{
      sizeof(typename Columns::element_type)...};

  /// Index of the column called name; num_columns if there is none.
  static constexpr std::size_t index_of(std::string_view name) noexcept {
    for (std::size_t i = 0; i < num_columns; ++i)
      if (names[i] == name) return i;
    return num_columns;
  }

 private:
  static constexpr bool names_unique() {
    for (std::size_t i = 0; i < num_columns; ++i)
      for (std::size_t j = i + 1; j < num_columns; ++j)
        if (names[i] == names[j]) return false;
    return true;
  }
  static_assert(names_unique(), "gear::spec: column names must be unique");
};

/// Satisfied by gear::spec<...>.
template <class S>
concept trajectory_spec = requires {
  { S::num_columns } -> std::convertible_to<std::size_t>;
  typename S::columns;
  S::step_bytes;
};

}  // namespace gear
