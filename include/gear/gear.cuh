#pragma once
// gear with its GPU backend: selection and gather kernels for pinned_host, device and mixed
// storage. Include this (instead of gear.hpp) in translation units compiled by nvcc; include it
// before any other gear header.

#if defined(GEAR_REPLAY_BUFFER_INCLUDED) && !defined(GEAR_DEVICE_BACKEND)
#error "gear: include <gear/gear.cuh> before any other gear header"
#endif

#if !defined(__CUDACC__)
#error "gear: <gear/gear.cuh> needs nvcc; plain C++ translation units include <gear/gear.hpp>"
#endif

#define GEAR_DEVICE_BACKEND 1

#include <gear/detail/gather.cuh>
#include <gear/detail/scatter.cuh>
#include <gear/detail/select_prioritized.cuh>
#include <gear/detail/select_queue.cuh>
#include <gear/detail/select_recency.cuh>
#include <gear/detail/select_uniform.cuh>
#include <gear/detail/shard_globalize.cuh>
#include <gear/gear.hpp>
