#pragma once
// Steps every insert path shares (insert_pipeline.hpp, landing.hpp): the CPU copy of packed host
// columns and the selection policy's hooks.

#include <cstddef>
#include <cstdint>
#include <cuda/stream_ref>
#include <gear/detail/host_copy.hpp>
#include <gear/insert.hpp>
#include <gear/layout.hpp>
#include <gear/select/concept.hpp>
#include <span>

namespace gear::detail {

/// Bytes of column c of `steps` steps packed in staging, each column aligned to
/// segment_alignment (insert_staging's layout, which a landing insert's publish reads).
template <class Spec>
constexpr std::int64_t packed_column_bytes(std::int64_t steps, std::size_t c) noexcept {
  return align_up(steps * Spec::step_bytes[c], segment_alignment);
}

/// Copies the packed host data of the columns `wanted` selects with the CPU (several threads
/// when large): piece i (lengths[i] steps) of column c goes to target(c, i).
template <class Spec, class Wanted, class Target>
void copy_host_columns(const trajectories<Spec>& in, std::span<const std::int64_t> lengths,
                       std::int64_t bytes, Wanted&& wanted, Target&& target) {
  const unsigned parts = copy_threads_for(bytes);
  parallel_for(parts, [&](unsigned part) {
    for (std::size_t c = 0; c < Spec::num_columns; ++c)
      if (wanted(c))
        copy_packed_share(
            static_cast<const std::byte*>(in.columns[c].data), lengths, Spec::step_bytes[c],
            [&](std::size_t i) { return target(c, i); }, part, parts);
  });
}

template <class Core>
void run_evict_hook(Core& b, std::uint64_t first, std::int64_t count, cuda::stream_ref stream) {
  if constexpr (evict_hook<typename Core::state_type>)
    b.selection_->on_evict(b.table(), first, count, stream);
}
template <class Core>
void run_commit_hook(Core& b, std::uint64_t first, std::int64_t count, cuda::stream_ref stream) {
  if constexpr (commit_hook<typename Core::state_type>)
    b.selection_->on_commit(b.table(), first, count, stream);
}

}  // namespace gear::detail
