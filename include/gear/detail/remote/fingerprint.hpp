#pragma once
// Fingerprints: what two processes must agree on before one writes into the other's memory. A
// shard's address blob carries them and a peer compares them with its own (messages.hpp): a spec
// that differs in a column's name, element type, shape or order, a different slot layout, or
// another selection policy would make one-sided writes land in the wrong place silently, so such a
// peer is refused before anything moves.

#include <cstdint>
#include <gear/detail/remote/bytes.hpp>
#include <gear/layout.hpp>
#include <gear/select/prioritized.hpp>
#include <gear/select/queue.hpp>
#include <gear/select/recency.hpp>
#include <gear/select/uniform.hpp>
#include <gear/spec.hpp>
#include <string_view>
#include <type_traits>

namespace gear::detail::remote {

/// FNV-1a, 64-bit: stable across compilers and runs.
struct fnv1a {
  std::uint64_t h = 0xcbf29ce484222325ull;
  constexpr void add_byte(std::uint8_t b) noexcept {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  constexpr void add(std::uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) add_byte(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  constexpr void add(std::string_view s) noexcept {
    add(s.size());
    for (const char c : s) add_byte(static_cast<std::uint8_t>(c));
  }
};

/// The spec's fingerprint: every column's name, element type and shape, in order, with the wire
/// version and the slot layout's alignment.
template <class Spec>
constexpr std::uint64_t spec_fingerprint() noexcept {
  fnv1a f;
  f.add(wire_version);
  f.add(static_cast<std::uint64_t>(segment_alignment));
  f.add(Spec::num_columns);
  [&]<std::size_t... C>(std::index_sequence<C...>) {
    (
        [&] {
          using column = typename Spec::template column_t<C>;
          f.add(column::name);
          f.add(static_cast<std::uint64_t>(column::type));
          f.add(column::rank);
          for (const std::int64_t e : column::shape) f.add(static_cast<std::uint64_t>(e));
        }(),
        ...);
  }
  (std::make_index_sequence<Spec::num_columns>{});
  return f.h;
}

/// The name a selection policy goes by on the wire.
template <class Selection>
constexpr std::string_view selection_wire_name() noexcept {
  if constexpr (std::is_same_v<Selection, select::uniform>)
    return "uniform";
  else if constexpr (std::is_same_v<Selection, select::prioritized>)
    return "prioritized";
  else if constexpr (std::is_same_v<Selection, select::recency>)
    return "recency";
  else if constexpr (std::is_same_v<Selection, select::fifo>)
    return "fifo";
  else if constexpr (std::is_same_v<Selection, select::lifo>)
    return "lifo";
  else
    return Selection::wire_name;  // a policy of the user's names itself
}

/// The selection policy's fingerprint: its kind (its settings travel in messages).
template <class Selection>
constexpr std::uint64_t selection_fingerprint() noexcept {
  fnv1a f;
  f.add(selection_wire_name<Selection>());
  return f.h;
}

}  // namespace gear::detail::remote
