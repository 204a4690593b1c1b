#pragma once
// Device side of gear::select::uniform: drawn inside the gather kernel (row_selector; without
// replacement for batches whose claim table one block clears), else one thread per row; or, for
// a sample under max_times_sampled without replacement, drawn on the host and staged (mirror_rows).

#include <cuda/stream_ref>
#include <gear/detail/cuda.hpp>
#include <gear/detail/select_rows.cuh>
#include <gear/select/uniform.hpp>
#include <optional>
#include <span>
#include <variant>
#include <vector>

namespace gear::detail {

/// Clears a claim table (a power of two >= 2 words at a 16-byte boundary, zero between samples)
/// in the last block of the gather that claimed in it (the gather's epilogue).
struct claims_epilogue {
  std::uint64_t* claims = nullptr;
  std::int64_t words = 0;
  unsigned* arrivals = nullptr;
  static constexpr bool present = true;
  __device__ void operator()() const {
    auto* table = reinterpret_cast<uint4*>(claims);
    for (std::int64_t i = threadIdx.x; i < words / 2; i += blockDim.x)
      table[i] = make_uint4(0, 0, 0, 0);
  }
};

/// Uniform rows without replacement drawn inside the gather kernel: in each row group of a block,
/// lane 0 walks the row's candidates and claims one for the row in request.claims
/// (uniform_row_claimed_for: the row's other blocks, columns and chunks, settle on the same
/// slot); the group shares it. Block-cooperative: only for a kernel whose every thread calls it
/// once (the gather).
struct uniform_gather_claims {
  slot_table table;
  selection_request request;  // scratch: the claim table (request.claims)

  __device__ selected_row operator()(std::int64_t row, const row_group& g) const {
    __shared__ std::int64_t chosen[row_group::max_groups];
    if (g.lane == 0 && g.active) chosen[g.group] = uniform_row_claimed_for(table, request, row);
    __syncthreads();
    const std::int64_t slot = g.active ? chosen[g.group] : -1;
    return {slot, slot < 0 ? 0.0f : 1.0f / static_cast<float>(table.live), 1.0f};
  }
  /// In a kernel of a sample with a gear::device_rng: the live count and draw as they are now.
  __device__ void read_device_counts() noexcept { detail::read_device_counts(table, request); }
  /// The table is cleared by the gather's last block.
  [[nodiscard]] claims_epilogue epilogue() const noexcept {
    return {request.scratch, request.scratch_size, request.arrivals};
  }
};

}  // namespace gear::detail

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
    if (staged(r)) {
      detail::select_rows_on_device(staged_rows(t, r), r, stream);
    } else if (policy_.replacement) {
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

  /// The gather kernel draws the rows itself: with replacement each row on its own; without, each
  /// row claims its slot in the request's claims, which the gather's last block clears (tables of
  /// up to tuning::select_fused_claims_max_words; larger ones go through select()).
  [[nodiscard]] std::optional<std::variant<detail::uniform_rows, detail::uniform_gather_claims,
                                           detail::staged_rows<detail::uniform_rows>>>
  row_selector(const slot_table& t, const selection_request& r) const {
    if (staged(r)) return staged_rows(t, r);
    if (policy_.replacement) return detail::uniform_rows{t, r, true};
    if (r.claims == nullptr || r.arrivals == nullptr ||
        r.scratch_size > detail::tuning::select_fused_claims_max_words ||
        r.batch >= detail::max_claiming_rows || t.capacity >= detail::max_claiming_slots)
      return std::nullopt;
    selection_request claiming = r;
    claiming.scratch = r.claims;
    return detail::uniform_gather_claims{t, claiming};
  }

  /// Host memory for mirror_rows of batches of up to `batch` rows, allocated now
  /// (replay_buffer::reserve_staging). Throws std::bad_alloc with the state as it was.
  void reserve_staging(std::int64_t batch) {
    mirrored_.reserve(static_cast<std::size_t>(batch));
    if (!policy_.replacement)
      host_claims_.reserve(static_cast<std::size_t>(detail::claim_table_size(batch)));
  }

  /// (gear::host_row_mirroring) The host knows a sample's rows before it is enqueued. With
  /// replacement every row is a pure function of the draw and the dense index, so the host draws
  /// the rows the GPU will; without, rows claim slots in an order the GPU decides, so the host
  /// draws them (claiming one row after another) and the GPU gathers those (stages_mirror).
  [[nodiscard]] bool mirrors() const noexcept { return true; }
  [[nodiscard]] bool stages_mirror() const noexcept { return !policy_.replacement; }
  /// The rows of `r` drawn on the host from `host_view` (the table as of the call, with the
  /// ring's host arrays): with replacement those select() and the gather will draw; without, the
  /// rows they take from r.chosen_rows_device, where the buffer stages them. Host memory, valid
  /// until the next call. Throws std::bad_alloc (nothing else changes).
  std::span<const std::int64_t> mirror_rows(const slot_table& host_view,
                                            const selection_request& r) {
    selection_request claiming = r;
    if (!policy_.replacement) {
      claiming.scratch_size = detail::claim_table_size(r.batch);
      host_claims_.assign(static_cast<std::size_t>(claiming.scratch_size), 0);
      claiming.scratch = host_claims_.data();
    }
    detail::draw_slots_on_host(detail::uniform_rows{host_view, claiming, policy_.replacement},
                               r.batch, mirrored_);
    return mirrored_;
  }

 private:
  /// Whether `r` carries rows the host drew for the GPU (mirror_rows without replacement).
  [[nodiscard]] bool staged(const selection_request& r) const noexcept {
    return !policy_.replacement && r.chosen_rows_device != nullptr;
  }
  [[nodiscard]] static detail::staged_rows<detail::uniform_rows> staged_rows(
      const slot_table& t, const selection_request& r) noexcept {
    return {detail::uniform_rows{t, r, false}, r.chosen_rows_device};
  }

  uniform policy_;
  std::vector<std::int64_t> mirrored_;
  std::vector<std::uint64_t> host_claims_;  // the host's claim table without replacement
};

}  // namespace gear::select
