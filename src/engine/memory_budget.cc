#include "engine/memory_budget.h"

#include <algorithm>
#include <cstdio>

namespace dserve {
namespace {

std::string gib(int64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return s;
}

std::string fraction(double f) {
  char s[32];
  std::snprintf(s, sizeof s, "%g", f);
  return s;
}

// "memory limit 2.00 GiB (cgroup v1 ...)".
std::string limit_text(const MemoryLimit& limit) {
  return "memory limit " + gib(limit.bytes) + " (" + limit.source + ")";
}

std::string weights_and_buffers_text(const MemoryBudgetInput& in) {
  const std::string resident =
      in.resident_bytes >= 0 ? ", " + gib(in.resident_bytes) + " resident after loading" : "";
  const std::string released =
      in.released_bytes > 0 ? ", which replace " + gib(in.released_bytes) + " of mapped weights released"
                            : "";
  return "weights " + gib(in.weight_bytes) + " (" + gib(in.prepared_bytes) +
         " of them the backend's prepared copies" + released + resident + "), working buffers ~" +
         gib(in.buffer_bytes);
}

}  // namespace

int64_t working_buffer_bytes(int max_num_seqs, int64_t vocab_size, int max_num_batched_tokens) {
  constexpr int64_t kActivationBytesPerToken = 64 << 10;
  constexpr int64_t kProcessBytes = 64 << 20;
  return int64_t{max_num_seqs} * vocab_size * 4 +
         int64_t{max_num_batched_tokens} * kActivationBytesPerToken + kProcessBytes;
}

Result<KvCacheBudget> kv_cache_budget(const MemoryBudgetInput& in) {
  const double f = in.gpu_memory_utilization;
  if (f != 0.0 && !(f > 0.0 && f <= 1.0)) {
    return invalid_argument("gpu_memory_utilization must be in (0, 1], got " + std::to_string(f));
  }
  if (in.kv_cache_memory < 0) {
    return invalid_argument("kv_cache_memory must not be negative, got " +
                            std::to_string(in.kv_cache_memory));
  }
  const int64_t fixed = in.weight_bytes + in.buffer_bytes;
  const std::string sums = weights_and_buffers_text(in);
  if (f != 0.0) {
    const int64_t allowed = static_cast<int64_t>(f * static_cast<double>(in.limit.bytes));
    const int64_t kv = allowed - fixed;
    const std::string line = limit_text(in.limit) + " x " + fraction(f) + " = " + gib(allowed) +
                             " allowed; " + sums + ", KV cache " + gib(kv);
    if (kv <= 0) {
      return Status(StatusCode::kResourceExhausted,
                    "gpu_memory_utilization " + fraction(f) +
                        " leaves no memory for the KV cache: " + line +
                        "; raise it, or set --kv-cache-memory BYTES instead");
    }
    return KvCacheBudget{kv, line};
  }
  if (in.kv_cache_memory > 0) {
    const int64_t need = in.kv_cache_memory + fixed;
    const std::string line = limit_text(in.limit) + "; " + sums + ", KV cache " +
                             gib(in.kv_cache_memory) + " (--kv-cache-memory)";
    if (need > in.limit.bytes) {
      const int64_t fits = in.limit.bytes - fixed;
      return Status(StatusCode::kResourceExhausted,
                    "--kv-cache-memory " + std::to_string(in.kv_cache_memory) + " (" +
                        gib(in.kv_cache_memory) + ") with the weights and buffers needs " +
                        gib(need) + ", more than the " + limit_text(in.limit) + "; " + sums +
                        (fits > 0 ? "; use --kv-cache-memory " + std::to_string(fits) +
                                        " or less, or --gpu-memory-utilization 0.9"
                                  : "; the model does not fit this limit"));
    }
    return KvCacheBudget{in.kv_cache_memory, line};
  }
  const int64_t allowed =
      static_cast<int64_t>(kDefaultMemoryUtilization * static_cast<double>(in.limit.bytes));
  const int64_t kv = std::min(kDefaultKvCacheMemory, allowed - fixed);
  const std::string line = limit_text(in.limit) + "; " + sums + ", KV cache " + gib(kv) +
                           (kv < kDefaultKvCacheMemory
                                ? " (the default " + gib(kDefaultKvCacheMemory) + " less what " +
                                      fraction(kDefaultMemoryUtilization) + " x the limit lacks)"
                                : " (the default)");
  if (kv <= 0) {
    return Status(StatusCode::kResourceExhausted,
                  "no memory is left for the KV cache: " + sums + " take more than " +
                      fraction(kDefaultMemoryUtilization) + " x the " + limit_text(in.limit) +
                      "; raise the limit or lower --max-num-seqs / --max-num-batched-tokens");
  }
  return KvCacheBudget{kv, line};
}

}  // namespace dserve
