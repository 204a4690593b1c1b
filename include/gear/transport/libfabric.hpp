#pragma once
// gear::transport::libfabric: the only header of gear that includes libfabric (<rdma/*.h>); link
// gear::libfabric to use it. It holds the fabric endpoint the remote transport is built on: one
// RDM endpoint with its completion queue and address vector, memory registration that obeys what
// the provider asks (mr_mode), one-sided writes that publish with remote CQ data, and two-sided
// control messages into a multi-receive buffer. The protocol over it (what is written where, and
// how the receiver checks it) is fabric-free, in detail/remote/.
//
// Providers by configuration string, with no code change: "tcp;ofi_rxm" (the default; any IP
// network), "shm" (processes on one host), "verbs;ofi_rxm", "efa" on clusters. What libfabric
// 1.17 does not enforce (see the README's transport section): on shm with CMA, one-sided
// accesses without remote CQ data are not checked against the memory key, so gear checks every
// address and length against the region granted before it posts (gear's writes all carry CQ
// data, which shm checks: a closed registration refuses them); on tcp one refused access kills
// the pair.
//
// Threads: an endpoint is used by one thread at a time (FI_THREAD_DOMAIN); progress is manual:
// completions, and the first contact with a peer, advance only while someone calls poll().
// Processes that use libfabric and fork must fork before their first fi_* call.

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/random.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <gear/error.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#if FI_MAJOR_VERSION < 1 || (FI_MAJOR_VERSION == 1 && FI_MINOR_VERSION < 17)
#error "gear::transport::libfabric needs libfabric 1.17 or newer"
#endif

namespace gear::transport {

/// How to reach the fabric.
struct libfabric_config {
  std::string provider = "tcp;ofi_rxm";  ///< libfabric provider name, as fi_info -p takes it
  std::string node = "127.0.0.1";        ///< the interface address (IP providers; not shm)
};

/// Which shard an actor sends each trajectory to.
enum class routing : std::uint8_t {
  round_robin,  ///< the next shard in turn
  local_first,  ///< in turn among the shards on this host (by host name), else among all
  by_hash,      ///< by a hash of the trajectory's bytes: the same trajectory, the same shard
};

/// The transport policy of one logical buffer sharded across processes and machines
/// (<gear/distributed.hpp>): replay_buffer<Spec, Storage, Selection, transport::libfabric> is a
/// shard (it serves its storage to remote actors and learners) and, with storage::none, a pure
/// actor or learner (it holds nothing and reaches the shards named in `shards`).
struct libfabric {
  static constexpr bool remote = true;

  libfabric_config fabric;
  std::string token;  ///< the job's handshake token: shards refuse clients without it
  /// Every wait a call makes (a welcome, ring space, a sample's replies, an update's answer).
  std::chrono::milliseconds deadline{30000};

  // ---- a shard ----
  std::uint32_t shard = 0;                ///< its id, unique in the job, below 4096
  std::uint32_t block_bytes = 64 * 1024;  ///< staging block: a power of two in [4 KiB, 16 MiB]
  std::uint32_t max_ring_blocks = 256;    ///< staging blocks an actor may ask for
  std::uint32_t max_peers = 64;           ///< actors and learners it serves

  // ---- a client (storage::none) ----
  std::vector<std::vector<std::byte>> shards;  ///< every shard's address blob
  routing route = routing::round_robin;        ///< where inserts go
  std::uint32_t ring_blocks = 64;              ///< staging blocks asked of each shard
  std::int64_t max_batch = 1024;               ///< rows of one sample, at most
  std::int64_t max_window = 64;                ///< steps of its window, at most
  /// A shard found lost (no answer by the deadline) is left out from then on: later samples go
  /// on over the others, probabilities renormalised over their union; its keys' updates and
  /// erases count as stale. The sample, update or erase that finds it lost still throws
  /// errc::peer_lost; size() and a sample's status requests go on without it. False: every call
  /// needs every shard.
  bool skip_lost_shards = false;
  /// With this many samples or more in flight and unanswered, a new one's requests wait and go
  /// this many samples' to a shard in one message (remote_learner's option). 1: never wait.
  std::size_t requests_per_message = 4;

  [[nodiscard]] std::uint32_t shard_id() const noexcept { return shard; }
  [[nodiscard]] std::uint32_t shard_count() const noexcept {
    return shards.empty() ? 1 : static_cast<std::uint32_t>(shards.size());
  }
};

namespace fabric {

/// True for a provider whose endpoint is one shared region its peers all write into under the
/// region's lock (shm): a peer stopped or killed in the middle of a write there holds up every
/// other's writes to that endpoint, so such peers get endpoints of their own (shard_peer.hpp,
/// remote_client.hpp).
inline bool shared_region(const std::string& provider) noexcept {
  return provider.rfind("shm", 0) == 0;
}

/// Throws errc::transport_error for a failed fi_* call, naming the call, the provider's message
/// and what it was doing.
[[noreturn]] inline void fail(const char* call, long rc, const std::string& context) {
  throw error(errc::transport_error,
              std::string(call) + " failed: " + fi_strerror(static_cast<int>(rc < 0 ? -rc : rc)) +
                  " (" + context + ")");
}

/// A registered memory region: what a peer needs to write into it (remote_address, key), and
/// what a local post from it passes (desc).
struct region {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  std::uint64_t key = 0;
  std::uint64_t remote_address = 0;  ///< where a peer's offset 0 is: base (FI_MR_VIRT_ADDR) or 0
  void* desc = nullptr;
  fid_mr* mr = nullptr;
};

/// One completion, as poll() hands it on.
struct completion {
  enum class kind { sent, written, received, remote_write, failed } what = kind::failed;
  void* context = nullptr;             ///< the post's context (not for remote writes)
  std::uint64_t data = 0;              ///< remote CQ data of a remote write
  std::span<const std::byte> message;  ///< a received message, inside the receive buffer
  int error = 0;                       ///< for kind::failed: the fi_errno code
  std::string detail;                  ///< for kind::failed: the provider's message
};

class endpoint {
 public:
  /// Opens an RDM endpoint on `config.provider`. Throws errc::transport_error naming the
  /// provider when it is not there or refuses the hints.
  explicit endpoint(const libfabric_config& config) : provider_(config.provider) {
    fi_info* hints = fi_allocinfo();
    if (hints == nullptr) fail("fi_allocinfo", -FI_ENOMEM, provider_);
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps =
        FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_MULTI_RECV;
    hints->mode = 0;  // gear's operation contexts are its own pointers, not fi_context storage
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->domain_attr->cq_data_size = 4;
    hints->fabric_attr->prov_name = strdup(config.provider.c_str());
    const bool ip = config.provider.rfind("shm", 0) != 0;
    const int rc = fi_getinfo(FI_VERSION(1, 17), ip ? config.node.c_str() : nullptr, nullptr,
                              ip ? FI_SOURCE : 0, hints, &info_);
    fi_freeinfo(hints);
    if (rc != 0) fail("fi_getinfo", rc, "provider '" + provider_ + "'");
    try {
      open();
    } catch (...) {
      close();
      throw;
    }
  }
  ~endpoint() { close(); }
  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;

  [[nodiscard]] const std::string& provider() const noexcept { return provider_; }
  [[nodiscard]] std::uint32_t address_format() const noexcept { return info_->addr_format; }
  [[nodiscard]] std::uint64_t mr_mode() const noexcept { return info_->domain_attr->mr_mode; }
  /// Bytes a writedata may carry as remote CQ data (4 on verbs, 8 on tcp and shm).
  [[nodiscard]] std::size_t cq_data_size() const noexcept {
    return info_->domain_attr->cq_data_size;
  }
  /// This endpoint's address (fi_getname), for the address blob.
  [[nodiscard]] const std::vector<std::uint8_t>& name() const noexcept { return name_; }

  /// True when `address` has the shape of an address of this provider's format: a string ends in
  /// a NUL, others are as long as this endpoint's (fi_av_insert reads that many bytes).
  [[nodiscard]] bool fits_address(std::span<const std::uint8_t> address) const noexcept {
    if (address.empty()) return false;
    return address_format() == FI_ADDR_STR
               ? std::find(address.begin(), address.end(), std::uint8_t{0}) != address.end()
               : address.size() == name_.size();
  }

  /// Adds a peer's address (its name()); returns its handle for posts.
  fi_addr_t insert_peer(std::span<const std::uint8_t> address) {
    fi_addr_t peer = FI_ADDR_UNSPEC;
    const int n = fi_av_insert(av_, address.data(), 1, &peer, 0, nullptr);
    if (n != 1) fail("fi_av_insert", n < 0 ? n : -FI_EINVAL, "a peer address");
    return peer;
  }

  /// Registers [base, base + bytes) for `access` (FI_REMOTE_WRITE for a region peers write, the
  /// local bits for one this side posts from: both may be given). Throws errc::transport_error.
  region register_memory(void* base, std::size_t bytes, std::uint64_t access) {
    // Room to record it first (never a registration left unrecorded), 16 at once: registrations
    // per sample then allocate nothing.
    if (regions_.size() == regions_.capacity()) regions_.reserve(2 * regions_.size() + 16);
    region r;
    r.base = static_cast<std::byte*>(base);
    r.bytes = bytes;
    const std::uint64_t mode = mr_mode();
    for (int attempt = 0;; ++attempt) {
      const std::uint64_t wanted = (mode & FI_MR_PROV_KEY) != 0 ? 0 : draw_key();
      const int rc = fi_mr_reg(domain_, base, bytes, access, 0, wanted, 0, &r.mr, nullptr);
      if (rc == -FI_ENOKEY && attempt < 8) continue;  // a key in use: draw another
      if (rc != 0) fail("fi_mr_reg", rc, std::to_string(bytes) + " bytes on " + provider_);
      break;
    }
    if ((mode & FI_MR_ENDPOINT) != 0) {
      int rc = fi_mr_bind(r.mr, &ep_->fid, 0);
      if (rc == 0) rc = fi_mr_enable(r.mr);
      if (rc != 0) {
        (void)fi_close(&r.mr->fid);
        fail("fi_mr_bind", rc, provider_);
      }
    }
    r.key = fi_mr_key(r.mr);
    r.desc = fi_mr_desc(r.mr);
    r.remote_address = (mode & FI_MR_VIRT_ADDR) != 0 ? reinterpret_cast<std::uint64_t>(base) : 0;
    regions_.push_back(r.mr);
    return r;
  }
  /// Ends a registration (peers' later accesses to it fail, on providers that check); those not
  /// ended close with the endpoint.
  void deregister(region& r) noexcept {
    if (r.mr != nullptr) {
      std::erase(regions_, r.mr);
      (void)fi_close(&r.mr->fid);
    }
    r = region{};
  }

  /// Writes `bytes` from `local` at `offset` to the peer's `remote_address` (its region's
  /// remote_address plus an offset the caller has checked against the region granted), with
  /// remote CQ data `data`. False when the provider asks to try again (-FI_EAGAIN): poll, retry.
  bool try_writedata(const region& local, std::size_t offset, std::size_t bytes, fi_addr_t peer,
                     std::uint64_t remote_address, std::uint64_t key, std::uint64_t data,
                     void* context) {
    const ssize_t rc = fi_writedata(ep_, local.base + offset, bytes, local.desc, data, peer,
                                    remote_address, key, context);
    if (rc == -FI_EAGAIN) return false;
    if (rc != 0) fail("fi_writedata", rc, std::to_string(bytes) + " bytes on " + provider_);
    return true;
  }
  /// One segment of a gathered write (try_writemsg): `bytes` at `offset` in the local region,
  /// to the peer's `remote_address` in the region of `key` (checked by the caller, as for
  /// try_writedata).
  struct write_segment {
    std::size_t offset = 0, bytes = 0;
    std::uint64_t remote_address = 0, key = 0;
  };
  /// Segments one write may carry: what the provider takes on both sides, at least 1 and at
  /// most max_write_segments.
  [[nodiscard]] std::size_t write_segments() const noexcept {
    const std::size_t limit = std::min(info_->tx_attr->iov_limit, info_->tx_attr->rma_iov_limit);
    return std::clamp<std::size_t>(limit, 1, max_write_segments);
  }
  static constexpr std::size_t max_write_segments = 8;
  /// Writes `segments` (at most write_segments()) from `local` as one write, each to its own
  /// remote place (regions of different keys may mix), with remote CQ data `data`: the peer's
  /// completion comes once every segment is in. False on -FI_EAGAIN: poll, retry.
  bool try_writemsg(const region& local, std::span<const write_segment> segments, fi_addr_t peer,
                    std::uint64_t data, void* context) {
    if (segments.empty() || segments.size() > write_segments())
      throw error(errc::invalid_argument,
                  "a write carries 1 to " + std::to_string(write_segments()) + " segments on " +
                      provider_ + ", not " + std::to_string(segments.size()));
    std::array<iovec, max_write_segments> iov{};
    std::array<void*, max_write_segments> desc{};
    std::array<fi_rma_iov, max_write_segments> rma{};
    for (std::size_t i = 0; i < segments.size(); ++i) {
      iov[i] = {local.base + segments[i].offset, segments[i].bytes};
      desc[i] = local.desc;
      rma[i] = {segments[i].remote_address, segments[i].bytes, segments[i].key};
    }
    const fi_msg_rma msg{iov.data(), desc.data(),     segments.size(), peer,
                         rma.data(), segments.size(), context,         data};
    // Explicit flags replace the endpoint's defaults (a completion semantics, say): keep them.
    const ssize_t rc =
        fi_writemsg(ep_, &msg, info_->tx_attr->op_flags | FI_REMOTE_CQ_DATA | FI_COMPLETION);
    if (rc == -FI_EAGAIN) return false;
    if (rc != 0)
      fail("fi_writemsg", rc, std::to_string(segments.size()) + " segments on " + provider_);
    return true;
  }
  /// Sends `bytes` from `local` at `offset` as one control message. False on -FI_EAGAIN.
  bool try_send(const region& local, std::size_t offset, std::size_t bytes, fi_addr_t peer,
                void* context) {
    const ssize_t rc = fi_send(ep_, local.base + offset, bytes, local.desc, peer, context);
    if (rc == -FI_EAGAIN) return false;
    if (rc != 0) fail("fi_send", rc, std::to_string(bytes) + " bytes on " + provider_);
    return true;
  }
  /// Receives control messages into `buffer`, back to back, each at most `max_message` bytes (a
  /// larger one is refused by the provider: FI_ETRUNC). The buffer is posted as two halves, and
  /// the endpoint keeps them posted: poll() posts a half again once the provider is done with it
  /// (full, or its receive failed), after the completions that point into it were handed on;
  /// meanwhile the other half takes what comes (with none posted, messages queue in the provider
  /// as unexpected, and shm may then refuse the next post: -FI_ENOMEM, retried). One receive
  /// buffer per endpoint.
  void receive_into(const region& buffer, std::size_t max_message) {
    if (buffer.bytes < 2 * max_message)
      throw error(errc::invalid_argument, "a receive buffer holds at least two messages");
    std::size_t min_free = max_message;
    const int rc =
        fi_setopt(&ep_->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min_free, sizeof(min_free));
    if (rc != 0) fail("fi_setopt(FI_OPT_MIN_MULTI_RECV)", rc, provider_);
    receive_ = buffer;
    for (std::size_t h = 0; h < 2; ++h) repost_[h] = !post_receive(h);
  }

  /// Reads up to 16 completions and hands each to `on(const completion&)`; returns how many. This
  /// is what makes progress (manual progress): call it while waiting for anything.
  template <class F>
  std::size_t poll(F&& on) {
    for (std::size_t h = 0; h < 2; ++h)  // the provider asked to try again last time
      if (repost_[h]) repost_[h] = !post_receive(h);
    // After the completions of this read are handed on (even if `on` throws), a half of the
    // receive buffer goes back to the provider if one of them released it.
    std::array<bool, 2> released{};
    struct repost_after {
      endpoint& ep;
      std::array<bool, 2>& released;
      ~repost_after() {
        for (std::size_t h = 0; h < 2; ++h)
          if (released[h]) ep.repost_[h] = !ep.post_receive_noexcept(h);
      }
    } guard{*this, released};
    const auto half_of = [this](const void* context) -> std::size_t {
      return context == &halves_[0] ? 0 : context == &halves_[1] ? 1 : 2;
    };
    fi_cq_data_entry entries[16];
    const ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n == -FI_EAGAIN) return 0;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      const ssize_t got = fi_cq_readerr(cq_, &err, 0);
      if (got < 0) fail("fi_cq_readerr", got, provider_);
      completion c;
      c.what = completion::kind::failed;
      c.context = err.op_context;
      c.error = err.err;
      // A failed receive into the buffer (a message too long, a peer gone) may end its posting:
      // post that half again rather than go deaf.
      if (const std::size_t h = half_of(err.op_context); h < 2) released[h] = true;
      const char* text = fi_cq_strerror(cq_, err.prov_errno, err.err_data, nullptr, 0);
      c.detail =
          std::string(fi_strerror(err.err)) + (text != nullptr ? std::string(": ") + text : "");
      on(c);
      return 1;
    }
    if (n < 0) fail("fi_cq_read", n, provider_);
    for (ssize_t i = 0; i < n; ++i) {
      const fi_cq_data_entry& e = entries[i];
      // The provider is done with a half of the receive buffer (the posting the entry's context
      // names): tcp;ofi_rxm says so with the last message into it, shm in an entry of its own
      // (FI_MULTI_RECV alone, no message), to hand on none.
      if (const std::size_t h = half_of(e.op_context); h < 2 && (e.flags & FI_MULTI_RECV) != 0)
        released[h] = true;
      if ((e.flags & FI_MULTI_RECV) != 0 && (e.flags & FI_RECV) == 0) continue;
      completion c;
      c.context = e.op_context;
      c.data = e.data;
      if ((e.flags & FI_REMOTE_CQ_DATA) != 0 && (e.flags & FI_REMOTE_WRITE) != 0) {
        c.what = completion::kind::remote_write;  // the bytes are in place (the remote len
        c.context = nullptr;                      // may be 0: never read it)
      } else if ((e.flags & FI_RECV) != 0) {
        c.what = completion::kind::received;
        if (e.len > 0) c.message = {static_cast<const std::byte*>(e.buf), e.len};
      } else if ((e.flags & FI_SEND) != 0) {
        c.what = completion::kind::sent;
      } else {
        c.what = completion::kind::written;
      }
      on(c);
    }
    return static_cast<std::size_t>(n);
  }

 private:
  /// Posts half h of the receive buffer; false when the provider asks to try again (-FI_EAGAIN,
  /// or -FI_ENOMEM from shm with many messages queued). Throws errc::transport_error.
  bool post_receive(std::size_t h) {
    const std::size_t half = receive_.bytes / 2;
    iovec iov{receive_.base + h * half, half};
    void* desc = receive_.desc;
    fi_msg msg{&iov, &desc, 1, FI_ADDR_UNSPEC, &halves_[h], 0};
    const ssize_t posted = fi_recvmsg(ep_, &msg, FI_MULTI_RECV);
    if (posted == -FI_EAGAIN || posted == -FI_ENOMEM) return false;
    if (posted != 0) fail("fi_recvmsg", posted, provider_);
    return true;
  }
  /// post_receive for a destructor: a failure leaves it to the next poll.
  bool post_receive_noexcept(std::size_t h) noexcept {
    try {
      return post_receive(h);
    } catch (...) {
      return false;
    }
  }

  void open() {
    int rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr);
    if (rc != 0) fail("fi_fabric", rc, provider_);
    rc = fi_domain(fabric_, info_, &domain_, nullptr);
    if (rc != 0) fail("fi_domain", rc, provider_);
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.wait_obj = FI_WAIT_NONE;
    cq_attr.size = 1024;
    rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
    if (rc != 0) fail("fi_cq_open", rc, provider_);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    rc = fi_av_open(domain_, &av_attr, &av_, nullptr);
    if (rc != 0) fail("fi_av_open", rc, provider_);
    rc = fi_endpoint(domain_, info_, &ep_, nullptr);
    if (rc != 0) fail("fi_endpoint", rc, provider_);
    rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
    if (rc == 0) rc = fi_ep_bind(ep_, &av_->fid, 0);
    if (rc != 0) fail("fi_ep_bind", rc, provider_);
    rc = fi_enable(ep_);
    if (rc != 0) fail("fi_enable", rc, provider_);
    std::size_t length = 0;
    rc = fi_getname(&ep_->fid, nullptr, &length);
    if (rc != -FI_ETOOSMALL && rc != 0) fail("fi_getname", rc, provider_);
    name_.resize(length);
    rc = fi_getname(&ep_->fid, name_.data(), &length);
    if (rc != 0) fail("fi_getname", rc, provider_);
    name_.resize(length);
  }

  /// Closes what is open, endpoint first (so a shm endpoint removes its /dev/shm file).
  void close() noexcept {
    for (fid_mr* mr : regions_) (void)fi_close(&mr->fid);
    regions_.clear();
    if (ep_ != nullptr) (void)fi_close(&ep_->fid);
    if (av_ != nullptr) (void)fi_close(&av_->fid);
    if (cq_ != nullptr) (void)fi_close(&cq_->fid);
    if (domain_ != nullptr) (void)fi_close(&domain_->fid);
    if (fabric_ != nullptr) (void)fi_close(&fabric_->fid);
    if (info_ != nullptr) fi_freeinfo(info_);
    ep_ = nullptr, av_ = nullptr, cq_ = nullptr, domain_ = nullptr, fabric_ = nullptr;
    info_ = nullptr;
  }

  /// A memory key no peer can guess from the keys it was given: 64 bits from the kernel's
  /// entropy source, read 256 keys at a time (a learner registers its batch for every sample,
  /// and a read per key costs more than the registration on shm).
  std::uint64_t draw_key() {
    if (keys_left_ == 0) {
      auto* to = reinterpret_cast<std::byte*>(keys_.data());
      std::size_t got = 0;
      while (got < sizeof keys_) {
        const ssize_t n = getrandom(to + got, sizeof keys_ - got, 0);
        if (n > 0) {
          got += static_cast<std::size_t>(n);
        } else if (errno != EINTR) {  // no getrandom here (a sandbox): the library's source
          std::random_device entropy;
          for (auto& k : keys_) k = (std::uint64_t{entropy()} << 32) ^ std::uint64_t{entropy()};
          got = sizeof keys_;
        }
      }
      keys_left_ = keys_.size();
    }
    return keys_[--keys_left_];
  }

  std::string provider_;
  std::array<std::uint64_t, 256> keys_{};  // memory keys drawn and not yet used (draw_key)
  std::size_t keys_left_ = 0;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  std::vector<std::uint8_t> name_;
  std::vector<fid_mr*> regions_;  // registered and not yet deregistered
  region receive_{};              // the receive buffer, posted as two halves
  std::array<char, 2> halves_{};  // their posts' contexts
  std::array<bool, 2> repost_{};  // to be posted again
};

}  // namespace fabric
}  // namespace gear::transport
