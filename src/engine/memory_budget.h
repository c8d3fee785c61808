// How many bytes the paged KV cache gets, within the memory this process may use
// (base/memory_limit.h: a container's cgroup limit, else physical memory), from the
// weights as loaded, the working buffers and the KV flags:
//   --gpu-memory-utilization F:  F x the limit, less weights and buffers;
//   --kv-cache-memory BYTES:     BYTES, refused when with weights and buffers it
//                                exceeds the limit (a clear error, not an OOM kill);
//   neither:                     1 GiB, or less where 0.9 x the limit leaves less.
// Pure: no I/O, so every case is unit tested with made-up limits.
//
// Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <string>

#include "base/memory_limit.h"
#include "base/status.h"

namespace dserve {

// The KV cache's size when no flag gives one, and the share of the memory limit that
// default may take with the weights and buffers (vLLM's default utilisation).
constexpr int64_t kDefaultKvCacheMemory = int64_t{1} << 30;
constexpr double kDefaultMemoryUtilization = 0.9;

struct MemoryBudgetInput {
  MemoryLimit limit;
  double gpu_memory_utilization = 0.0;  // 0: not given
  int64_t kv_cache_memory = 0;          // 0: not given
  int64_t weight_bytes = 0;             // as loaded, the backend's prepared copies included
  int64_t prepared_bytes = 0;           // of weight_bytes, the prepared copies (for the log)
  // Mapped weight bytes the prepared copies replace, their pages released (not counted
  // in weight_bytes; for the log).
  int64_t released_bytes = 0;
  // Of weight_bytes, what was resident when the model had loaded (for the log; -1: not
  // known): mapped weights are read when first used, so at load it is often far less.
  int64_t resident_bytes = -1;
  int64_t buffer_bytes = 0;             // estimated working buffers (working_buffer_bytes)
};

struct KvCacheBudget {
  int64_t bytes = 0;
  std::string explanation;  // one line for the start-up log: the limit used and the sums
};

// An estimate of the engine's working memory besides weights and KV cache: a step's
// logits (max_num_seqs x vocab floats), 64 KiB of activations per batched token, and
// 64 MiB for the rest of the process (tokenizer, heap, thread stacks, connections).
int64_t working_buffer_bytes(int max_num_seqs, int64_t vocab_size, int max_num_batched_tokens);

// Fails with InvalidArgument for a utilisation outside (0, 1] or a negative size, and
// ResourceExhausted where the weights and buffers leave no room under the limit.
Result<KvCacheBudget> kv_cache_budget(const MemoryBudgetInput& in);

}  // namespace dserve
