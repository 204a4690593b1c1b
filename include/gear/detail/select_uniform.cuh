#pragma once
// Device side of gear::select::uniform: one thread per row, or, with replacement, drawn inside
// the gather kernel (row_selector).

#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/select_rows.cuh>
#include <gear/select/uniform.hpp>
#include <optional>

namespace gear::select {

/// Device side: one kernel launch (and a memset without replacement, for a request without claims
/// or a batch over 8192 rows), stream-ordered, never synchronises.
template <>
class uniform::state<exec::device> {
 public:
  /// Its kernels take the live count and the draw from device memory (gear::device_rng).
  static constexpr bool reads_device_counts = true;

  state(const uniform& policy, std::int64_t /*capacity*/) : policy_(policy) {}

  void validate(const slot_table& t, std::int64_t batch) const {
    detail::validate_uniform(t, batch, policy_.replacement);
  }

  /// Without replacement the rows claim slots in a table that starts empty: the request's claims
  /// (clear between samples; the launch's last block clears them again) where the table is small
  /// enough for one block to clear, else its scratch, cleared by a memset first.
  void select(const slot_table& t, const selection_request& r, cuda::stream_ref stream) {
    if (policy_.replacement) {
      detail::select_rows_on_device(detail::uniform_rows{t, r, true}, r, stream);
    } else if (r.claims != nullptr && r.arrivals != nullptr &&
               r.scratch_size <= detail::tuning::select_fused_claims_max_words) {
      selection_request claiming = r;
      claiming.scratch = r.claims;
      detail::select_rows_on_device</*ClearsClaims=*/true>(detail::uniform_rows{t, claiming, false},
                                                           claiming, stream);
    } else {
      GEAR_CUDA_TRY(cudaMemsetAsync(
          r.scratch, 0, static_cast<std::size_t>(r.scratch_size) * sizeof(std::uint64_t),
          stream.get()));
      detail::select_rows_on_device(detail::uniform_rows{t, r, false}, r, stream);
    }
  }

  /// With replacement every row is drawn on its own, so sample() draws inside the gather kernel.
  [[nodiscard]] std::optional<detail::uniform_rows> row_selector(const slot_table& t,
                                                                 const selection_request& r) const {
    if (!policy_.replacement) return std::nullopt;
    return detail::uniform_rows{t, r, true};
  }

 private:
  uniform policy_;
};

}  // namespace gear::select
