#pragma once
// gear: everything that compiles with a plain C++20 compiler. Enough for storage::host buffers,
// which select and gather on the CPU and run on machines without a GPU. For GPU storage include
// <gear/gear.cuh> instead (compiled by nvcc).

#include <gear/batch.hpp>
#include <gear/device_rng.hpp>
#include <gear/dtype.hpp>
#include <gear/error.hpp>
#include <gear/insert.hpp>
#include <gear/key.hpp>
#include <gear/layout.hpp>
#include <gear/memory_resource.hpp>
#include <gear/ref.hpp>
#include <gear/replay_buffer.hpp>
#include <gear/rng.hpp>
#include <gear/select/concept.hpp>
#include <gear/select/prioritized.hpp>
#include <gear/select/queue.hpp>
#include <gear/select/recency.hpp>
#include <gear/select/uniform.hpp>
#include <gear/spec.hpp>
#include <gear/storage/device.hpp>
#include <gear/storage/host.hpp>
#include <gear/storage/mixed.hpp>
#include <gear/storage/pinned_host.hpp>
#include <gear/strong_types.hpp>
#include <gear/transport/local.hpp>
#include <gear/version.hpp>
#include <gear/window.hpp>
