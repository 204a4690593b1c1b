#pragma once
#include <gear/storage/concept.hpp>

namespace gear::storage {

/// Pageable host memory. Selection and gathering run on the CPU; no GPU is needed.
struct host : detail::uniform_placement<memory_kind::host> {};

}  // namespace gear::storage
