#pragma once
#include <gear/storage/concept.hpp>

namespace gear::storage {

/// GPU memory. Selection and gathering run on the GPU at HBM bandwidth.
struct device : detail::uniform_placement<memory_kind::device> {};

}  // namespace gear::storage
