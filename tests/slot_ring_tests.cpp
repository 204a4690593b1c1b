// Slot ring suite (host): gear::detail::slot_ring against a reference model over many random
// operation sequences (reserve, commit, abandon, remove; printed seeds), and the device mirror's
// rule gear::detail::apply_slot_record (host branch): records applied in any order, twice, or late
// give the mirror that applying them in (ticket, rank) order gives. Compiled by the plain C++
// compiler; needs no GPU.

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <gear/detail/buffer/mirror.hpp>
#include <gear/detail/buffer/slot_ring.hpp>
#include <gear/detail/modulus.hpp>
#include <gear/error.hpp>
#include <gear/key.hpp>
#include <gear/ref.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using gear::errc;
using gear::reservation;
using gear::detail::index_record;
using gear::detail::slot_mirror;
using gear::detail::slot_record;
using gear::detail::slot_ring;
using gear::detail::slot_state;

std::string str(std::uint64_t v) { return std::to_string(v); }

// ---- the reference model ----------------------------------------------------------------------

enum class fate { pending, committed, abandoned, removed };

/// What became of every ticket ever issued; a slot's state follows from the fate of the newest
/// ticket that maps to it.
struct model {
  model(std::int64_t cap, std::uint64_t buffer_id) : capacity(cap), buffer(buffer_id) {}

  std::int64_t capacity;
  std::uint64_t buffer;
  std::uint64_t next = 0;
  std::vector<fate> fates;              // [ticket]
  std::vector<std::int64_t> committed;  // [ticket] length given at commit (0 if never)

  [[nodiscard]] std::uint64_t cap() const { return static_cast<std::uint64_t>(capacity); }
  [[nodiscard]] bool reserved(std::int64_t slot) const {
    return static_cast<std::uint64_t>(slot) < next;
  }
  /// The newest ticket of `slot` (the largest t < next with t % capacity == slot).
  [[nodiscard]] std::uint64_t newest(std::int64_t slot) const {
    const auto s = static_cast<std::uint64_t>(slot);
    return s + (next - 1 - s) / cap() * cap();
  }
  [[nodiscard]] slot_state state(std::int64_t slot) const {
    if (!reserved(slot)) return slot_state::empty;
    switch (fates[newest(slot)]) {
      case fate::pending:
        return slot_state::pending;
      case fate::committed:
        return slot_state::committed;
      default:
        return slot_state::empty;
    }
  }
  [[nodiscard]] std::uint64_t ticket(std::int64_t slot) const {
    return reserved(slot) ? newest(slot) : 0;
  }
  [[nodiscard]] std::int64_t length(std::int64_t slot) const {
    return state(slot) == slot_state::committed ? committed[newest(slot)] : 0;
  }
  [[nodiscard]] std::int64_t live() const {
    std::int64_t n = 0;
    for (std::int64_t s = 0; s < capacity; ++s) n += state(s) == slot_state::committed;
    return n;
  }
  [[nodiscard]] bool is(std::uint64_t t, fate f) const {
    return t < next && newest(static_cast<std::int64_t>(t % cap())) == t && fates[t] == f;
  }
  [[nodiscard]] std::vector<std::uint64_t> live_tickets() const {
    std::vector<std::uint64_t> out;
    for (std::int64_t s = 0; s < capacity; ++s)
      if (state(s) == slot_state::committed) out.push_back(newest(s));
    return out;
  }

  // Transitions; each returns the records it must write.
  std::vector<slot_record> reserve(std::int64_t count) {
    std::vector<slot_record> out;
    for (std::int64_t i = 0; i < count; ++i, ++next) {
      fates.push_back(fate::pending);
      committed.push_back(0);
      out.push_back(slot_record::make(next, slot_record::pending));
    }
    return out;
  }
  std::vector<slot_record> commit(const reservation& r, const std::vector<std::int64_t>& lengths) {
    std::vector<slot_record> out;
    for (std::int64_t i = 0; i < r.count; ++i) {
      const std::uint64_t t = r.first_ticket + static_cast<std::uint64_t>(i);
      fates[t] = fate::committed;
      committed[t] = lengths[static_cast<std::size_t>(i)];
      out.push_back(slot_record::make(t, slot_record::committed, committed[t]));
    }
    return out;
  }
  std::vector<slot_record> abandon(std::uint64_t t) {
    if (!is(t, fate::pending)) return {};
    fates[t] = fate::abandoned;
    return {slot_record::make(t, slot_record::removed)};
  }
  std::vector<slot_record> remove(const std::vector<std::uint64_t>& tickets) {
    std::vector<slot_record> out;
    for (std::uint64_t t : tickets) {
      fates[t] = fate::removed;
      out.push_back(slot_record::make(t, slot_record::removed));
    }
    return out;
  }

  /// Why check_reservation must refuse r, or "" if it must accept it.
  [[nodiscard]] std::string refusal(const reservation& r) const {
    if (r.buffer != buffer || r.capacity != capacity) return "foreign";
    if (r.count < 1 || r.count > capacity) return "count";
    for (std::int64_t i = 0; i < r.count; ++i) {
      const std::uint64_t t = r.first_ticket + static_cast<std::uint64_t>(i);
      if (is(t, fate::pending)) continue;
      const std::string at = " (ticket " + str(t) + ")";
      if (t >= next) return "unissued" + at;
      if (newest(static_cast<std::int64_t>(t % cap())) != t) return "taken over" + at;
      if (fates[t] == fate::committed || fates[t] == fate::removed) return "committed" + at;
      return "abandoned" + at;
    }
    return "";
  }
};

bool same(const slot_record& a, const slot_record& b) {
  return a.order == b.order && a.length == b.length;
}

/// The first difference between the ring's observable state and the model's; "" if none.
std::string diff(const slot_ring& ring, const model& m) {
  auto say = [](const char* what, auto got, auto want) {
    return std::string(what) + ": ring " + std::to_string(got) + ", model " + std::to_string(want);
  };
  if (ring.capacity() != m.capacity) return say("capacity", ring.capacity(), m.capacity);
  if (ring.next_ticket() != m.next) return say("next_ticket", ring.next_ticket(), m.next);
  if (ring.live() != m.live()) return say("live", ring.live(), m.live());
  // The counts stats() reports: pending slots now; tickets ever committed, committed ones
  // overwritten by a reservation, committed ones removed.
  std::int64_t pending = 0;
  for (std::int64_t s = 0; s < m.capacity; ++s) pending += m.state(s) == slot_state::pending;
  if (ring.pending() != pending) return say("pending", ring.pending(), pending);
  std::uint64_t committed = 0, evicted = 0, removed = 0;
  for (std::uint64_t t = 0; t < m.next; ++t) {
    committed += m.fates[t] == fate::committed || m.fates[t] == fate::removed;
    removed += m.fates[t] == fate::removed;
    evicted += m.fates[t] == fate::committed &&
               m.newest(static_cast<std::int64_t>(t % m.cap())) != t;
  }
  if (ring.committed_total() != committed)
    return say("committed_total", ring.committed_total(), committed);
  if (ring.evicted_total() != evicted) return say("evicted_total", ring.evicted_total(), evicted);
  if (ring.removed_total() != removed) return say("removed_total", ring.removed_total(), removed);
  const auto occupied = static_cast<std::int64_t>(std::min(m.next, m.cap()));
  if (ring.occupied() != occupied) return say("occupied", ring.occupied(), occupied);
  for (std::int64_t s = 0; s < m.capacity; ++s) {
    const std::string at = " of slot " + std::to_string(s);
    if (ring.state(s) != m.state(s))
      return say(("state" + at).c_str(), int(ring.state(s)), int(m.state(s)));
    if (ring.ticket(s) != m.ticket(s))
      return say(("ticket" + at).c_str(), ring.ticket(s), m.ticket(s));
    if (ring.length(s) != m.length(s))
      return say(("length" + at).c_str(), ring.length(s), m.length(s));
    if (ring.tickets()[s] != m.ticket(s))
      return say(("tickets()" + at).c_str(), ring.tickets()[s], m.ticket(s));
    if (ring.lengths()[s] != m.length(s))
      return say(("lengths()" + at).c_str(), ring.lengths()[s], m.length(s));
  }
  // The dense index holds every committed slot once; a ring without it has none and lists no
  // change.
  if (!ring.indexed()) {
    if (ring.dense() != nullptr) return "dense index: kept by a ring made without it";
    if (ring.pending_index_changes() != 0) return "dense index: changes without an index";
  } else {
    std::vector<std::int64_t> listed(ring.dense(), ring.dense() + ring.live());
    std::sort(listed.begin(), listed.end());
    std::vector<std::int64_t> committed_slots;
    for (std::int64_t s = 0; s < m.capacity; ++s)
      if (m.state(s) == slot_state::committed) committed_slots.push_back(s);
    if (listed != committed_slots) return "dense index: not the committed slots";
  }
  // Tickets around the ring's current lap, a few old ones, and the ticket no reservation gets.
  std::vector<std::uint64_t> probes{0, 1, gear::no_ticket, gear::no_ticket - 1};
  const std::uint64_t from = m.next > 3 * m.cap() ? m.next - 3 * m.cap() : 0;
  for (std::uint64_t t = from; t < m.next + m.cap() + 2; ++t) probes.push_back(t);
  for (std::uint64_t t : probes) {
    const std::string at = " of ticket " + str(t);
    if (ring.holds(t) != m.is(t, fate::committed))
      return say(("holds" + at).c_str(), ring.holds(t), m.is(t, fate::committed));
    if (ring.is_pending(t) != m.is(t, fate::pending))
      return say(("is_pending" + at).c_str(), ring.is_pending(t), m.is(t, fate::pending));
  }
  for (std::int64_t count = 1; count <= m.capacity; ++count) {
    std::int64_t want = 0;
    for (std::int64_t i = 0; i < count; ++i)
      want += m.state(static_cast<std::int64_t>((m.next + std::uint64_t(i)) % m.cap())) ==
              slot_state::committed;
    if (ring.evictions(count) != want)
      return say(("evictions(" + std::to_string(count) + ")").c_str(), ring.evictions(count), want);
  }
  return "";
}

// ---- a host mirror ----------------------------------------------------------------------------

struct host_mirror {
  std::int64_t capacity;
  std::vector<std::uint64_t> words;  // lengths, tickets, order, dense: 4 * capacity words; live

  explicit host_mirror(std::int64_t cap)
      : capacity(cap), words(slot_mirror::bytes(cap) / sizeof(std::uint64_t), 0) {}
  [[nodiscard]] slot_mirror view() {
    return slot_mirror::at(reinterpret_cast<std::byte*>(words.data()), capacity);
  }
  void apply(const slot_record& r) { gear::detail::apply_slot_record(view(), capacity, r); }
  void apply(std::span<const slot_record> rs) {
    for (const auto& r : rs) apply(r);
  }
  bool operator==(const host_mirror&) const = default;
};

/// The first difference between a mirror that received every record the ring wrote and the
/// ring: per slot the newest record's ticket, length and (ticket, rank) order; "" if none.
std::string mirror_diff(host_mirror& mirror, const slot_ring& ring) {
  const slot_mirror v = mirror.view();
  for (std::int64_t s = 0; s < ring.capacity(); ++s) {
    std::uint64_t order = 0, ticket = 0;
    if (s < ring.occupied()) {
      ticket = ring.ticket(s);
      const std::uint64_t rank = ring.state(s) == slot_state::pending     ? slot_record::pending
                                 : ring.state(s) == slot_state::committed ? slot_record::committed
                                                                          : slot_record::removed;
      order = (ticket + 1) << 2 | rank;
    }
    if (v.order[s] != order || v.tickets[s] != ticket || v.lengths[s] != ring.length(s))
      return "slot " + std::to_string(s) + ": mirror (order " + str(v.order[s]) + ", ticket " +
             str(v.tickets[s]) + ", length " + std::to_string(v.lengths[s]) + "), ring (order " +
             str(order) + ", ticket " + str(ticket) + ", length " + std::to_string(ring.length(s)) +
             ")";
  }
  return "";
}

// ---- the random driver ------------------------------------------------------------------------

struct coverage {
  std::int64_t reserves = 0, commits = 0, abandons = 0, removals = 0, evictions = 0;
  std::int64_t foreign = 0, count = 0, unissued = 0, taken_over = 0, committed = 0, abandoned = 0;
};

class run {
 public:
  run(std::uint64_t seed, std::int64_t capacity, bool with_records, coverage& c,
      bool indexed = true)
      : gen_(seed),
        ring_(capacity, 40 + seed % 7, indexed),
        other_(capacity, 41 + seed % 7),
        m_{capacity, 40 + seed % 7},
        mirror_(capacity),
        dense_copy_(static_cast<std::size_t>(capacity), -1),
        records_(with_records),
        c_(c) {}

  void step() {
    const auto op = gen_() % 100;
    if (op < 30)
      reserve();
    else if (op < 55)
      commit();
    else if (op < 65)
      abandon();
    else if (op < 78)
      remove();
    else if (op < 90)
      check(forged());
    else if (!made_.empty())
      check(pick());
    const std::string d = diff(ring_, m_);
    REQUIRE_MESSAGE(d.empty(), d);
    // The dense index: its changes, applied to a copy every few steps (as the device's copy gets
    // them, one journal apply at a time), give the ring's own index. A ring without the index
    // hands out no change.
    const bool apply = gen_() % 3 == 0;
    if (apply && !ring_.indexed()) {
      index_record none{-1, -1};
      REQUIRE(ring_.take_index_changes(&none) == 0);
      REQUIRE(none.position == -1);
    } else if (apply) {
      std::vector<index_record> changes(static_cast<std::size_t>(ring_.pending_index_changes()));
      const std::int64_t n = ring_.take_index_changes(changes.data());
      REQUIRE(n <= static_cast<std::int64_t>(changes.size()));
      std::vector<bool> seen(dense_copy_.size());
      for (std::int64_t i = 0; i < n; ++i) {
        const auto pos = static_cast<std::size_t>(changes[static_cast<std::size_t>(i)].position);
        REQUIRE_FALSE(seen[pos]);  // one record per position: a parallel apply is exact
        seen[pos] = true;
        dense_copy_[pos] = changes[static_cast<std::size_t>(i)].slot;
      }
      for (std::int64_t p = 0; p < ring_.live(); ++p)
        REQUIRE(dense_copy_[static_cast<std::size_t>(p)] == ring_.dense()[p]);
    }
    if (records_) {
      const std::string md = mirror_diff(mirror_, ring_);
      REQUIRE_MESSAGE(md.empty(), md);
    }
  }

  [[nodiscard]] const std::vector<slot_record>& stream() const { return stream_; }
  [[nodiscard]] host_mirror& mirror() { return mirror_; }

 private:
  std::uint64_t below(std::uint64_t n) { return gen_() % n; }

  /// Space for `count` records followed by guards; null (the host-storage way) without records.
  slot_record* out(std::size_t count) {
    buf_.assign(count + 2, guard);
    return records_ ? buf_.data() : nullptr;
  }
  /// Checks the records written against the model's and that nothing was written past them.
  void written(const std::vector<slot_record>& want) {
    if (!records_) return;
    for (std::size_t i = 0; i < want.size(); ++i) {
      INFO("record " << i << ": ring order " << buf_[i].order << " length " << buf_[i].length
                     << ", model order " << want[i].order << " length " << want[i].length);
      REQUIRE(same(buf_[i], want[i]));
    }
    for (std::size_t i = want.size(); i < buf_.size(); ++i) REQUIRE(same(buf_[i], guard));
    stream_.insert(stream_.end(), want.begin(), want.end());
    mirror_.apply(want);
  }

  void reserve() {
    const std::int64_t count =
        1 + static_cast<std::int64_t>(below(3) == 0 ? below(m_.cap())
                                                    : below(std::min<std::uint64_t>(m_.cap(), 3)));
    const std::int64_t evicted = ring_.evictions(count);
    const reservation r = ring_.reserve(count, out(static_cast<std::size_t>(count)));
    REQUIRE(r.first_ticket == m_.next);
    REQUIRE(r.count == count);
    REQUIRE(r.capacity == m_.capacity);
    REQUIRE(r.buffer == m_.buffer);
    written(m_.reserve(count));
    made_.push_back(r);
    ++c_.reserves;
    c_.evictions += evicted;
  }

  reservation pick() {
    // Mostly recent reservations (likely still pending), sometimes any.
    const std::size_t n = made_.size();
    return below(4) != 0 ? made_[n - 1 - below(std::min<std::size_t>(n, 3))] : made_[below(n)];
  }

  /// check_reservation must accept r exactly when the model does; returns whether it did.
  bool check(const reservation& r) {
    const std::string why = m_.refusal(r);
    errc code{};
    std::string what;
    try {
      ring_.check_reservation(r);
    } catch (const gear::error& e) {
      code = e.code();
      what = e.what();
    }
    INFO("reservation (first ticket " << r.first_ticket << ", count " << r.count << ", capacity "
                                      << r.capacity << ", buffer " << r.buffer << "): " << what);
    if (why.empty()) {
      REQUIRE(code == errc{});
      return true;
    }
    INFO("the model refuses it: " << why);
    REQUIRE(code == errc::invalid_reservation);
    const auto at = why.find(" (ticket ");
    if (at != std::string::npos) REQUIRE(what.find(why.substr(at + 1)) != std::string::npos);
    if (why == "foreign") REQUIRE(what.find("another buffer") != std::string::npos);
    const std::string reason = why.substr(0, at);
    c_.foreign += reason == "foreign";
    c_.count += reason == "count";
    c_.unissued += reason == "unissued";
    c_.taken_over += reason == "taken over";
    c_.committed += reason == "committed";
    c_.abandoned += reason == "abandoned";
    return false;
  }

  /// A reservation made up, or made by another buffer, or one of ours with its fields altered.
  reservation forged() {
    switch (below(4)) {
      case 0: {  // the other ring's, at tickets our ring has pending too
        reservation r = other_.reserve(1 + static_cast<std::int64_t>(below(m_.cap())), nullptr);
        r.first_ticket = m_.next > 0 ? below(m_.next + 2) : 0;
        return r;
      }
      case 1: {
        reservation r = made_.empty() ? reservation{0, 1, m_.capacity, m_.buffer} : pick();
        if (below(2) == 0)
          r.buffer ^= 1 + below(8);
        else
          r.capacity += 1 + static_cast<std::int64_t>(below(3));
        return r;
      }
      case 2:
        return {below(m_.next + m_.cap() + 1),
                below(2) == 0 ? 0 : m_.capacity + 1 + static_cast<std::int64_t>(below(3)),
                m_.capacity, m_.buffer};
      default:
        return {below(m_.next + m_.cap() + 1), 1 + static_cast<std::int64_t>(below(m_.cap())),
                m_.capacity, m_.buffer};
    }
  }

  void commit() {
    if (made_.empty()) return;
    const reservation r = pick();
    if (!check(r)) return;  // commit is called only with a checked reservation
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(r.count));
    for (auto& l : lengths) l = 1 + static_cast<std::int64_t>(below(50));
    ring_.commit(r, lengths, out(lengths.size()));
    written(m_.commit(r, lengths));
    ++c_.commits;
  }

  void abandon() {
    std::uint64_t t = m_.next + 1;
    if (!made_.empty() && below(5) != 0) {
      const reservation r = pick();
      t = r.first_ticket + below(static_cast<std::uint64_t>(std::max<std::int64_t>(r.count, 1)));
    } else if (m_.next > 0) {
      t = below(m_.next + 2);
    }
    const bool want = m_.is(t, fate::pending);
    INFO("abandon ticket " << t);
    REQUIRE(ring_.abandon(t, out(1)) == want);
    written(m_.abandon(t));
    c_.abandons += want;
  }

  void remove() {
    std::vector<std::uint64_t> live = m_.live_tickets();
    if (live.empty()) return;
    std::shuffle(live.begin(), live.end(), gen_);
    live.resize(1 + below(std::min<std::size_t>(live.size(), 4)));
    ring_.remove(live, out(live.size()));
    written(m_.remove(live));
    c_.removals += static_cast<std::int64_t>(live.size());
  }

  static constexpr slot_record guard{0xDEADBEEFull, -7};
  std::mt19937_64 gen_;
  slot_ring ring_, other_;
  model m_;
  host_mirror mirror_;
  std::vector<std::int64_t> dense_copy_;  // the device's copy of the dense index
  bool records_;
  coverage& c_;
  std::vector<reservation> made_;
  std::vector<slot_record> buf_;
  std::vector<slot_record> stream_;
};

std::int64_t slot_of(const slot_record& r, std::int64_t capacity) {
  return static_cast<std::int64_t>(r.ticket() % static_cast<std::uint64_t>(capacity));
}

}  // namespace

// ---- records ----------------------------------------------------------------------------------

TEST_CASE("modulus: quotient and remainder equal / and % for every divisor shape") {
  // Divisors: small, powers of two and their neighbours, capacities, the top of the range; and
  // random ones of every bit length. Dividends: around multiples of the divisor, the ends of the
  // range, and random ones of every bit length.
  std::mt19937_64 g(11);
  std::vector<std::uint64_t> divisors = {1, 2, 3, 7, 1000, 16384, 16385, 1'000'003};
  for (int k = 1; k < 64; ++k) {
    const std::uint64_t p = std::uint64_t{1} << k;
    divisors.insert(divisors.end(), {p - 1, p, p + 1});
  }
  divisors.insert(divisors.end(), {~std::uint64_t{0}, ~std::uint64_t{0} - 1});
  for (int i = 0; i < 2000; ++i) divisors.push_back(std::max<std::uint64_t>(1, g() >> (g() % 64)));
  std::int64_t wrong = 0, checked = 0;
  for (const std::uint64_t d : divisors) {
    const gear::detail::modulus m(d);
    std::vector<std::uint64_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, ~std::uint64_t{0},
                                     ~std::uint64_t{0} - 1, ~std::uint64_t{0} - d};
    for (int i = 0; i < 300; ++i) ns.push_back(g() >> (g() % 64));
    for (const std::uint64_t n : ns) {
      ++checked;
      if (m(n) != n % d || m.quotient(n) != n / d) {
        if (wrong++ < 5) MESSAGE("d = " << d << ", n = " << n << ": " << m(n) << " vs " << n % d);
      }
    }
  }
  MESSAGE(checked << " quotients and remainders checked");
  CHECK(wrong == 0);
}

TEST_CASE("slot records carry ticket, rank and length, ordered by (ticket, rank)") {
  for (std::uint64_t t : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{12345},
                          (std::uint64_t{1} << 40) + 3, (std::uint64_t{1} << 62) - 3}) {
    CAPTURE(t);
    const slot_record p = slot_record::make(t, slot_record::pending, 9);
    const slot_record c = slot_record::make(t, slot_record::committed, 9);
    const slot_record x = slot_record::make(t, slot_record::removed, 9);
    CHECK(p.ticket() == t);
    CHECK(c.ticket() == t);
    CHECK(x.ticket() == t);
    CHECK(p.rank() == slot_record::pending);
    CHECK(c.rank() == slot_record::committed);
    CHECK(x.rank() == slot_record::removed);
    CHECK(p.length == 0);  // only committed records carry a length
    CHECK(c.length == 9);
    CHECK(x.length == 0);
    CHECK(p.order != 0);  // 0 is "never reserved"
    CHECK(p.order < c.order);
    CHECK(c.order < x.order);
    CHECK(x.order < slot_record::make(t + 1, slot_record::pending).order);
  }
}

// ---- the slot ring ----------------------------------------------------------------------------

TEST_CASE("slot ring: each way a reservation goes bad is refused, and the ring is as the model") {
  slot_ring ring(4, 11);
  model m{4, 11};
  auto same_as_model = [&] {
    const std::string d = diff(ring, m);
    CHECK_MESSAGE(d.empty(), d);
  };
  auto refused = [&](const reservation& r, const std::string& part) {
    try {
      ring.check_reservation(r);
      FAIL("check_reservation accepted a reservation the model refuses (" << m.refusal(r) << ")");
    } catch (const gear::error& e) {
      CHECK(e.code() == errc::invalid_reservation);
      CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, e.what());
    }
  };
  std::vector<slot_record> rec(8);
  same_as_model();
  CHECK(ring.occupied() == 0);

  const reservation r0 = ring.reserve(2, rec.data());  // tickets 0, 1
  CHECK(same(rec[1], slot_record::make(1, slot_record::pending)));
  m.reserve(2);
  same_as_model();
  CHECK_NOTHROW(ring.check_reservation(r0));
  CHECK(ring.is_pending(1));
  CHECK(ring.occupied() == 2);

  // Another buffer's reservation of the very same tickets.
  slot_ring other(4, 12);
  const reservation theirs = other.reserve(2, nullptr);
  CHECK(theirs.first_ticket == r0.first_ticket);
  refused(theirs, "another buffer");
  reservation resized = r0;
  resized.capacity = 8;
  refused(resized, "another buffer");
  refused({0, 0, 4, 11}, "holds 0 slots");
  refused({0, 5, 4, 11}, "holds 5 slots");
  refused({1, 2, 4, 11}, "(ticket 2)");  // ticket 2 not issued yet

  // Committed: once, then refused.
  const std::vector<std::int64_t> lens{3, 4};
  ring.commit(r0, lens, rec.data());
  CHECK(same(rec[0], slot_record::make(0, slot_record::committed, 3)));
  m.commit(r0, lens);
  same_as_model();
  CHECK(ring.live() == 2);
  CHECK(ring.holds(0));
  refused(r0, "(ticket 0)");

  // Abandoned: the slot empties, the ticket stays; abandoning again does nothing.
  const reservation r1 = ring.reserve(1, nullptr);  // ticket 2
  m.reserve(1);
  rec[0] = slot_record{};
  CHECK(ring.abandon(2, rec.data()));
  CHECK(same(rec[0], slot_record::make(2, slot_record::removed)));
  m.abandon(2);
  same_as_model();
  refused(r1, "(ticket 2)");
  rec[0] = slot_record{77, 77};
  CHECK_FALSE(ring.abandon(2, rec.data()));
  CHECK_FALSE(ring.abandon(0, rec.data()));  // committed, not pending
  CHECK_FALSE(ring.abandon(9, rec.data()));  // never issued
  CHECK(same(rec[0], slot_record{77, 77}));
  CHECK(ring.state(2) == slot_state::empty);
  CHECK(ring.ticket(2) == 2);

  // Taken over: ticket 3 is pending until ticket 7 reserves its slot again.
  const reservation r2 = ring.reserve(1, nullptr);  // ticket 3
  m.reserve(1);
  CHECK_NOTHROW(ring.check_reservation(r2));
  CHECK(ring.evictions(4) == 2);  // tickets 4..7 take slots 0..3: 0 and 1 hold trajectories
  ring.reserve(4, nullptr);
  m.reserve(4);
  same_as_model();
  refused(r2, "(ticket 3)");
  CHECK_FALSE(ring.is_pending(3));
  CHECK(ring.is_pending(7));
  CHECK(ring.live() == 0);
  CHECK_FALSE(ring.holds(0));

  // Removed: a committed trajectory goes, its slot stays empty until the ring comes round.
  const reservation r3{4, 2, 4, 11};
  ring.commit(r3, lens, nullptr);
  m.commit(r3, lens);
  const std::vector<std::uint64_t> gone{5};
  ring.remove(gone, rec.data());
  CHECK(same(rec[0], slot_record::make(5, slot_record::removed)));
  m.remove(gone);
  same_as_model();
  CHECK(ring.live() == 1);
  CHECK(ring.holds(4));
  CHECK_FALSE(ring.holds(5));
  CHECK(ring.length(1) == 0);
  CHECK(ring.ticket(1) == 5);
  refused(r3, "(ticket 4)");  // committed (and removed)
}

// buffer_core::journal_bytes leases room for 2 index changes per slot an operation changes (an
// insert into a full ring evicts and commits each): the bound every journal relies on.
TEST_CASE("slot ring: an operation on n slots changes at most 2n positions of the dense index") {
  std::mt19937_64 gen(99);
  for (const std::int64_t capacity : {1, 2, 4, 7, 64, 1000}) {
    slot_ring ring(capacity, 1);
    for (int step = 0; step < 400; ++step) {
      std::vector<index_record> out(static_cast<std::size_t>(capacity) + 1);
      (void)ring.take_index_changes(out.data());  // start from no pending change
      if (gen() % 3 != 0 || ring.live() == 0) {
        const auto n = 1 + static_cast<std::int64_t>(gen() % static_cast<std::uint64_t>(capacity));
        const reservation r = ring.reserve(n, nullptr);
        ring.commit(r, std::vector<std::int64_t>(static_cast<std::size_t>(n), 1), nullptr);
        CHECK(ring.pending_index_changes() <= 2 * n);
      } else {
        std::vector<std::uint64_t> gone;
        for (std::int64_t s = 0; s < capacity; ++s)
          if (ring.state(s) == slot_state::committed && gen() % 2 == 0)
            gone.push_back(ring.ticket(s));
        if (gone.empty()) continue;
        std::sort(gone.begin(), gone.end());
        ring.remove(gone, nullptr);
        CHECK(ring.pending_index_changes() <= static_cast<std::int64_t>(gone.size()));
      }
    }
  }
}

TEST_CASE("slot ring: random operation sequences agree with the reference model") {
  const std::uint64_t base = 20240611;
  const int runs = 2000, steps = 150;
  MESSAGE("slot ring sequences: seeds " << base << " .. " << base + runs - 1);
  coverage c;
  std::int64_t stream_records = 0;
  for (int i = 0; i < runs; ++i) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(i);
    constexpr std::int64_t capacities[] = {1, 2, 3, 4, 5, 8, 13};
    const std::int64_t capacity = capacities[seed % 7];
    const bool with_records = i % 4 != 0;  // every fourth run passes no record memory
    const bool indexed = i % 3 != 0;       // every third ring keeps no dense index
    INFO("seed " << seed << ", capacity " << capacity << (with_records ? "" : ", no records")
                 << (indexed ? "" : ", no dense index"));
    run r(seed, capacity, with_records, c, indexed);
    for (int s = 0; s < steps; ++s) {
      CAPTURE(s);
      r.step();
    }
    stream_records += static_cast<std::int64_t>(r.stream().size());
  }
  MESSAGE("reserves " << c.reserves << ", commits " << c.commits << ", abandons " << c.abandons
                      << ", removals " << c.removals << ", evictions " << c.evictions
                      << "; refused: foreign " << c.foreign << ", count " << c.count
                      << ", unissued " << c.unissued << ", taken over " << c.taken_over
                      << ", committed " << c.committed << ", abandoned " << c.abandoned
                      << "; records " << stream_records);
  // Every transition and every kind of refusal happened many times.
  for (std::int64_t n : {c.reserves, c.commits, c.abandons, c.removals, c.evictions, c.foreign,
                         c.count, c.unissued, c.taken_over, c.committed, c.abandoned})
    CHECK(n >= 500);
}

// ---- the mirror's record rule -----------------------------------------------------------------

TEST_CASE("mirror: late, repeated and reordered records give the in-order mirror") {
  const std::uint64_t base = 777000;
  const int runs = 1000;
  MESSAGE("mirror record streams: seeds " << base << " .. " << base + runs - 1);
  coverage c;
  std::int64_t late = 0;
  for (int i = 0; i < runs; ++i) {
    const std::uint64_t seed = base + static_cast<std::uint64_t>(i);
    const std::int64_t capacity = 1 + static_cast<std::int64_t>(seed % 9);
    INFO("seed " << seed << ", capacity " << capacity);
    run r(seed, capacity, true, c);
    for (int s = 0; s < 120; ++s) r.step();  // the ring's own records, applied as written
    std::vector<slot_record> records = r.stream();
    std::mt19937_64 gen(seed);

    // In (ticket, rank) order: the mirror the ring's records gave as they were written.
    std::vector<slot_record> sorted = records;
    std::sort(sorted.begin(), sorted.end(),
              [](const slot_record& a, const slot_record& b) { return a.order < b.order; });
    host_mirror in_order(capacity);
    in_order.apply(sorted);
    REQUIRE(in_order == r.mirror());

    // Any order gives the same mirror; a record applied again at any point changes nothing.
    for (int shuffle = 0; shuffle < 3; ++shuffle) {
      std::vector<slot_record> mixed = records;
      std::shuffle(mixed.begin(), mixed.end(), gen);
      host_mirror m(capacity);
      for (std::size_t k = 0; k < mixed.size(); ++k) {
        m.apply(mixed[k]);
        const host_mirror before = m;
        m.apply(mixed[gen() % (k + 1)]);
        REQUIRE(m == before);
      }
      REQUIRE(m == in_order);
    }
    host_mirror twice = in_order;
    twice.apply(records);
    REQUIRE(twice == in_order);

    // An older record of a slot never overwrites a newer one, whatever their ranks.
    for (int pair = 0; pair < 200 && records.size() >= 2; ++pair) {
      const slot_record a = records[gen() % records.size()];
      const slot_record b = records[gen() % records.size()];
      if (slot_of(a, capacity) != slot_of(b, capacity) || a.order == b.order) continue;
      const slot_record& older = a.order < b.order ? a : b;
      const slot_record& newer = a.order < b.order ? b : a;
      host_mirror m(capacity);
      m.apply(newer);
      const host_mirror after_newer = m;
      m.apply(older);
      REQUIRE(m == after_newer);
      const slot_mirror v = m.view();
      const std::int64_t s = slot_of(newer, capacity);
      REQUIRE(v.order[s] == newer.order);
      REQUIRE(v.tickets[s] == newer.ticket());
      REQUIRE(v.lengths[s] == newer.length);
      ++late;
    }
  }
  MESSAGE(late << " late records checked");
  CHECK(late >= 50000);
}

TEST_CASE("mirror: an old commit arriving after the slot's next reservation stays out") {
  host_mirror m(2);
  const slot_mirror v = m.view();
  m.apply(slot_record::make(0, slot_record::pending));
  m.apply(slot_record::make(2, slot_record::pending));  // ticket 2 takes slot 0 over
  m.apply(slot_record::make(0, slot_record::committed, 5));
  CHECK(v.tickets[0] == 2);
  CHECK(v.lengths[0] == 0);
  CHECK(v.order[0] == slot_record::make(2, slot_record::pending).order);
  m.apply(slot_record::make(2, slot_record::committed, 3));
  m.apply(slot_record::make(0, slot_record::removed));
  CHECK(v.tickets[0] == 2);
  CHECK(v.lengths[0] == 3);
  m.apply(slot_record::make(2, slot_record::removed));
  CHECK(v.lengths[0] == 0);
  CHECK(v.tickets[0] == 2);
  CHECK(v.order[1] == 0);  // slot 1 not written yet
  // A record lands only if its (ticket, rank) exceeds the slot's: not one of equal order.
  m.apply(slot_record::make(3, slot_record::committed, 4));
  m.apply(slot_record::make(3, slot_record::committed, 6));
  CHECK(v.tickets[1] == 3);
  CHECK(v.lengths[1] == 4);
  m.apply(slot_record::make(3, slot_record::removed));
  m.apply(slot_record::make(1, slot_record::committed, 2));
  m.apply(slot_record::make(3, slot_record::committed, 4));
  CHECK(v.tickets[1] == 3);
  CHECK(v.lengths[1] == 0);
  // Slot 1 of a fresh mirror was never written.
  host_mirror fresh(2);
  CHECK(fresh.view().order[1] == 0);
  CHECK(fresh.view().tickets[1] == 0);
  CHECK(fresh.view().lengths[1] == 0);
}

// Removal by runs of tickets (a queue's or a stack's rows): runs in any order, one across the
// ring's end, give the state that removal of the same tickets one by one gives, and one record
// per ticket, run after run.
TEST_CASE("slot ring: removal by runs matches removal by tickets, across the ring's end") {
  const auto filled = [] {
    slot_ring ring(5, 1);
    const reservation a = ring.reserve(3, nullptr);  // tickets 0..2, slots 0..2
    ring.commit(a, std::vector<std::int64_t>{1, 2, 3}, nullptr);
    const reservation b = ring.reserve(5, nullptr);  // tickets 3..7: slots 3, 4, then 0..2
    ring.commit(b, std::vector<std::int64_t>{4, 5, 6, 7, 8}, nullptr);
    return ring;
  };
  slot_ring by_runs = filled(), by_tickets = filled();
  REQUIRE(by_runs.live() == 5);
  // Tickets 6, 7 (slots 1, 2), then 3, 4, 5 (slots 3, 4, 0: across the ring's end).
  const std::vector<gear::ticket_run> runs{{6, 2}, {3, 3}};
  std::vector<slot_record> rec(5);
  by_runs.remove(runs, rec.data());
  const std::vector<std::uint64_t> order{6, 7, 3, 4, 5};
  for (std::size_t i = 0; i < order.size(); ++i)
    CHECK(same(rec[i], slot_record::make(order[i], slot_record::removed)));
  const std::vector<std::uint64_t> sorted{3, 4, 5, 6, 7};
  by_tickets.remove(sorted, nullptr);
  CHECK(by_runs.live() == 0);
  CHECK(by_tickets.live() == 0);
  for (std::int64_t s = 0; s < 5; ++s) {
    CHECK(by_runs.state(s) == by_tickets.state(s));
    CHECK(by_runs.length(s) == by_tickets.length(s));
    CHECK(by_runs.ticket(s) == by_tickets.ticket(s));
  }
  for (const std::uint64_t t : sorted) CHECK_FALSE(by_runs.holds(t));

  // Part of the ring: the dense index keeps exactly the slots left.
  slot_ring part = filled();
  const std::vector<gear::ticket_run> some{{4, 2}};  // slots 4 and 0
  part.remove(some, nullptr);
  CHECK(part.live() == 3);
  std::vector<std::int64_t> left(part.dense(), part.dense() + part.live());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::int64_t>{1, 2, 3});
}
