#include "dist/shm_all_reduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>
#include <vector>

#include "base/log.h"

namespace dserve::dist {
namespace {

constexpr int kMaxRanks = 1024;
constexpr size_t kHeaderBytes = 8192;  // page-aligned start of the slots
// Spin this many times before sleeping on the futex: long enough to catch a peer that
// is a few microseconds behind on its own core, short enough not to steal much from a
// peer that shares ours.
constexpr int kSpins = 2000;
constexpr auto kLivenessPeriod = std::chrono::milliseconds(10);

struct Header {
  uint64_t nonce;       // written by rank 0; the others check it (the right segment)
  uint64_t slot_bytes;
  int32_t n_ranks;
  int32_t pid[kMaxRanks];               // each rank's process, for the liveness check
  alignas(64) std::atomic<uint32_t> arrived;  // +1 per rank per call; the futex word
};
static_assert(sizeof(Header) <= kHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// FUTEX_WAIT without FUTEX_PRIVATE_FLAG: the word is in memory shared by processes.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::milliseconds limit) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(limit.count() / 1000);
  ts.tv_nsec = static_cast<long>(limit.count() % 1000) * 1'000'000L;
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// True once `pid` has exited (gone, or a zombie its parent has not reaped yet).
bool process_gone(int pid) {
  if (pid <= 0) return false;  // not attached yet: cannot tell
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() &&
         (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
}

// One mapping of the segment.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  Mapping(Mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(o.bytes_) {}
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~Mapping() {
    if (base_ != nullptr) ::munmap(base_, bytes_);
  }
  Header* header() const { return static_cast<Header*>(base_); }
  float* slots() const { return reinterpret_cast<float*>(static_cast<uint8_t*>(base_) + kHeaderBytes); }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

size_t segment_bytes(int n_ranks, size_t slot_bytes) { return kHeaderBytes + 2 * size_t(n_ranks) * slot_bytes; }

// Creates (rank 0) or opens the segment and maps it. Creation reserves the memory
// (posix_fallocate), so a /dev/shm too small for it fails here, not with SIGBUS later.
Result<Mapping> map_segment(const std::string& name, bool create, int n_ranks, size_t slot_bytes) {
  const int fd = ::shm_open(name.c_str(), create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
  if (fd < 0) return io_error("shm_open " + name + ": " + std::strerror(errno));
  const size_t bytes = segment_bytes(n_ranks, slot_bytes);
  if (create) {
    const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      return io_error("reserving " + std::to_string(bytes >> 20) + " MiB of shared memory for " + name + ": " +
                      std::strerror(err));
    }
  } else {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
      ::close(fd);
      return io_error("shared memory " + name + " is smaller than the group needs");
    }
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return io_error("mmap " + name + ": " + std::strerror(errno));
  return Mapping(base, bytes);
}

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(std::unique_ptr<Communicator> inner, Mapping mapping)
      : inner_(std::move(inner)), map_(std::move(mapping)), header_(map_.header()),
        slot_floats_(header_->slot_bytes / sizeof(float)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name() + " + shared memory"; }
  void set_timeout(std::chrono::milliseconds timeout) override { inner_->set_timeout(timeout); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }

  Status all_reduce_sum(std::span<float> data) override {
    if (!broken_.ok()) return broken_;
    if (data.size() > slot_floats_) return inner_->all_reduce_sum(data);  // every rank alike
    const int n = size(), me = rank();
    ++calls_;
    float* slots = map_.slots() + (calls_ & 1) * static_cast<size_t>(n) * slot_floats_;
    std::memcpy(slots + static_cast<size_t>(me) * slot_floats_, data.data(), data.size_bytes());
    const uint32_t target = calls_ * static_cast<uint32_t>(n);  // modulo 2^32, as the counter
    const uint32_t before = header_->arrived.fetch_add(1, std::memory_order_acq_rel);
    if (before + 1 == target) {
      futex_wake_all(&header_->arrived);
    } else if (Status s = wait_for(target); !s.ok()) {
      broken_ = s;
      return s;
    }
    // Rank order, as sum_in_rank_order: the same bits on every rank and as gloo's path.
    std::memcpy(data.data(), slots, data.size_bytes());
    for (int r = 1; r < n; ++r) {
      const float* src = slots + static_cast<size_t>(r) * slot_floats_;
      for (size_t i = 0; i < data.size(); ++i) data[i] += src[i];
    }
    return Status::Ok();
  }

  Status all_gather(std::span<const std::byte> in, std::span<std::byte> out) override {
    return checked(inner_->all_gather(in, out));
  }
  Status broadcast(std::span<std::byte> data, int root) override { return checked(inner_->broadcast(data, root)); }
  Status barrier() override { return checked(inner_->barrier()); }
  Status all_to_all(std::span<const std::byte> in, std::span<std::byte> out) override {
    return checked(inner_->all_to_all(in, out));
  }
  // The shared-memory wait notices a dead rank by itself; a hung one ends at the timeout.
  void abort(const std::string& why) override { inner_->abort(why); }
  Status all_to_all_v(std::span<const std::byte> in, const std::vector<int64_t>& in_counts,
                      std::span<std::byte> out, const std::vector<int64_t>& out_counts) override {
    return checked(inner_->all_to_all_v(in, in_counts, out, out_counts));
  }

 private:
  static bool reached(uint32_t arrived, uint32_t target) { return static_cast<int32_t>(arrived - target) >= 0; }

  Status checked(Status s) {
    if (!broken_.ok()) return broken_;
    return s;
  }

  Status wait_for(uint32_t target) {
    std::atomic<uint32_t>& arrived = header_->arrived;
    for (int i = 0; i < kSpins; ++i) {
      if (reached(arrived.load(std::memory_order_acquire), target)) return Status::Ok();
      cpu_relax();
    }
    const auto start = std::chrono::steady_clock::now();
    const auto limit = timeout();
    auto next_check = start + kLivenessPeriod;
    for (;;) {
      const uint32_t seen = arrived.load(std::memory_order_acquire);
      if (reached(seen, target)) return Status::Ok();
      futex_wait(&arrived, seen, kLivenessPeriod);
      if (reached(arrived.load(std::memory_order_acquire), target)) return Status::Ok();
      const auto now = std::chrono::steady_clock::now();
      if (now < next_check) continue;
      next_check = now + kLivenessPeriod;
      for (int r = 0; r < size(); ++r) {
        if (r != rank() && process_gone(header_->pid[r])) {
          return io_error("rank " + std::to_string(rank()) + ": all_reduce_sum failed: rank " + std::to_string(r) +
                          " (pid " + std::to_string(header_->pid[r]) + ") exited");
        }
      }
      if (now - start > limit) {
        return io_error("rank " + std::to_string(rank()) + ": all_reduce_sum failed: the other ranks did not arrive within " +
                        std::to_string(std::chrono::duration_cast<std::chrono::seconds>(limit).count()) + " s");
      }
    }
  }

  std::unique_ptr<Communicator> inner_;
  Mapping map_;
  Header* header_;
  size_t slot_floats_;
  uint32_t calls_ = 0;
  Status broken_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> connect_shm_all_reduce(std::unique_ptr<Communicator> inner, TcpStore& store,
                                                             const std::string& tag, size_t slot_bytes) {
  const int n = inner->size(), me = inner->rank();
  if (n < 2 || n > kMaxRanks || slot_bytes < sizeof(float)) return inner;
  const std::string key = "dserve/shm/" + tag;
  Mapping mapping;
  std::string why_not;
  std::string name;
  uint64_t nonce = 0;
  if (me == 0) {
    name = "/dserve-" + tag + "-" + std::to_string(::getpid());
    nonce = std::random_device{}() * 0x9E3779B97F4A7C15ull + 1;
    Result<Mapping> m = map_segment(name, true, n, slot_bytes);
    if (m.ok()) {
      mapping = std::move(*m);
      Header* h = mapping.header();
      h->nonce = nonce;
      h->slot_bytes = slot_bytes;
      h->n_ranks = n;
      h->arrived.store(0, std::memory_order_relaxed);
      DS_RETURN_IF_ERROR(store.try_set(key, name + " " + std::to_string(nonce)));
    } else {
      why_not = m.status().message();
      DS_RETURN_IF_ERROR(store.try_set(key, ""));
    }
  }
  DS_RETURN_IF_ERROR(inner->barrier());  // rank 0's key is in the store
  if (me != 0) {
    DS_ASSIGN_OR_RETURN(std::string v, store.try_get(key));
    const size_t sp = v.find(' ');
    if (sp == std::string::npos) {
      why_not = "rank 0 has no segment";
    } else {
      name = v.substr(0, sp);
      char* end = nullptr;
      nonce = std::strtoull(v.c_str() + sp + 1, &end, 10);
      Result<Mapping> m = *end == '\0' ? map_segment(name, false, n, slot_bytes)
                                       : Result<Mapping>(invalid_argument("malformed segment key '" + v + "'"));
      if (!m.ok()) {
        why_not = m.status().message();
      } else if (m->header()->nonce != nonce || m->header()->n_ranks != n || m->header()->slot_bytes != slot_bytes) {
        why_not = name + " belongs to another group";
      } else {
        mapping = std::move(*m);
      }
    }
  }
  if (why_not.empty()) mapping.header()->pid[me] = static_cast<int32_t>(::getpid());
  DS_RETURN_IF_ERROR(store.try_set(key + "/ok/" + std::to_string(me), why_not.empty() ? "1" : "0" + why_not));
  DS_RETURN_IF_ERROR(inner->barrier());  // every rank's answer is in the store
  std::string refused;
  for (int r = 0; r < n && refused.empty(); ++r) {
    DS_ASSIGN_OR_RETURN(std::string ok, store.try_get(key + "/ok/" + std::to_string(r)));
    if (ok != "1") refused = "rank " + std::to_string(r) + ": " + ok.substr(1);
  }
  DS_RETURN_IF_ERROR(inner->barrier());  // everyone has attached (or given up) and read the answers
  if (me == 0 && !name.empty()) ::shm_unlink(name.c_str());  // lives on in the mappings
  if (!refused.empty()) {
    if (me == 0) DS_LOG_INFO("all-reduce through {} only (no shared memory: {})", inner->name(), refused);
    return inner;
  }
  if (me == 0) {
    DS_LOG_INFO("all-reduce through shared memory between the {} ranks on this machine (vectors up to {} KiB)", n,
                slot_bytes >> 10);
  }
  return std::unique_ptr<Communicator>(new ShmCommunicator(std::move(inner), std::move(mapping)));
}

}  // namespace dserve::dist
