#pragma once
// The last block of a launch to finish its part: a selection that needs every row before it can
// finish (the weights of a prioritized batch) or that must leave its workspace clear for the next
// sample (uniform's claim table) does that in its last block, in the same launch, instead of a
// second launch or a memset (selection_workspace.hpp).

namespace gear::detail {

/// Counts the calling block among the launch's arrivals in `word`, which is 0 when the launch
/// starts and which the last arrival takes back to 0 (atomicInc wraps), and tells every thread of
/// the block whether it was the last. Every thread of the block calls it once its writes that
/// the last block reads are done; the last block's reads of the other blocks' writes follow it.
__device__ inline bool last_block_to_arrive(unsigned* word) {
  __shared__ bool last;
  __syncthreads();  // the block's writes come before thread 0's release
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicInc(word, gridDim.x - 1) == gridDim.x - 1;
    if (last) __threadfence();  // acquire: the other blocks' writes, released before they arrived
  }
  __syncthreads();
  return last;
}

}  // namespace gear::detail
