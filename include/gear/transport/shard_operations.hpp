#pragma once
// A shard's side of what remote learners ask (shard_server.hpp), on the local buffer it serves:
//
//   sample   select and gather the rows a learner asked for with the buffer's own selection
//            policy, and pack them as a sample reply (detail/remote/entry.hpp): the header with
//            the shard's selection mass and size when it selected, the columns, mask and keys of
//            every row (keys naming this shard and its incarnation), each row's probability
//            within the shard, the footer;
//   update   set the priorities of the keys of this incarnation, skipping and counting the rest;
//   erase    remove the trajectories of such keys, skipping and counting those already gone.
//
// A GPU buffer is called on the shard's own stream (shard_stream), synchronously: the progress
// thread answers once the work is done.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <gear/detail/buffer/core.hpp>
#include <gear/detail/cuda.hpp>
#include <gear/detail/remote/entry.hpp>
#include <gear/detail/remote/messages.hpp>
#include <gear/detail/remote/split.hpp>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <gear/priority_update.hpp>
#include <gear/rng.hpp>
#include <gear/select/concept.hpp>
#include <gear/strong_types.hpp>
#include <gear/transport/concept.hpp>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

namespace gear::transport {

template <class>
inline constexpr bool gpu_buffer_needs_backend = false;

/// The stream a shard calls a GPU buffer on (made at first use, on the buffer's device). A GPU
/// buffer needs <gear/gear.cuh> included before the transport headers (compiled by nvcc):
/// without it, for_buffer does not compile.
class shard_stream {
 public:
  shard_stream() = default;
  shard_stream(const shard_stream&) = delete;
  shard_stream& operator=(const shard_stream&) = delete;
  ~shard_stream() {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  /// The stream to pass `buffer`'s calls: for a GPU buffer this shard's own, made on the
  /// buffer's device the first time (throws errc::cuda_error); for a host buffer none.
  template <class Buffer>
  cuda::stream_ref for_buffer(const Buffer& buffer) {
    if constexpr (!Buffer::on_device) {
      (void)buffer;
      return detail::no_stream();
    } else {
#if defined(GEAR_DEVICE_BACKEND)
      if (stream_ == nullptr) {
        const detail::device_scope scope(buffer.device());
        GEAR_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      }
#else
      static_assert(gpu_buffer_needs_backend<Buffer>,
                    "a shard of a GPU buffer needs <gear/gear.cuh> included before the "
                    "transport headers, in a file compiled by nvcc");
#endif
      return cuda::stream_ref{stream_};
    }
  }

 private:
  cudaStream_t stream_{};
};

/// The buffer's selection mass: sum p^alpha for a policy with a sum tree (total()), else its
/// size (every trajectory weighs the same).
template <class Buffer>
double selection_mass(Buffer& buffer, shard_stream& s) {
  const auto& state = buffer.selection_state();
  if constexpr (Buffer::on_device && requires { state.total(s.for_buffer(buffer)); })
    return static_cast<double>(state.total(s.for_buffer(buffer)));  // the sum tree's root
  else if constexpr (!Buffer::on_device && requires { state.total(); })
    return static_cast<double>(state.total());
  else
    return static_cast<double>(buffer.size());
}

/// Packs the reply to `r` into `out` (layout.total_bytes), keys named by `owner`, sampling into
/// `scratch` (made anew only when its shape differs: a fresh batch per reply costs its allocation
/// and page faults every time). A buffer that cannot sample (empty, out of memory) answers with a
/// header of no rows: the reply is always sealed.
template <class Buffer>
void pack_sample_reply(Buffer& buffer, shard_stream& s, const detail::remote::sample_request& r,
                       const detail::remote::reply_layout& layout, key_owner owner,
                       std::span<std::byte> out,
                       std::optional<typename Buffer::batch_type>& scratch) {
  namespace remote = detail::remote;
  using spec = typename Buffer::spec_type;
  remote::reply_header h;
  h.request = r.request;
  h.incarnation = owner.incarnation;
  h.rows = r.rows;
  h.window = r.win.length;
  try {
    if (!scratch || scratch->batch_size() != r.rows || scratch->window_length() != r.win.length) {
      scratch.reset();
      scratch.emplace(buffer.make_batch(batch_size{r.rows}, window_length{r.win.length}));
    }
    auto& batch = *scratch;
    rng g{detail::remote::share_seed(r.seed, r.call)};
    h.mass = selection_mass(buffer, s);
    h.size = buffer.size();
    const auto rows = static_cast<std::size_t>(r.rows),
               window = static_cast<std::size_t>(r.win.length);
    // Where each part of the batch goes in the reply, and its bytes.
    struct part {
      std::int64_t at;
      const void* from;
      std::size_t bytes;
    };
    std::vector<part> parts;
    for (std::size_t c = 0; c < spec::num_columns; ++c)
      parts.push_back({layout.column_at[c], batch.column_data(c),
                       rows * window * static_cast<std::size_t>(spec::step_bytes[c])});
    parts.push_back({layout.mask_at, batch.mask_data(), rows * window});
    parts.push_back({layout.keys_at, batch.keys_data(), rows * sizeof(key)});
    parts.push_back({layout.probabilities_at, batch.probabilities_data(), rows * sizeof(float)});
    if constexpr (Buffer::on_device) {
      const cuda::stream_ref stream = s.for_buffer(buffer);
      buffer.sample_async(batch, r.win, g, stream);
      for (const part& p : parts)
        GEAR_CUDA_TRY(cudaMemcpyAsync(out.data() + p.at, p.from, p.bytes, cudaMemcpyDeviceToHost,
                                      stream.get()));
      GEAR_CUDA_TRY(cudaStreamSynchronize(stream.get()));
    } else {
      buffer.sample(batch, r.win, g);
      for (const part& p : parts) std::memcpy(out.data() + p.at, p.from, p.bytes);
    }
    for (std::size_t i = 0; i < rows; ++i) {  // as remote peers name them
      key k;
      std::byte* at = out.data() + layout.keys_at + i * sizeof(key);
      std::memcpy(&k, at, sizeof k);
      k.shard = owner.shard;
      k.incarnation = owner.incarnation;
      std::memcpy(at, &k, sizeof k);
    }
  } catch (...) {  // a gear::error (an empty buffer, say) or out of memory: a reply of no rows
    h.rows = 0;
    h.mass = 0;
    h.size = 0;
  }
  remote::seal_reply(h, out, layout);
}

/// Applies an update (or erase) of keys naming shard `remote` to the buffer, whose own keys are
/// named by `local`: pairs of another incarnation are stale, as are keys no longer stored. A
/// policy without priorities applies no update.
template <class Buffer>
detail::remote::update_result apply_update(Buffer& buffer, shard_stream& s,
                                           const detail::remote::update& u, key_owner remote,
                                           key_owner local) {
  detail::remote::update_result result{remote.incarnation, 0, 0};
  std::vector<key> keys;
  std::vector<float> priorities;
  for (const auto& e : u.entries) {
    if (e.incarnation != remote.incarnation) {
      ++result.stale;
      continue;
    }
    keys.push_back(key{e.ticket, local.shard, local.incarnation});
    priorities.push_back(e.priority);
  }
  if (u.erase) {
    // The live keys, each once; a key another caller removes meanwhile makes erase refuse them
    // all (nothing removed), so the live ones are looked for again, a bounded number of times.
    std::vector<key> distinct = keys;  // a key named twice is stale the second time
    std::sort(distinct.begin(), distinct.end(),
              [](const key& a, const key& b) { return a.ticket < b.ticket; });
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    for (std::size_t attempt = 0; attempt <= keys.size(); ++attempt) {
      std::vector<key> live;
      for (const key& k : distinct)
        if (buffer.contains(k)) live.push_back(k);
      try {
        if (!live.empty()) buffer.erase(live, s.for_buffer(buffer));
        result.applied = static_cast<std::int64_t>(live.size());
        result.stale += static_cast<std::int64_t>(keys.size() - live.size());
        return result;
      } catch (const error& e) {
        if (e.code() != errc::stale_key) break;
      }
    }
    result.stale += static_cast<std::int64_t>(keys.size());
    return result;
  }
  if constexpr (host_priority_update<typename Buffer::state_type>) {
    try {
      const priority_update_result r =
          buffer.update_priorities(keys, priorities, s.for_buffer(buffer));
      result.applied = r.applied;
      result.stale += r.stale;
    } catch (const error& e) {
      if (e.code() != errc::invalid_priority) {
        result.stale += static_cast<std::int64_t>(keys.size());
        return result;
      }
      // A priority this shard's policy cannot weigh (p^alpha past float's range at its alpha,
      // which the learner cannot know) refused the whole call: the others are applied one by
      // one, in order (a key named twice still takes its last priority), and it is skipped.
      for (std::size_t i = 0; i < keys.size(); ++i) try {
          const priority_update_result r =
              buffer.update_priorities(std::span(keys).subspan(i, 1),
                                       std::span(priorities).subspan(i, 1), s.for_buffer(buffer));
          result.applied += r.applied;
          result.stale += r.stale;
        } catch (const error&) {
          ++result.stale;
        }
    }
  } else {
    result.stale += static_cast<std::int64_t>(keys.size());
  }
  return result;
}

}  // namespace gear::transport
