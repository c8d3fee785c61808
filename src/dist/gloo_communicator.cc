#include "dist/gloo_communicator.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <csignal>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/pair.h>

#include "dist/gloo_mesh.h"

namespace dserve::dist {
namespace {

std::string seconds_text(std::chrono::milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

// The local IPv4 address the kernel would use to reach `host` (no packet is sent:
// connecting a UDP socket only chooses a route).
std::string local_address_towards(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "127.0.0.1";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  std::string result = "127.0.0.1";
  if (::inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &addr.sin_addr) == 1 &&
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char text[INET_ADDRSTRLEN];
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text) != nullptr) {
      result = text;
    }
  }
  ::close(fd);
  return result;
}

std::string host_name() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

constexpr const char* kAbortKey = "dserve/abort";

// Rank 0 owns the store: before it exits with an error it publishes the reason and
// lingers briefly, so the other ranks report the same cause instead of "lost the
// connection".
Status abort_rendezvous(TcpStore& store, int rank, Status error) {
  if (rank == 0) {
    (void)store.try_set(kAbortKey, error.message());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  return error;
}

// Shuts down (without closing: the fd stays gloo's) this process's TCP connections of
// the context's pairs, found by their local addresses: gloo's loop then sees them end
// and fails every operation waiting on them. gloo offers no call that does this.
void shut_down_pair_connections(gloo::Context& context) {
  std::vector<sockaddr_storage> locals;
  for (int r = 0; r < context.size; ++r) {
    if (r == context.rank || !context.getPair(r)) continue;
    locals.push_back(static_cast<const gloo::transport::tcp::Address&>(context.getPair(r)->address()).getSockaddr());
  }
  auto same = [](const sockaddr_storage& a, const sockaddr_storage& b) {
    if (a.ss_family != b.ss_family) return false;
    if (a.ss_family == AF_INET) {
      const auto& x = reinterpret_cast<const sockaddr_in&>(a);
      const auto& y = reinterpret_cast<const sockaddr_in&>(b);
      return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
    }
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  };
  DIR* fds = ::opendir("/proc/self/fd");
  if (fds == nullptr) return;
  while (dirent* e = ::readdir(fds)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(fds)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t len = sizeof local, peer_len = sizeof peer;
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    for (const sockaddr_storage& want : locals) {
      if (same(local, want)) ::shutdown(static_cast<int>(fd), SHUT_RDWR);
    }
  }
  ::closedir(fds);
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, std::vector<std::string> peers)
      : context_(std::move(context)), peers_(std::move(peers)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  std::string name() const override { return "gloo/tcp"; }
  void set_timeout(std::chrono::milliseconds timeout) override { context_->setTimeout(timeout); }
  std::chrono::milliseconds timeout() const override { return context_->getTimeout(); }

  void abort(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (!abort_reason_.empty()) return;
      abort_reason_ = why;
    }
    shut_down_pair_connections(*context_);
  }

  Status all_reduce_sum(std::span<float> data) override {
    // Gather, then add in rank order on every rank: the result does not depend on the
    // ring's chunk schedule, so it is the same bits on every rank and in every run.
    const size_t n = data.size();
    scratch_.resize(n * static_cast<size_t>(size()));
    DS_RETURN_IF_ERROR(all_gather(std::as_bytes(data), std::as_writable_bytes(std::span<float>(scratch_))));
    sum_in_rank_order(scratch_, size(), data);
    return Status::Ok();
  }

  Status all_gather(std::span<const std::byte> in, std::span<std::byte> out) override {
    if (out.size() != in.size() * static_cast<size_t>(size())) {
      return invalid_argument("all_gather: output must be size() times the input");
    }
    return run("all_gather", [&] {
      gloo::AllgatherOptions opts(context_);
      // gloo's API takes a non-const input pointer but only reads it.
      opts.setInput(const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(in.data())), in.size());
      opts.setOutput(reinterpret_cast<uint8_t*>(out.data()), out.size());
      opts.setTag(next_tag());
      gloo::allgather(opts);
    });
  }

  Status broadcast(std::span<std::byte> data, int root) override {
    if (root < 0 || root >= size()) return invalid_argument("broadcast: root " + std::to_string(root) + " out of range");
    return run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(reinterpret_cast<uint8_t*>(data.data()), data.size());
      opts.setRoot(root);
      opts.setTag(next_tag());
      gloo::broadcast(opts);
    });
  }

  Status barrier() override {
    return run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

  Status all_to_all(std::span<const std::byte> in, std::span<std::byte> out) override {
    if (in.size() != out.size() || in.size() % static_cast<size_t>(size()) != 0) {
      return invalid_argument("all_to_all: input and output must be equal and divisible by size()");
    }
    return run("all_to_all", [&] {
      gloo::AlltoallOptions opts(context_);
      opts.setInput(const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(in.data())), in.size());
      opts.setOutput(reinterpret_cast<uint8_t*>(out.data()), out.size());
      opts.setTag(next_tag());
      gloo::alltoall(opts);
    });
  }

  Status all_to_all_v(std::span<const std::byte> in, const std::vector<int64_t>& in_counts,
                      std::span<std::byte> out, const std::vector<int64_t>& out_counts) override {
    auto total = [](const std::vector<int64_t>& c) {
      int64_t t = 0;
      for (int64_t v : c) t += v < 0 ? INT64_MIN / 4 : v;
      return t;
    };
    if (in_counts.size() != static_cast<size_t>(size()) || out_counts.size() != static_cast<size_t>(size()) ||
        total(in_counts) < 0 || total(out_counts) < 0 || static_cast<size_t>(total(in_counts)) > in.size() ||
        static_cast<size_t>(total(out_counts)) > out.size()) {
      return invalid_argument("all_to_all_v: counts do not match the group size or the buffers");
    }
    return run("all_to_all_v", [&] {
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(in.data())), in_counts);
      opts.setOutput(reinterpret_cast<uint8_t*>(out.data()), out_counts);
      opts.setTag(next_tag());
      gloo::alltoallv(opts);
    });
  }

 private:
  // Distinct tags keep a late message of one collective from matching the next.
  uint32_t next_tag() { return tag_++; }

  template <typename F>
  Status run(const char* op, F&& f) {
    if (!broken_.ok()) return broken_;
    try {
      if (std::string why = abort_reason(); !why.empty()) throw std::runtime_error(why);
      f();
      return Status::Ok();
    } catch (const std::exception& e) {
      if (std::string why = abort_reason(); !why.empty()) {
        broken_ = io_error("rank " + std::to_string(rank()) + ": " + op + " failed: " + why);
        return broken_;
      }
      std::string peers;
      for (size_t r = 0; r < peers_.size(); ++r) {
        if (static_cast<int>(r) == rank()) continue;
        peers += (peers.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " " + peers_[r];
      }
      broken_ = io_error("rank " + std::to_string(rank()) + ": " + op + " failed (a peer rank exited or stopped " +
                         "answering; peers: " + peers + "): " + e.what());
      return broken_;
    }
  }

  std::string abort_reason() const {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return abort_reason_;
  }

  std::shared_ptr<gloo::Context> context_;
  std::vector<std::string> peers_;  // [size] "host:pid" of each rank, for error messages
  mutable std::mutex abort_mu_;
  std::string abort_reason_;  // GUARDED_BY(abort_mu_): set once by abort()
  std::vector<float> scratch_;
  uint32_t tag_ = 1;
  Status broken_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> connect_gloo(GroupOptions options) {
  const int rank = options.rank;
  const int world = options.world_size;
  if (world < 1 || rank < 0 || rank >= world) {
    return invalid_argument("rank " + std::to_string(rank) + " is outside a group of " + std::to_string(world));
  }
  // gloo writes to its peers' sockets with plain send(): without this, a write to a
  // rank that just died kills this process with SIGPIPE instead of failing the
  // collective with an error that names the peer.
  ::signal(SIGPIPE, SIG_IGN);
  const std::string where = options.master_addr + ":" + std::to_string(options.master_port);
  std::unique_ptr<TcpStoreServer> server = std::move(options.server);
  if (rank == 0 && server == nullptr) {
    DS_ASSIGN_OR_RETURN(server, TcpStoreServer::start("", options.master_port));
  }
  DS_ASSIGN_OR_RETURN(auto store, TcpStore::connect(options.master_addr, options.master_port, options.timeout));

  // 1. Announce ourselves, then wait for every rank: a missing one is named here,
  //    before gloo starts waiting on it with a less telling message.
  const std::string me = host_name() + " pid " + std::to_string(::getpid());
  // Claimed, not set: a second process with this rank must not take the first one's place.
  const std::string announcement = options.fingerprint + '\n' + me;
  DS_ASSIGN_OR_RETURN(std::string holder, store->claim("dserve/rank/" + std::to_string(rank), announcement));
  if (holder != announcement) {
    return io_error("rank " + std::to_string(rank) + " of the group at " + where + " is taken already, by " +
                    holder.substr(holder.rfind('\n') + 1) + ": two processes were started as the same rank");
  }
  std::vector<std::string> fingerprints(world), peers(world);
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  for (int r = 0; r < world; ++r) {
    for (;;) {
      Result<std::string> v = store->try_get("dserve/rank/" + std::to_string(r));
      if (v.ok()) {
        const size_t nl = v->rfind('\n');
        fingerprints[r] = v->substr(0, nl);
        peers[r] = v->substr(nl + 1);
        break;
      }
      if (v.status().code() != StatusCode::kNotFound) return v.status().with_context("rank " + std::to_string(rank));
      // Rank 0 gave up first (it waits as long as we do): repeat its reason.
      if (Result<std::string> abort = store->try_get(kAbortKey); abort.ok()) return io_error(*abort);
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string missing;
        for (int m = r; m < world; ++m) {
          if (!store->try_get("dserve/rank/" + std::to_string(m)).ok()) {
            missing += (missing.empty() ? "" : ", ") + std::to_string(m);
          }
        }
        return abort_rendezvous(*store, rank,
                                io_error("rank(s) " + missing + " of " + std::to_string(world) +
                                         " did not join the rendezvous at " + where + " within " +
                                         seconds_text(options.timeout) + " (--distributed-timeout)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  for (int r = 1; r < world; ++r) {
    if (fingerprints[r] != fingerprints[0]) {
      return abort_rendezvous(*store, rank, invalid_argument("rank " + std::to_string(r) + " (" + peers[r] +
                              ") was started with a different configuration than rank 0 (" + peers[0] + "): '" +
                              fingerprints[r] + "' vs '" + fingerprints[0] + "'"));
    }
  }

  // 2. gloo connects its pairs through the same store (gloo_mesh.h: checked, and made
  //    again on fresh ports when a stranger got in the way).
  gloo::transport::tcp::attr attr;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
    attr.iface = ifname;
  } else {
    attr.hostname = local_address_towards(options.master_addr, options.master_port);
  }
  MeshOptions mesh;
  mesh.rank = rank;
  mesh.world_size = world;
  mesh.where = where;
  mesh.timeout = options.timeout;
  mesh.attempt_timeout = options.connect_attempt_timeout;
  mesh.before_connecting_pairs = options.before_connecting_pairs;
  Result<std::shared_ptr<gloo::Context>> context = connect_verified_mesh(*store, attr, mesh);
  if (!context.ok()) return context.status();
  bool one_host = true;  // peers[r] is "host pid N"
  for (int r = 1; r < world; ++r) {
    one_host = one_host && peers[r].substr(0, peers[r].rfind(" pid ")) == peers[0].substr(0, peers[0].rfind(" pid "));
  }
  const char* shm_env = std::getenv("DSERVE_SHM_ALL_REDUCE");
  const bool shm = options.shared_memory && one_host && !(shm_env != nullptr && std::string(shm_env) == "0");
  std::unique_ptr<Communicator> comm = std::make_unique<GlooCommunicator>(*context, std::move(peers));
  if (shm) {
    DS_ASSIGN_OR_RETURN(comm, connect_shm_all_reduce(std::move(comm), *store, std::to_string(options.master_port),
                                                     options.shm_slot_bytes));
  }
  // Everyone has finished reading the store once this returns, so rank 0 may close it.
  DS_RETURN_IF_ERROR(comm->barrier());
  return comm;
}

}  // namespace dserve::dist
