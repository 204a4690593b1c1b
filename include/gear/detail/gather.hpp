#pragma once
// Gathering sampled windows into dense rows: the description shared by the host loop (here) and
// the device kernel (gather.cuh), and the host loop itself.
//
// Row r of column c is the byte range [r * L * step_bytes, (r + 1) * L * step_bytes) of the
// column's output. Window resolution (plan_window) says which positions hold trajectory steps;
// the others are zero bytes with mask 0.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <gear/config.hpp>
#include <gear/key.hpp>
#include <gear/rng.hpp>
#include <gear/spec.hpp>
#include <gear/window.hpp>

namespace gear::detail {

/// Source and destination of one column.
struct gather_column {
  const std::byte* src = nullptr;  ///< column segment of slot 0
  std::int64_t slot_stride = 0;
  std::int64_t step_bytes = 0;
  std::byte* dst = nullptr;  ///< [batch][window length][step] output
};

/// Everything one gather needs; trivially copyable, passed to the kernel by value.
struct gather_args {
  gather_column columns[max_columns];
  int num_columns = 0;
  std::int64_t batch = 0;
  window win{};
  rng_draw draw{};
  const std::int64_t* slots = nullptr;     ///< [batch] from selection; -1 marks no row
  const std::int64_t* lengths = nullptr;   ///< slot metadata
  const std::uint64_t* tickets = nullptr;  ///< slot metadata
  std::uint32_t shard = 0;
  std::uint32_t incarnation = 0;
  std::uint8_t* mask = nullptr;  ///< out: [batch][window length]
  key* keys = nullptr;           ///< out: [batch]
  /// A gear::device_rng's words, or null: the kernel takes draw.call from here, and its last
  /// block to finish advances the call number (the gather is a sample's last kernel).
  draw_counter* counter = nullptr;
};

/// The window of row `row`, resolved against its trajectory (all padding for slot -1).
GEAR_HD inline window_plan row_plan(const gather_args& a, const rng_draw& draw, std::int64_t row,
                                    std::int64_t slot) {
  if (slot < 0) return {0, 0, 0};
  return plan_window(a.win, a.lengths[slot],
                     draw.extra(static_cast<std::uint64_t>(row), 0xFFFFFFFFu));
}
GEAR_HD inline window_plan row_plan(const gather_args& a, std::int64_t row, std::int64_t slot) {
  return row_plan(a, a.draw, row, slot);
}

/// The key of row `row`; slot -1 gives the ticket no_ticket, which no trajectory has.
GEAR_HD inline key row_key(const gather_args& a, std::int64_t slot) {
  if (slot < 0) return key{no_ticket, a.shard, a.incarnation};
  return key{a.tickets[slot], a.shard, a.incarnation};
}

/// The gather on the CPU.
inline void gather_on_host(const gather_args& a) {
  const std::int64_t len = a.win.length;
  for (std::int64_t row = 0; row < a.batch; ++row) {
    const std::int64_t slot = a.slots[row];
    const window_plan p = row_plan(a, row, slot);
    a.keys[row] = row_key(a, slot);
    std::uint8_t* mask = a.mask + row * len;
    for (std::int64_t t = 0; t < len; ++t) mask[t] = (t >= p.dst_pos && t < p.dst_pos + p.count);
    for (int c = 0; c < a.num_columns; ++c) {
      const gather_column& col = a.columns[c];
      std::byte* dst = col.dst + row * len * col.step_bytes;
      const std::int64_t head = p.dst_pos * col.step_bytes;
      const std::int64_t body = p.count * col.step_bytes;
      std::memset(dst, 0, static_cast<std::size_t>(head));
      if (body > 0)
        std::memcpy(dst + head, col.src + slot * col.slot_stride + p.src_step * col.step_bytes,
                    static_cast<std::size_t>(body));
      std::memset(dst + head + body, 0,
                  static_cast<std::size_t>(len * col.step_bytes - head - body));
    }
  }
}

}  // namespace gear::detail
