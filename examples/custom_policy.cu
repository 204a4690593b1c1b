// gear example: a selection policy written outside the library.
//
// "recent_mix": each row comes, with probability q, from the newest K reservations and otherwise
// from all committed trajectories, uniformly in both cases. It satisfies gear's selection concept
// (gear/select/concept.hpp): a small settings struct with a nested state<Space> for
// gear::exec::host and gear::exec::device, each with validate() and select(). Nothing in gear
// changes: the policy is the third template argument of replay_buffer.
//
// The reported probability q/K' + (1-q)/N assumes every one of the newest K' = min(K, stored)
// reservations is committed (writers commit promptly); rows that land on a pending slot redraw.

#include <cstdio>
#include <gear/gear.cuh>
#include <optional>
#include <vector>

struct recent_mix {
  std::int64_t newest = 64;  // K
  double q = 0.5;            // share of rows from the newest K

  template <class Space>
  class state;
};

// The per-row rule, shared by both sides (GEAR_HD = __host__ __device__ under nvcc). Row r depends
// only on r and the call's random numbers, and it writes nothing, so the device state can also
// offer it as a row_selector: sample() then draws small batches inside its gather kernel, one
// launch instead of two. `per_thread` says that one thread may draw a row on its own, so short
// rows share a gather block (one warp each) instead of taking a block per row.
struct recent_mix_rows {
  gear::slot_table t;
  gear::selection_request r;
  std::int64_t newest;
  double q;
  static constexpr bool per_thread = true;

  GEAR_HD gear::selected_row operator()(std::int64_t row) const {
    const auto window = static_cast<std::uint64_t>(newest < t.occupied ? newest : t.occupied);
    const bool recent =
        gear::detail::unit_interval(r.draw.extra(static_cast<std::uint64_t>(row), 0)) < q;
    std::int64_t slot = -1;
    for (std::uint32_t attempt = 0; attempt < (1u << 20) && slot < 0; ++attempt) {
      const std::uint64_t ticket =
          recent ? t.next_ticket - window +
                       r.draw.below(window, static_cast<std::uint64_t>(row), attempt)
                 : r.draw.below(static_cast<std::uint64_t>(t.occupied),
                                static_cast<std::uint64_t>(row), attempt);
      const auto s = static_cast<std::int64_t>(ticket % static_cast<std::uint64_t>(t.capacity));
      if (t.lengths[s] > 0) slot = s;
    }
    const bool in_window = slot >= 0 && t.tickets[slot] + window >= t.next_ticket;
    const double p =
        (in_window ? q / static_cast<double>(window) : 0.0) + (1 - q) / static_cast<double>(t.live);
    return {slot, static_cast<float>(p), 1.0f};
  }
};

template <class Rows>  // a template, so a header could define it once per use
__global__ void recent_mix_kernel(Rows rows) {
  const std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
  if (row >= rows.r.batch) return;
  const gear::selected_row s = rows(row);
  rows.r.slots[row] = s.slot;
  rows.r.probabilities[row] = s.probability;
  rows.r.weights[row] = s.weight;
}

template <>
class recent_mix::state<gear::exec::host> {
 public:
  state(const recent_mix& p, std::int64_t) : p_(p) {}
  void validate(const gear::slot_table&, std::int64_t) const {}  // any batch, with replacement
  void select(const gear::slot_table& t, const gear::selection_request& r, cuda::stream_ref) {
    const recent_mix_rows rows{t, r, p_.newest, p_.q};
    for (std::int64_t row = 0; row < r.batch; ++row) {
      const gear::selected_row s = rows(row);
      r.slots[row] = s.slot;
      r.probabilities[row] = s.probability;
      r.weights[row] = s.weight;
    }
  }

 private:
  recent_mix p_;
};

template <>
class recent_mix::state<gear::exec::device> {
 public:
  state(const recent_mix& p, std::int64_t) : p_(p) {}
  void validate(const gear::slot_table&, std::int64_t) const {}
  void select(const gear::slot_table& t, const gear::selection_request& r, cuda::stream_ref s) {
    recent_mix_kernel<<<static_cast<unsigned>((r.batch + 255) / 256), 256, 0, s.get()>>>(
        recent_mix_rows{t, r, p_.newest, p_.q});
    GEAR_CHECK_LAUNCH("recent_mix_kernel");  // every launch checked
  }
  // Optional: lets sample() draw inside its gather kernel (see gear/select/concept.hpp).
  std::optional<recent_mix_rows> row_selector(const gear::slot_table& t,
                                              const gear::selection_request& r) const {
    return recent_mix_rows{t, r, p_.newest, p_.q};
  }

 private:
  recent_mix p_;
};

static_assert(gear::selection_policy_for<recent_mix, gear::exec::host>);
static_assert(gear::selection_policy_for<recent_mix, gear::exec::device>);

using spec = gear::spec<gear::column<"id", std::int32_t>>;

template <class Storage>
int run(cuda::stream_ref stream) {
  gear::replay_buffer<spec, Storage, recent_mix> buf{gear::capacity{1000}, gear::max_length{1},
                                                     recent_mix{.newest = 50, .q = 0.8}};
  std::vector<std::int32_t> ids(1000);
  for (std::int32_t i = 0; i < 1000; ++i) ids[i] = i;
  std::vector<std::int64_t> lengths(1000, 1);
  std::vector<gear::key> keys(1000);
  buf.insert({lengths, {gear::input(ids.data())}}, keys, stream);
  // 10000 rows as one batch (selection launch, then gather) and as 20 batches of 500 (small
  // enough that sample() draws them inside the gather launch): both follow the policy.
  gear::rng rng{1};
  auto share_of_recent = [&](std::int64_t rows, int calls) {
    auto batch = buf.make_batch(gear::batch_size{rows}, gear::window_length{1});
    std::vector<std::int32_t> got(static_cast<std::size_t>(rows));
    std::int64_t recent = 0;
    for (int call = 0; call < calls; ++call) {
      buf.sample(batch, gear::window{1}, rng, stream);
      const auto* src = batch.template column<"id">().data_handle();
      if constexpr (decltype(buf)::on_device)
        GEAR_CUDA_TRY(
            cudaMemcpy(got.data(), src, got.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
      else
        std::copy(src, src + rows, got.begin());
      for (auto id : got) recent += id >= 950;
    }
    return static_cast<double>(recent) / static_cast<double>(rows * calls);
  };
  int rc = 0;
  for (auto [rows, calls] : {std::pair{std::int64_t{10000}, 1}, std::pair{std::int64_t{500}, 20}}) {
    const double share = share_of_recent(rows, calls);  // expected 0.8 + 0.2 * 50 / 1000 = 0.81
    std::printf("recent_mix, %d x %lld rows: %.4f from the newest 50 of 1000 (expected 0.81)\n",
                calls, static_cast<long long>(rows), share);
    rc |= share > 0.78 && share < 0.84 ? 0 : 1;  // 0.78 and 0.84 are 7.7 standard deviations out
  }
  return rc;
}

int main() {
  try {
    if (gear::detail::gpu_available()) {
      cudaStream_t s{};
      GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      const int rc = run<gear::storage::device>(cuda::stream_ref{s});
      GEAR_CUDA_TRY(cudaStreamDestroy(s));
      return rc;
    }
    std::printf("no GPU found: using host storage\n");
    return run<gear::storage::host>(gear::detail::no_stream());
  } catch (const gear::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
