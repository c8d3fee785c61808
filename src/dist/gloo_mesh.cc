#include "dist/gloo_mesh.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include <gloo/alltoall.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "base/log.h"

namespace dserve::dist {
namespace {

using Clock = std::chrono::steady_clock;

// gloo's keys of one attempt, under "gloo/<attempt>/" in the store; runs the test hook
// at gloo's first wait, which comes after it published this rank's pair addresses.
class AttemptStore final : public gloo::rendezvous::Store {
 public:
  AttemptStore(TcpStore& store, int attempt, const std::function<void(int)>& hook)
      : store_(store), prefix_("gloo/" + std::to_string(attempt) + "/"), attempt_(attempt), hook_(hook) {}

  void set(const std::string& key, const std::vector<char>& data) override { store_.set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return store_.get(prefix_ + key); }
  void wait(const std::vector<std::string>& keys) override { store_.wait(prefixed(keys)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    if (hook_ && !hooked_) {
      hooked_ = true;
      hook_(attempt_);
    }
    store_.wait(prefixed(keys), timeout);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const std::string& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  TcpStore& store_;
  const std::string prefix_;
  const int attempt_;
  const std::function<void(int)>& hook_;
  bool hooked_ = false;
};

// What a rank sends each peer to prove the pair joins the two ranks.
struct PairCheck {
  uint32_t magic = 0;
  uint32_t attempt = 0;
  uint32_t from = 0;
  uint32_t to = 0;
  bool operator==(const PairCheck&) const = default;
};
constexpr uint32_t kPairCheckMagic = 0x64734d56;  // "dsMV"
constexpr uint32_t kPairCheckTag = 0xfffffff0;    // above any tag the communicator uses

// Throws (gloo's exceptions) when a pair is broken or silent; an error when one
// carried something else than its peer's record.
Status check_pairs(const std::shared_ptr<gloo::Context>& context, int attempt) {
  const int world = context->size, rank = context->rank;
  std::vector<PairCheck> out(world), in(world);
  for (int p = 0; p < world; ++p) {
    out[p] = {kPairCheckMagic, static_cast<uint32_t>(attempt), static_cast<uint32_t>(rank), static_cast<uint32_t>(p)};
  }
  gloo::AlltoallOptions opts(context);
  opts.setInput(reinterpret_cast<uint8_t*>(out.data()), out.size() * sizeof(PairCheck));
  opts.setOutput(reinterpret_cast<uint8_t*>(in.data()), in.size() * sizeof(PairCheck));
  opts.setTag(kPairCheckTag);
  gloo::alltoall(opts);
  for (int p = 0; p < world; ++p) {
    const PairCheck want{kPairCheckMagic, static_cast<uint32_t>(attempt), static_cast<uint32_t>(p),
                         static_cast<uint32_t>(rank)};
    if (!(in[p] == want)) {
      return io_error("the connection to rank " + std::to_string(p) + " carried something else than rank " +
                      std::to_string(p) + " (a stranger connected to this rank's port first?)");
    }
  }
  return Status::Ok();
}

Result<std::shared_ptr<gloo::Context>> attempt_mesh(TcpStore& store, const gloo::transport::tcp::attr& attr,
                                                    const MeshOptions& o, int attempt,
                                                    std::chrono::milliseconds timeout) {
  try {
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world_size);
    context->setTimeout(timeout);
    AttemptStore prefixed(store, attempt, o.before_connecting_pairs);
    context->connectFullMesh(prefixed, device);
    DS_RETURN_IF_ERROR(check_pairs(context, attempt));
    return std::shared_ptr<gloo::Context>(context);
  } catch (const std::exception& e) {
    return io_error(e.what());
  }
}

// Publishes this rank's outcome of `attempt` and reads every rank's: "" when all
// connected, else their errors. An error when a rank never reported (it died).
Result<std::string> agree(TcpStore& store, const MeshOptions& o, int attempt, const Status& mine,
                          Clock::time_point deadline) {
  const std::string key = "dserve/mesh/" + std::to_string(attempt) + "/";
  DS_RETURN_IF_ERROR(store.try_set(key + std::to_string(o.rank), mine.ok() ? "ok" : mine.message()));
  std::string failures;
  for (int r = 0; r < o.world_size; ++r) {
    for (;;) {
      Result<std::string> v = store.try_get(key + std::to_string(r));
      if (v.ok()) {
        if (*v != "ok") failures += (failures.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + *v;
        break;
      }
      if (v.status().code() != StatusCode::kNotFound) return v.status();
      if (Clock::now() >= deadline) {
        return io_error("rank " + std::to_string(r) + " never reported its gloo connections at " + o.where +
                        " (it exited?)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return failures;
}

}  // namespace

Result<std::shared_ptr<gloo::Context>> connect_verified_mesh(TcpStore& store, const gloo::transport::tcp::attr& attr,
                                                             const MeshOptions& o) {
  const auto deadline = Clock::now() + o.timeout;
  for (int attempt = 0;; ++attempt) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const auto timeout = std::max(std::min(o.attempt_timeout, left), std::chrono::milliseconds(1000));
    Result<std::shared_ptr<gloo::Context>> context = attempt_mesh(store, attr, o, attempt, timeout);
    DS_ASSIGN_OR_RETURN(std::string failures, agree(store, o, attempt, context.status(), deadline));
    if (failures.empty()) {
      (*context)->setTimeout(o.timeout);
      return context;
    }
    if (attempt + 1 >= kMaxMeshAttempts || Clock::now() >= deadline) {
      return io_error("rank " + std::to_string(o.rank) + ": gloo could not connect the group through " + o.where +
                      " in " + std::to_string(attempt + 1) + " attempt(s): " + failures);
    }
    DS_LOG_WARN("rank {}: connecting the group's TCP pairs failed ({}); connecting again on fresh ports "
                "(attempt {} of {})", o.rank, failures, attempt + 2, kMaxMeshAttempts);
  }
}

}  // namespace dserve::dist
