#pragma once
// The exact draw of recency rows by a scan of the window (recency_scan's fallback, recency.hpp),
// for many rows of one sample on the host: a device state's mirror_rows (select_recency.cuh).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <gear/select/recency.hpp>
#include <vector>

namespace gear::detail {

/// recency_scan for many rows of one sample on the host: the window's candidates from the newest
/// down with the running sums of their weights, built once (O(window)), then each draw found by
/// binary search (O(log window)) where recency_scan walks the window again for each row. The
/// same additions in the same order, so the same slot as recency_scan for every draw.
class recency_scan_table {
 public:
  /// Throws std::bad_alloc.
  void build(const slot_table& t, const recency_window& w) {
    sums_.clear();
    slots_.clear();
    const candidate_slots c{t.lengths, t.tickets, static_cast<std::uint64_t>(t.capacity)};
    const std::uint64_t top = c.newest_end(w);
    newest_ = -1;
    if (top == 0) return;  // no candidate
    newest_ = static_cast<std::int64_t>((top - 1) % c.capacity);
    total_ = c.sum_below(w, top);
    double sum = 0;
    for (std::uint64_t ticket = top; ticket-- > w.first;) {
      const double x = c.weight(w, top, ticket);
      if (x <= 0) continue;
      sum += x;
      sums_.push_back(sum);
      slots_.push_back(static_cast<std::int64_t>(ticket % c.capacity));
    }
  }
  /// The slot recency_scan(t, w, u) returns for the table's t and w.
  [[nodiscard]] std::int64_t pick(double u) const {
    if (slots_.empty()) return newest_;
    const auto at = std::upper_bound(sums_.begin(), sums_.end(), u * total_) - sums_.begin();
    return at == static_cast<std::ptrdiff_t>(slots_.size()) ? slots_.back()
                                                             : slots_[static_cast<std::size_t>(at)];
  }

 private:
  std::vector<double> sums_;
  std::vector<std::int64_t> slots_;
  double total_ = 0;
  std::int64_t newest_ = -1;
};

}  // namespace gear::detail

