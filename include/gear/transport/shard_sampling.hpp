#pragma once
// A shard's side of a remote sample: select and gather the rows a learner asked for from the
// local buffer, with the buffer's own selection policy, and pack them as a sample reply
// (detail/remote/entry.hpp): the header with the shard's selection mass and size when it
// selected, the columns, mask and keys of every row (keys naming this shard and its
// incarnation), each row's probability within the shard, the footer.

#include <cstdint>
#include <cstring>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <gear/rng.hpp>
#include <gear/strong_types.hpp>
#include <span>

namespace gear::transport {

/// The buffer's selection mass: sum p^alpha for a policy with a sum tree (total()), else its
/// size (every trajectory weighs the same).
template <class Buffer>
double selection_mass(const Buffer& buffer) {
  if constexpr (!Buffer::on_device && requires { buffer.selection_state().total(); })
    return static_cast<double>(buffer.selection_state().total());
  else
    return static_cast<double>(buffer.size());
}

/// The random stream of one shard's share: the learner's seed and call, mixed.
constexpr std::uint64_t share_seed(std::uint64_t seed, std::uint64_t call) noexcept {
  std::uint64_t z = seed ^ (call + 0x9E3779B97F4A7C15ull + (seed << 6) + (seed >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Packs the reply to `r` into `out` (layout.total_bytes). A buffer that cannot sample (empty, a
/// device buffer: not served yet) answers with a header of no rows.
template <class Buffer>
void pack_sample_reply(Buffer& buffer, const detail::remote::sample_request& r,
                       const detail::remote::reply_layout& layout, std::uint32_t incarnation,
                       std::uint32_t shard, std::span<std::byte> out) {
  namespace remote = detail::remote;
  using spec = typename Buffer::spec_type;
  remote::reply_header h;
  h.request = r.request;
  h.incarnation = incarnation;
  h.rows = r.rows;
  h.window = r.win.length;
  if constexpr (Buffer::on_device) {
    h.rows = 0;  // device buffers: replies from a pinned batch are the next step
  } else {
    try {
      auto batch = buffer.make_batch(batch_size{r.rows}, window_length{r.win.length});
      rng g{share_seed(r.seed, r.call)};
      h.mass = selection_mass(buffer);
      h.size = buffer.size();
      buffer.sample(batch, r.win, g);
      const auto rows = static_cast<std::size_t>(r.rows),
                 window = static_cast<std::size_t>(r.win.length);
      for (std::size_t c = 0; c < spec::num_columns; ++c)
        std::memcpy(out.data() + layout.column_at[c], batch.column_data(c),
                    rows * window * static_cast<std::size_t>(spec::step_bytes[c]));
      std::memcpy(out.data() + layout.mask_at, batch.mask_data(), rows * window);
      for (std::size_t i = 0; i < rows; ++i) {
        key k = batch.keys_data()[i];
        k.shard = shard;
        k.incarnation = incarnation;
        std::memcpy(out.data() + layout.keys_at + i * sizeof(key), &k, sizeof(key));
      }
      std::memcpy(out.data() + layout.probabilities_at, batch.probabilities_data(),
                  rows * sizeof(float));
    } catch (const error&) {
      h.rows = 0;
      h.mass = 0;
      h.size = 0;
    }
  }
  remote::seal_reply(h, out, layout);
}

}  // namespace gear::transport
