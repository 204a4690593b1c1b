#pragma once
#include <gear/storage/concept.hpp>

namespace gear::storage {

/// Page-locked host memory mapped into the GPU's address space. Capacity is bounded by host RAM;
/// selection runs on the GPU and gathers read the slots zero-copy over PCIe or C2C.
struct pinned_host : detail::uniform_placement<memory_kind::pinned_host> {};

}  // namespace gear::storage
