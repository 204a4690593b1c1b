#pragma once
// sharded_buffer's last step of a sample on the GPU: the shards' local probabilities made global
// and the union's importance weights (detail/shard_streams.hpp: globalize_on_host does the same
// on the CPU). One block on the caller's stream after every shard's share has joined it.

#include <cmath>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/shard_streams.hpp>
#include <gear/detail/sum_tree_select.cuh>

namespace gear::detail {

/// P_i = factor * local in two passes over the same rows per thread: the smallest P_i first
/// (cub::BlockReduce), then each row's probability and, with beta > 0, its weight.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    globalize_kernel(float* probabilities, float* weights, shard_parts parts, double beta) {
  double smallest = INFINITY;
  for (int k = 0; k < parts.count; ++k)
    for (std::int64_t i = parts.first[k] + threadIdx.x; i < parts.first[k] + parts.rows[k];
         i += Threads) {
      const double p = parts.factor[k] * static_cast<double>(probabilities[i]);
      smallest = p > 0 && p < smallest ? p : smallest;
    }
  const double batch_min = block_min_to_all<Threads>(smallest);
  for (int k = 0; k < parts.count; ++k)
    for (std::int64_t i = parts.first[k] + threadIdx.x; i < parts.first[k] + parts.rows[k];
         i += Threads) {
      const double p = parts.factor[k] * static_cast<double>(probabilities[i]);
      if (beta > 0) weights[i] = p > 0 ? static_cast<float>(::pow(batch_min / p, beta)) : 0.0f;
      probabilities[i] = static_cast<float>(p);
    }
}

inline void globalize_on_device(float* probabilities, float* weights, const shard_parts& parts,
                                double beta, cuda::stream_ref stream) {
  constexpr int threads = 1024;
  globalize_kernel<threads><<<1, threads, 0, stream.get()>>>(probabilities, weights, parts, beta);
  GEAR_CHECK_LAUNCH("globalize_kernel");
}

}  // namespace gear::detail
