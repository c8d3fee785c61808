// The memory this process may use, as a container sees it: the tightest cgroup limit
// over the process's memory cgroup and its ancestors (cgroup v2 `memory.max`, else
// cgroup v1 `memory.limit_in_bytes`), capped by the machine's physical memory. The
// engine sizes its KV cache and checks its large allocations against it at start-up,
// so that a pod's limit gives a clear start-up error rather than an OOM kill later.
//
// The process's groups come from /proc/self/cgroup, and where their hierarchies are
// mounted from /proc/self/mountinfo (a container usually sees its own group as the
// root of the mount). Anything unreadable or malformed counts as "no limit there".
//
// Thread-safety: free functions that read the files at call time; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dserve {

struct MemoryLimit {
  int64_t bytes = 0;
  // For the start-up log: "cgroup v2 memory.max of /sys/fs/cgroup/pod",
  // "cgroup v1 memory.limit_in_bytes of /sys/fs/cgroup/memory/pod" or "physical memory".
  std::string source;
};

// Where the limit is read from; tests point these at files in a temporary directory.
struct MemoryLimitFiles {
  std::string proc_self_cgroup = "/proc/self/cgroup";
  std::string proc_self_mountinfo = "/proc/self/mountinfo";
  int64_t physical_bytes = 0;  // 0: the machine's (sysconf)
};

// The limit; a cgroup limit at or above physical memory reports physical memory.
MemoryLimit read_memory_limit(const MemoryLimitFiles& files = {});

// This process's resident memory now (VmRSS of /proc/self/status), 0 if unreadable.
int64_t resident_memory_bytes();

// One limit file's value: bytes, or nullopt for "max" (v2's unlimited) and text that is
// not a non-negative integer.
std::optional<int64_t> parse_memory_limit_value(const std::string& text);

}  // namespace dserve
