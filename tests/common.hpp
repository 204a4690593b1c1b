#pragma once
// Shared by the host and gpu suites: the test spec, trajectory data whose every byte says where it
// came from, an independent reference of what a sampled row must hold, and statistics helpers.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <gear/gear.hpp>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gear_test {

// Columns of several sizes and element types: 16-byte-multiple steps, 4-byte steps and 1-byte
// steps, so that the gather's 16-, 4- and 1-byte paths are all exercised.
using spec = gear::spec<gear::column<"obs", float, 2, 3>,          // 24 B per step
                        gear::column<"action", std::int32_t>,      // 4 B
                        gear::column<"done", bool>,                // 1 B
                        gear::column<"image", std::uint8_t, 64>>;  // 64 B

/// The byte at (trajectory id, step, byte index within the step) of column c.
GEAR_HD inline std::uint8_t pattern(std::uint64_t id, std::int64_t step, std::int64_t byte,
                                    std::size_t c) {
  std::uint64_t h = id * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(step) * 0xC2B2AE3Dull ^
                    static_cast<std::uint64_t>(byte) * 0x165667B1ull ^ (c + 1) * 0x27D4EB2Full;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<std::uint8_t>(h);
}

/// Packed host data of a batch of trajectories with ids first_id, first_id + 1, ...
struct packed {
  std::vector<std::int64_t> lengths;
  std::vector<std::uint64_t> ids;
  std::vector<std::vector<std::byte>> columns;  // [c] packed steps, 16-byte aligned storage

  packed(std::uint64_t first_id, const std::vector<std::int64_t>& lens) : lengths(lens) {
    std::int64_t total = 0;
    for (auto l : lens) total += l;
    columns.resize(spec::num_columns);
    for (std::size_t c = 0; c < spec::num_columns; ++c) {
      const std::int64_t sb = spec::step_bytes[c];
      columns[c].resize(static_cast<std::size_t>(total * sb + 16));
      std::int64_t at = 0;
      for (std::size_t i = 0; i < lens.size(); ++i)
        for (std::int64_t t = 0; t < lens[i]; ++t, ++at)
          for (std::int64_t b = 0; b < sb; ++b) {
            std::uint8_t v = pattern(first_id + i, t, b, c);
            if (c == 2) v &= 1;  // bool column: keep values valid
            columns[c][static_cast<std::size_t>(at * sb + b)] = std::byte{v};
          }
    }
    for (std::size_t i = 0; i < lens.size(); ++i) ids.push_back(first_id + i);
  }

  /// The insert description of this data (host source).
  [[nodiscard]] gear::trajectories<spec> input() const {
    return {lengths,
            {gear::input(reinterpret_cast<const float*>(columns[0].data()), {2, 3}),
             gear::input(reinterpret_cast<const std::int32_t*>(columns[1].data())),
             gear::input(reinterpret_cast<const bool*>(columns[2].data())),
             gear::input(reinterpret_cast<const std::uint8_t*>(columns[3].data()), {64})},
            gear::memory_kind::host};
  }
};

/// The expected byte of column c of a sampled row, computed without plan_window: position j of a
/// row whose trajectory (id, len) was windowed with first step `first` (given; random anchors
/// draw it) holds step first + j (pad tail) or is shifted right (pad head).
struct row_reference {
  std::vector<std::int64_t> steps;  // [L] trajectory step at each position, -1 for padding
};

inline row_reference reference_row(const gear::window& w, std::int64_t len, std::int64_t first) {
  std::vector<std::int64_t> valid;
  for (std::int64_t j = 0; j < w.length; ++j)
    if (first + j >= 0 && first + j < len) valid.push_back(first + j);
  row_reference r{std::vector<std::int64_t>(static_cast<std::size_t>(w.length), -1)};
  const std::int64_t shift =
      w.padding == gear::pad::head ? w.length - std::int64_t(valid.size()) : 0;
  for (std::size_t k = 0; k < valid.size(); ++k) r.steps[shift + k] = valid[k];
  return r;
}

/// First step of a non-random window; for anchor::random the row's own first valid step is used
/// (checked separately to lie in the allowed range).
inline std::int64_t reference_first(const gear::window& w, std::int64_t len) {
  return w.from == gear::anchor::start ? w.offset : len - w.offset - w.length;
}

/// Which trajectory (id, length) each key names, as a test inserted them. Keyed by ticket: tickets
/// are never reused, so a stale key still finds the trajectory it named (use contains() to ask
/// whether it is stored).
struct model {
  std::map<std::uint64_t, std::pair<std::uint64_t, std::int64_t>> by_key;  // ticket -> id, length
  std::uint64_t next_id = 1;

  gear::key_owner owner{};  // of the keys recorded (each buffer's incarnation is its own)

  void record(const gear::key& k, std::uint64_t id, std::int64_t length) {
    by_key[k.ticket] = {id, length};
    owner = {k.shard, k.incarnation};
  }
  [[nodiscard]] std::uint64_t id(const gear::key& k) const {
    auto it = by_key.find(k.ticket);
    return it == by_key.end() ? ~std::uint64_t{0} : it->second.first;
  }
  [[nodiscard]] std::int64_t length(const gear::key& k) const {
    auto it = by_key.find(k.ticket);
    return it == by_key.end() ? -1 : it->second.second;
  }
  /// The key of `ticket` in the buffer whose keys were recorded.
  [[nodiscard]] gear::key key_of(std::uint64_t ticket) const {
    return gear::key{ticket, owner.shard, owner.incarnation};
  }
  /// check_batch against this model.
  [[nodiscard]] std::string check(const struct host_batch& h, const gear::window& w,
                                  std::vector<std::int64_t>* firsts = nullptr) const;
};

/// A sampled batch copied to host memory.
struct host_batch {
  std::int64_t rows = 0, length = 0;
  std::vector<std::vector<std::byte>> columns;  // [c] [B][L][step bytes]
  std::vector<std::uint8_t> mask;
  std::vector<gear::key> keys;
  std::vector<float> probabilities, weights;
};

/// Copies a host-memory batch (storage::host buffers) into a host_batch.
template <class Batch>
host_batch copy_host_batch(const Batch& b) {
  host_batch h;
  h.rows = b.batch_size();
  h.length = b.window_length();
  for (std::size_t c = 0; c < spec::num_columns; ++c) {
    const auto n = static_cast<std::size_t>(h.rows * h.length * spec::step_bytes[c]);
    h.columns.emplace_back(b.column_data(c), b.column_data(c) + n);
  }
  h.mask.assign(b.mask_data(), b.mask_data() + h.rows * h.length);
  h.keys.assign(b.keys_data(), b.keys_data() + h.rows);
  h.probabilities.assign(b.probabilities_data(), b.probabilities_data() + h.rows);
  h.weights.assign(b.weights_data(), b.weights_data() + h.rows);
  return h;
}

/// Checks every byte, mask entry and key of a batch against the reference. id_of(key) gives the
/// trajectory id stored under a key (or ~0 if the key is unknown), length_of(key) its length.
/// Returns "" if all is well, else what is wrong; firsts_out gets each row's first step.
template <class IdOf, class LengthOf>
std::string check_batch(const host_batch& h, const gear::window& w, IdOf id_of, LengthOf length_of,
                        std::vector<std::int64_t>* firsts_out = nullptr) {
  for (std::int64_t row = 0; row < h.rows; ++row) {
    const gear::key k = h.keys[static_cast<std::size_t>(row)];
    const std::uint64_t id = id_of(k);
    if (id == ~std::uint64_t{0}) return "row " + std::to_string(row) + ": unknown key";
    const std::int64_t len = length_of(k);
    std::vector<std::int64_t> candidates;
    if (w.from == gear::anchor::random) {
      const std::int64_t last = std::max(w.offset, len - w.length);
      for (std::int64_t f = w.offset; f <= last; ++f) candidates.push_back(f);
    } else {
      candidates.push_back(reference_first(w, len));
    }
    bool matched = false;
    for (std::int64_t first : candidates) {
      const row_reference ref = reference_row(w, len, first);
      bool ok = true;
      for (std::int64_t j = 0; ok && j < h.length; ++j) {
        const std::int64_t step = ref.steps[static_cast<std::size_t>(j)];
        ok = h.mask[static_cast<std::size_t>(row * h.length + j)] == (step >= 0 ? 1 : 0);
        for (std::size_t c = 0; ok && c < spec::num_columns; ++c) {
          const std::int64_t sb = spec::step_bytes[c];
          const std::byte* got = h.columns[c].data() + (row * h.length + j) * sb;
          for (std::int64_t b = 0; ok && b < sb; ++b) {
            std::uint8_t want = 0;
            if (step >= 0) want = pattern(id, step, b, c) & (c == 2 ? 1 : 0xFF);
            ok = std::to_integer<std::uint8_t>(got[b]) == want;
          }
        }
      }
      if (ok) {
        matched = true;
        if (firsts_out) firsts_out->push_back(first);
        break;
      }
    }
    if (!matched)
      return "row " + std::to_string(row) + " (trajectory " + std::to_string(id) + ", length " +
             std::to_string(len) + ") does not hold the expected window";
  }
  return "";
}

inline std::string model::check(const host_batch& h, const gear::window& w,
                                std::vector<std::int64_t>* firsts) const {
  return check_batch(
      h, w, [this](const gear::key& k) { return id(k); },
      [this](const gear::key& k) { return length(k); }, firsts);
}

/// The code of the gear::error f throws; errc{} (no code) if it throws none.
template <class F>
gear::errc code_of(F&& f) {
  try {
    f();
  } catch (const gear::error& e) {
    return e.code();
  }
  return gear::errc{};
}

/// Upper critical value of chi-square with df degrees of freedom at significance 0.001
/// (Wilson-Hilferty; accurate to well under 1% for df >= 10).
inline double chi2_critical_0001(double df) {
  const double z = 3.090232306167813;  // standard normal quantile at 0.999
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

/// Pearson chi-square statistic of counts against expected counts.
inline double chi2(const std::vector<double>& observed, const std::vector<double>& expected) {
  double s = 0;
  for (std::size_t i = 0; i < observed.size(); ++i) {
    const double d = observed[i] - expected[i];
    s += d * d / expected[i];
  }
  return s;
}

/// Pearson chi-square of observed counts against expected ones, pooling every cell expected below
/// 5 into one; returns {statistic, degrees of freedom}.
inline std::pair<double, double> pooled_chi2(const std::vector<double>& observed,
                                             const std::vector<double>& expected) {
  std::vector<double> o, e;
  double pool_o = 0, pool_e = 0;
  for (std::size_t i = 0; i < observed.size(); ++i) {
    if (expected[i] < 5) {
      pool_o += observed[i];
      pool_e += expected[i];
    } else {
      o.push_back(observed[i]);
      e.push_back(expected[i]);
    }
  }
  if (pool_e > 0) {
    o.push_back(pool_o);
    e.push_back(pool_e);
  }
  return {chi2(o, e), static_cast<double>(o.size()) - 1};
}

/// `keys` with incarnation `incarnation`: the same trajectories' keys in another buffer given the
/// same inserts (each buffer draws its own incarnation and refuses another's keys).
inline std::vector<gear::key> with_incarnation(std::vector<gear::key> keys,
                                               std::uint32_t incarnation) {
  for (gear::key& k : keys) k.incarnation = incarnation;
  return keys;
}

/// The (shard, ticket) of each key: what two buffers given the same inserts agree on.
inline std::vector<std::pair<std::uint32_t, std::uint64_t>> tickets_of(
    const std::vector<gear::key>& keys) {
  std::vector<std::pair<std::uint32_t, std::uint64_t>> out;
  for (const gear::key& k : keys) out.emplace_back(k.shard, k.ticket);
  return out;
}

}  // namespace gear_test
