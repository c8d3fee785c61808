// ExpertDispatch over real gloo groups whose ranks are threads of this process (as
// in-process data-parallel engines are): every slot's row must reach its expert's
// owner, grouped by expert, and each owner's output must come back to the slot it was
// computed for, whatever the ranks' token counts (an idle rank has none); a rank that
// leaves fails the others' exchange instead of hanging it.
#include "model/expert_dispatch.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dist/gloo_communicator.h"
#include "tensor/half.h"
#include "test_support/net.h"

namespace dserve {
namespace {

using namespace std::chrono_literals;

// Runs body(rank, comm) on `world` threads, each its own rank of one gloo group.
void run_group(int world, const std::function<void(int, dist::Communicator&)>& body,
               std::chrono::milliseconds timeout = 20s) {
  const int port = test::free_port();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      dist::GroupOptions o;
      o.rank = r;
      o.world_size = world;
      o.master_port = port;
      o.timeout = timeout;
      o.shared_memory = false;
      o.fingerprint = "expert dispatch test";
      auto comm = dist::connect_gloo(std::move(o));
      ASSERT_TRUE(comm.ok()) << comm.status().message();
      body(r, **comm);
    });
  }
  for (std::thread& t : threads) t.join();
}

// What the owner of `expert` computes from a row: depends on both, so a row that
// reaches the wrong expert, or an output that returns to the wrong slot, shows.
float expert_fn(int expert, float v, int64_t d) { return v * static_cast<float>(expert + 1) + 0.5f * d - expert; }

constexpr int64_t kHidden = 5;

// One exchange: rank r has n_tokens[r] tokens with k slots each (random distinct
// experts); checks the grouping on the owner and each slot's output on the sender.
// With bfloat16 rows, each row is rounded once each way: the owner sees bf16(x) and the
// sender gets bf16 of the owner's output.
void exchange_and_check(ExpertDispatch& d, int rank, int n_tokens, int k, int n_experts, uint64_t seed) {
  const bool bf16 = d.wire() == ExpertWire::kBf16;
  auto wire = [bf16](float v) { return bf16 ? bf16_to_f32(f32_to_bf16(v)) : v; };
  std::mt19937 rng(static_cast<uint32_t>(seed * 131 + rank));
  std::vector<float> x(static_cast<size_t>(n_tokens * kHidden));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(rank * 1000 + static_cast<int>(i)) * 0.25f;
  std::vector<int64_t> slot_token;
  std::vector<int32_t> slot_expert;
  for (int t = 0; t < n_tokens; ++t) {
    std::vector<int32_t> experts(n_experts);
    for (int e = 0; e < n_experts; ++e) experts[e] = e;
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int j = 0; j < k; ++j) {
      slot_token.push_back(t);
      slot_expert.push_back(experts[j]);
    }
  }
  ASSERT_TRUE(d.dispatch(x, slot_token, slot_expert).ok());
  const std::span<const int64_t> offsets = d.expert_offsets();
  ASSERT_EQ(offsets.size(), static_cast<size_t>(d.n_local_experts() + 1));
  ASSERT_EQ(offsets.back(), d.n_received());
  std::vector<float> out(static_cast<size_t>(d.n_received() * kHidden));
  for (int j = 0; j < d.n_local_experts(); ++j) {
    for (int64_t row = offsets[j]; row < offsets[j + 1]; ++row) {
      for (int64_t c = 0; c < kHidden; ++c) {
        out[row * kHidden + c] = expert_fn(d.first_expert() + j, d.received_rows()[row * kHidden + c], c);
      }
    }
  }
  std::vector<float> slot_out;
  ASSERT_TRUE(d.combine(out, &slot_out).ok());
  ASSERT_EQ(slot_out.size(), slot_token.size() * kHidden);
  for (size_t i = 0; i < slot_token.size(); ++i) {
    for (int64_t c = 0; c < kHidden; ++c) {
      ASSERT_EQ(slot_out[i * kHidden + c],
                wire(expert_fn(slot_expert[i], wire(x[slot_token[i] * kHidden + c]), c)))
          << "rank " << rank << " slot " << i;
    }
  }
}

TEST(ExpertDispatch, RowsReachTheirExpertsAndOutputsReturnToTheirSlots) {
  constexpr int kWorld = 3, kExperts = 6, kTopK = 2;
  std::vector<ExpertDispatchStats> stats(kWorld);
  run_group(kWorld, [&](int rank, dist::Communicator& comm) {
    ExpertDispatch d(comm, kExperts, kHidden);
    EXPECT_EQ(d.first_expert(), rank * 2);
    EXPECT_EQ(d.n_local_experts(), 2);
    // Uneven batches, an idle rank (0 tokens), then a round where every rank is idle.
    const int rounds[][kWorld] = {{4, 0, 7}, {1, 1, 1}, {0, 9, 0}, {0, 0, 0}, {13, 2, 5}};
    uint64_t seed = 1;
    for (const auto& n : rounds) exchange_and_check(d, rank, n[rank], kTopK, kExperts, seed++);
    stats[rank] = d.stats();
  });
  int64_t sent = 0, received = 0;
  for (const ExpertDispatchStats& s : stats) {
    EXPECT_EQ(s.exchanges, 5);
    sent += s.rows_sent;
    received += s.rows_received;
  }
  EXPECT_EQ(sent, received);  // every row another rank sent arrived somewhere
}

TEST(ExpertDispatch, Bfloat16RowsHalveTheBytes) {
  constexpr int kWorld = 2, kExperts = 4, kTopK = 2;
  std::vector<ExpertDispatchStats> stats(kWorld);
  run_group(kWorld, [&](int rank, dist::Communicator& comm) {
    ExpertDispatch d(comm, kExperts, kHidden, ExpertWire::kBf16);
    const int rounds[][kWorld] = {{4, 3}, {0, 5}, {7, 0}};
    uint64_t seed = 11;
    for (const auto& n : rounds) exchange_and_check(d, rank, n[rank], kTopK, kExperts, seed++);
    stats[rank] = d.stats();
  });
  for (const ExpertDispatchStats& s : stats) {
    EXPECT_GT(s.rows_sent, 0);
    // Out: an expert id and hidden halves per row; back: hidden halves per row.
    EXPECT_EQ(s.bytes_sent, s.rows_sent * (4 + 2 * kHidden) + s.rows_received * 2 * kHidden);
  }
}

TEST(ExpertDispatch, OneRankIsTheIdentity) {
  auto comm = dist::make_single_rank_communicator();
  ExpertDispatch d(*comm, 4, kHidden);
  exchange_and_check(d, 0, 6, 3, 4, 7);
  exchange_and_check(d, 0, 0, 3, 4, 8);
  EXPECT_EQ(d.stats().rows_sent, 0);
}

TEST(ExpertDispatch, ARankThatLeavesFailsTheOthersExchange) {
  run_group(
      2,
      [&](int rank, dist::Communicator& comm) {
        ExpertDispatch d(comm, 2, kHidden);
        exchange_and_check(d, rank, 3, 1, 2, 3);
        if (rank == 1) return;  // leaves: its connections close with its communicator
        std::vector<float> x(kHidden, 1.0f);
        const std::vector<int64_t> token = {0};
        const std::vector<int32_t> expert = {1};
        const auto start = std::chrono::steady_clock::now();
        Status s = d.dispatch(x, token, expert);
        if (s.ok()) {
          std::vector<float> out(static_cast<size_t>(d.n_received() * kHidden)), slot_out;
          s = d.combine(out, &slot_out);
        }
        EXPECT_FALSE(s.ok());
        EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
      },
      60s);
}

}  // namespace
}  // namespace dserve
