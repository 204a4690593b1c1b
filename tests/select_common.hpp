#pragma once
// Shared by the selection suites (select_host_tests.cpp, select_gpu_tests.cu): a one-column spec,
// inserting numbered trajectories, and the chi-square check with its stated significance.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <gear/gear.hpp>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common.hpp"

namespace select_test {

/// One int32 per step; trajectories of one step whose value is their number.
using spec = gear::spec<gear::column<"id", std::int32_t>>;

/// Inserts trajectories numbered first, first + 1, ... (count of them) and returns their keys.
template <class Buffer, class... Stream>
std::vector<gear::key> insert_ids(Buffer& buf, std::int32_t first, std::int64_t count,
                                  Stream... stream) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(count));
  std::iota(ids.begin(), ids.end(), first);
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(count), 1);
  std::vector<gear::key> keys(static_cast<std::size_t>(count));
  buf.insert({lengths, {gear::input(ids.data())}, gear::memory_kind::host}, keys, stream...);
  return keys;
}

/// The queue and stack model tests' world: a host buffer of one-step trajectories, the committed
/// tickets it should hold (`live`) and up to three open writers. change() makes one random change
/// that is not a sample (inserts of 1 to 3, an erase, a writer opened, abandoned or committed) and
/// keeps `live` in step, evictions included; next() is the ticket a queue (oldest_first) or a
/// stack returns next.
template <class Buffer>
struct queue_world {
  using writer_type = decltype(std::declval<Buffer&>().make_writer());
  Buffer& buf;
  std::set<std::uint64_t> live;
  std::vector<std::unique_ptr<writer_type>> open;
  std::uint32_t incarnation = 0;  // the buffer's keys' (each buffer draws its own)

  void change(std::mt19937_64& gen) {
    switch (gen() % 5) {
      case 0:
      case 1: {
        const auto n =
            std::min<std::int64_t>(buf.capacity(), 1 + static_cast<std::int64_t>(gen() % 3));
        for (const auto& k : insert_ids(buf, 0, n)) {
          live.insert(k.ticket);
          incarnation = k.incarnation;
        }
        break;
      }
      case 2:
        if (!live.empty()) {
          auto it = live.begin();
          std::advance(it, static_cast<long>(gen() % live.size()));
          const gear::key k{*it, 0, incarnation};
          buf.erase(std::span<const gear::key>(&k, 1));
          live.erase(it);
        }
        break;
      case 3:
        if (open.size() < 3)
          open.push_back(std::make_unique<writer_type>(buf.make_writer()));
        else
          open.erase(open.begin());  // abandoned
        break;
      default:
        if (!open.empty()) {
          const std::int32_t v = 0;
          try {
            open.back()->append(&v);
            const gear::key k = open.back()->commit();
            live.insert(k.ticket);
            incarnation = k.incarnation;
          } catch (const gear::error& e) {  // the ring came round: anything else is a failure
            if (e.code() != gear::errc::invalid_reservation) throw;
          }
          open.pop_back();
        }
    }
    evict();
  }
  /// Whatever the ring evicted is gone from the model too.
  void evict() {
    const std::uint64_t issued = buf.tickets_issued();
    const auto cap = static_cast<std::uint64_t>(buf.capacity());
    live.erase(live.begin(), live.lower_bound(issued > cap ? issued - cap : 0));
  }
  [[nodiscard]] std::uint64_t next(bool oldest_first) const {
    return oldest_first ? *live.begin() : *live.rbegin();
  }
};

/// The outcome of a chi-square goodness-of-fit test at significance 0.001.
struct chi2_result {
  double statistic = 0, critical = 0;
  double df = 0;
  [[nodiscard]] bool rejects() const { return statistic > critical; }
};

/// Tests counts (over cells) against probabilities (summing to 1) for `draws` draws. Cells with
/// an expected count below 5 are pooled into one.
inline chi2_result chi2_test(const std::vector<double>& counts, const std::vector<double>& probs,
                             double draws) {
  std::vector<double> o, e;
  double pooled_o = 0, pooled_e = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double ex = probs[i] * draws;
    if (ex < 5) {
      pooled_o += counts[i];
      pooled_e += ex;
      continue;
    }
    o.push_back(counts[i]);
    e.push_back(ex);
  }
  if (pooled_e > 0) {
    o.push_back(pooled_o);
    e.push_back(pooled_e);
  }
  chi2_result r;
  r.df = static_cast<double>(o.size()) - 1;
  r.statistic = gear_test::chi2(o, e);
  r.critical = gear_test::chi2_critical_0001(r.df);
  return r;
}

/// Random priorities in [0.05, 20), some exactly 0, from a printed seed.
inline std::vector<float> random_priorities(std::uint64_t seed, std::size_t n, bool zeros = true) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> lg(std::log(0.05), std::log(20.0));
  std::vector<float> p(n);
  for (std::size_t i = 0; i < n; ++i)
    p[i] = zeros && i % 17 == 3 ? 0.0f : static_cast<float>(std::exp(lg(gen)));
  return p;
}

/// P(i) = p_i^alpha / sum p^alpha over the given keys' priorities (index = position in keys).
inline std::vector<double> exact_probabilities(const std::vector<float>& p, double alpha) {
  std::vector<double> out(p.size());
  double sum = 0;
  for (std::size_t i = 0; i < p.size(); ++i) sum += out[i] = std::pow(double(p[i]), alpha);
  for (auto& x : out) x /= sum;
  return out;
}

}  // namespace select_test
