// kv_cache_budget: the three ways the KV cache is sized (docs/deployment.md, "Memory"),
// with made-up limits, weights and buffers.
#include "engine/memory_budget.h"

#include <gtest/gtest.h>

namespace dserve {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

MemoryBudgetInput input(int64_t limit_bytes) {
  MemoryBudgetInput in;
  in.limit = {limit_bytes, "cgroup v1 memory.limit_in_bytes of /sys/fs/cgroup/memory/pod"};
  in.weight_bytes = 200 * kMiB;
  in.prepared_bytes = 100 * kMiB;
  in.buffer_bytes = 100 * kMiB;
  return in;
}

TEST(MemoryBudgetTest, UtilizationIsAFractionOfTheLimitLessWeightsAndBuffers) {
  MemoryBudgetInput in = input(2 * kGiB);
  in.gpu_memory_utilization = 0.5;
  Result<KvCacheBudget> b = kv_cache_budget(in);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->bytes, kGiB - 300 * kMiB);
  EXPECT_NE(b->explanation.find("memory limit 2.00 GiB (cgroup v1 memory.limit_in_bytes of "
                                "/sys/fs/cgroup/memory/pod) x 0.5"),
            std::string::npos)
      << b->explanation;
}

// The line says what of the weights was resident once loaded (mapped weights are read
// when first used) beside what they add up to.
TEST(MemoryBudgetTest, LineSaysWhatOfTheWeightsIsResident) {
  MemoryBudgetInput in = input(2 * kGiB);
  Result<KvCacheBudget> without = kv_cache_budget(in);
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->explanation.find("resident"), std::string::npos) << without->explanation;
  in.resident_bytes = 40 * kMiB;
  Result<KvCacheBudget> b = kv_cache_budget(in);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->explanation.find("weights 0.20 GiB (0.10 GiB of them the backend's prepared "
                                "copies, 0.04 GiB resident after loading)"),
            std::string::npos)
      << b->explanation;
}

TEST(MemoryBudgetTest, UtilizationThatLeavesNothingIsAnError) {
  MemoryBudgetInput in = input(512 * kMiB);
  in.gpu_memory_utilization = 0.5;  // 256 MiB for 300 MiB of weights and buffers
  Result<KvCacheBudget> b = kv_cache_budget(in);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("leaves no memory for the KV cache"), std::string::npos);
}

TEST(MemoryBudgetTest, UtilizationOutsideZeroToOneIsRefused) {
  for (double f : {-0.1, 1.5}) {
    MemoryBudgetInput in = input(2 * kGiB);
    in.gpu_memory_utilization = f;
    EXPECT_EQ(kv_cache_budget(in).status().code(), StatusCode::kInvalidArgument) << f;
  }
}

TEST(MemoryBudgetTest, ExplicitSizeWithinTheLimitIsKept) {
  MemoryBudgetInput in = input(kGiB);
  in.kv_cache_memory = kGiB - 300 * kMiB;  // exactly what the limit holds
  Result<KvCacheBudget> b = kv_cache_budget(in);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->bytes, in.kv_cache_memory);
}

TEST(MemoryBudgetTest, ExplicitSizeBeyondTheLimitIsAStartUpError) {
  MemoryBudgetInput in = input(kGiB);
  in.kv_cache_memory = 2 * kGiB;
  Result<KvCacheBudget> b = kv_cache_budget(in);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  const std::string& m = b.status().message();
  EXPECT_NE(m.find("more than the memory limit 1.00 GiB (cgroup v1"), std::string::npos) << m;
  // The largest size that fits is suggested.
  EXPECT_NE(m.find("--kv-cache-memory " + std::to_string(kGiB - 300 * kMiB) + " or less"),
            std::string::npos)
      << m;
}

TEST(MemoryBudgetTest, DefaultIsOneGiBWhenTheLimitHoldsIt) {
  Result<KvCacheBudget> b = kv_cache_budget(input(16 * kGiB));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->bytes, kDefaultKvCacheMemory);
  EXPECT_NE(b->explanation.find("(the default)"), std::string::npos) << b->explanation;
}

TEST(MemoryBudgetTest, DefaultShrinksToNinetyPercentOfATightLimit) {
  Result<KvCacheBudget> b = kv_cache_budget(input(kGiB));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->bytes, static_cast<int64_t>(0.9 * static_cast<double>(kGiB)) - 300 * kMiB);
}

TEST(MemoryBudgetTest, DefaultWithNoRoomLeftIsAnError) {
  Result<KvCacheBudget> b = kv_cache_budget(input(320 * kMiB));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("no memory is left for the KV cache"), std::string::npos);
}

TEST(MemoryBudgetTest, WorkingBuffersCountLogitsActivationsAndTheProcess) {
  EXPECT_EQ(working_buffer_bytes(256, 49152, 2048),
            int64_t{256} * 49152 * 4 + int64_t{2048} * 65536 + 64 * kMiB);
}

}  // namespace
}  // namespace dserve
