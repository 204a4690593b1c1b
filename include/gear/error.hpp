#pragma once
// gear::error: the exception type gear throws, with a machine-readable code. Host memory for the
// buffer's own bookkeeping (the standard containers of its tables and plans) that cannot be had
// throws std::bad_alloc as those containers do; pinned and device memory throw
// errc::out_of_memory.
//
// Every operation validates its input and acquires what it needs before it changes anything, so a
// thrown gear::error (or std::bad_alloc) leaves the buffer exactly as it was; the one exception is
// a failure to enqueue GPU work after the buffer changed, which makes the buffer refuse every
// later call with errc::cuda_error (replay_buffer.hpp).

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gear {

/// What went wrong, for programs that react to errors (retry, resize, drop a key).
enum class errc {
  invalid_argument = 1,  ///< a parameter outside its documented range (capacity 0, ...)
  empty_buffer,          ///< sampling from a buffer with no committed trajectory
  not_enough_items,      ///< more items without replacement than the buffer holds
  stale_key,             ///< the key's slot has since been overwritten or removed
  key_out_of_range,      ///< the key names a slot or shard that does not exist
  empty_trajectory,      ///< a trajectory of length 0 (or negative)
  trajectory_too_long,   ///< a trajectory longer than max_length
  wrong_type,            ///< a column given with another element type than the spec's
  wrong_shape,           ///< a column given with another per-step shape than the spec's
  null_pointer,          ///< a required pointer is null
  misaligned_pointer,    ///< a pointer not aligned to its element type
  wrong_memory,          ///< host memory where device memory is needed, or the other way round
  empty_window,          ///< a window of length 0 or less
  window_out_of_range,   ///< a window offset that no trajectory can reach
  batch_mismatch,        ///< the output batch does not fit the request
  writer_full,           ///< a step appended past max_length
  invalid_reservation,   ///< commit of a reservation that was overwritten or already committed
  invalid_priority,      ///< a NaN, negative or infinite priority
  no_device,             ///< GPU storage asked for on a machine without a usable GPU
  out_of_memory,         ///< an allocation failed
  cuda_error,            ///< a CUDA runtime call or kernel launch failed
  transport_error,       ///< a local transport call (libfabric, a socket) failed
  peer_mismatch,         ///< a peer that does not fit: another spec, policy, provider or version
  peer_lost,             ///< a peer died, or did not answer by the deadline (the message names it)
  timeout,               ///< a local wait (credits, a flush) passed its deadline
};

/// A short, stable name for each code ("stale_key", ...).
constexpr std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::empty_buffer:
      return "empty_buffer";
    case errc::not_enough_items:
      return "not_enough_items";
    case errc::stale_key:
      return "stale_key";
    case errc::key_out_of_range:
      return "key_out_of_range";
    case errc::empty_trajectory:
      return "empty_trajectory";
    case errc::trajectory_too_long:
      return "trajectory_too_long";
    case errc::wrong_type:
      return "wrong_type";
    case errc::wrong_shape:
      return "wrong_shape";
    case errc::null_pointer:
      return "null_pointer";
    case errc::misaligned_pointer:
      return "misaligned_pointer";
    case errc::wrong_memory:
      return "wrong_memory";
    case errc::empty_window:
      return "empty_window";
    case errc::window_out_of_range:
      return "window_out_of_range";
    case errc::batch_mismatch:
      return "batch_mismatch";
    case errc::writer_full:
      return "writer_full";
    case errc::invalid_reservation:
      return "invalid_reservation";
    case errc::invalid_priority:
      return "invalid_priority";
    case errc::no_device:
      return "no_device";
    case errc::out_of_memory:
      return "out_of_memory";
    case errc::cuda_error:
      return "cuda_error";
    case errc::transport_error:
      return "transport_error";
    case errc::peer_mismatch:
      return "peer_mismatch";
    case errc::peer_lost:
      return "peer_lost";
    case errc::timeout:
      return "timeout";
  }
  return "unknown";
}

/// The exception gear throws. what() reads "gear: <code>: <detail>".
class error : public std::runtime_error {
 public:
  error(errc code, const std::string& detail)
      : std::runtime_error("gear: " + std::string(to_string(code)) + ": " + detail), code_(code) {}

  /// The machine-readable reason.
  [[nodiscard]] errc code() const noexcept { return code_; }

 private:
  errc code_;
};

namespace detail {

/// Throws errc::null_pointer for a span of `count` elements whose data is null (a span that
/// breaks its own precondition: caught here rather than dereferenced).
inline void check_not_null(const void* data, std::size_t count, const char* what) {
  if (count != 0 && data == nullptr) [[unlikely]]
    throw error(errc::null_pointer,
                std::string(what) + " is null with " + std::to_string(count) + " elements");
}

/// *owned, or errc::invalid_argument for an object moved from (its owned state gone): what
/// a call on a replay_buffer moved from throws.
template <class Owned>
[[nodiscard]] Owned& moved_from_check(Owned* owned, const char* what) {
  if (owned == nullptr) [[unlikely]]
    throw error(errc::invalid_argument,
                std::string(what) + " was moved from: use the object it was moved into");
  return *owned;
}

}  // namespace detail

}  // namespace gear

/// Throws gear::error(code, message) unless condition holds. The message expression is evaluated
/// only on failure, so checks in hot paths cost a comparison and build no string.
#define GEAR_REQUIRE(condition, code, message) \
  do {                                         \
    if (!(condition)) [[unlikely]]             \
      throw ::gear::error((code), (message));  \
  } while (0)
