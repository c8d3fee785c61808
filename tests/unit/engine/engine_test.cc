// LlmEngine on a tiny random Llama (F32 safetensors written by the test): batched,
// chunked, preempted and prefix-cached runs equal each request run alone through
// CausalLm::forward; bad requests are refused without disturbing the others; aborts
// and finishes return every block; seeded sampling does not depend on the batch.
// Tests that compare with forward() (whose contiguous cache is F32) pin the paged
// cache to F32; with the default F16 cache, batched and preempted runs equal each
// request alone through an F16 engine, and an F16 cache holds twice the blocks.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "tiny_deepseek.h"
#include "tiny_llama.h"
#include "backend/backend.h"
#include "base/log.h"
#include "engine/llm_engine.h"
#include "loader/model_files.h"
#include "sampling/sampler.h"
#include "test_support/engine_fixtures.h"

namespace dserve {
namespace {

using test::greedy;

struct Req {
  std::vector<int32_t> prompt;
  SamplingOptions options;
};

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_level("warning");
    CpuBackendOptions bo;
    bo.n_threads = 2;
    backend_ = make_cpu_backend(bo);
    Result<std::unique_ptr<ModelFiles>> files = ModelFiles::open(write_tiny_llama());
    ASSERT_TRUE(files.ok()) << files.status().message();
    Result<std::unique_ptr<CausalLm>> m = load_causal_lm(std::move(*files), *backend_, kContext);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(*m);
  }

  EngineConfig config(int n_blocks, int block_size = 4, DType kv_dtype = DType::kF32) const {
    EngineConfig c;
    c.block_size = block_size;
    c.kv_cache_dtype = kv_dtype;
    c.kv_cache_memory = int64_t{n_blocks} * block_size *
                        static_cast<int64_t>(model_->paged_bytes_per_token(kv_dtype));
    // As long as the whole cache allows (a request must fit alone).
    c.max_model_len = std::min(kContext, n_blocks * block_size + 1);
    c.max_num_batched_tokens = 48;
    c.max_num_seqs = 16;
    return c;
  }

  // The oracle: one request alone through forward() and a contiguous KV cache.
  std::vector<int32_t> solo(const Req& r) {
    SamplingParams params = *SamplingParams::create(r.options);
    SamplingState state(params, r.prompt, model_->info().eos_ids);
    Sampler sampler;
    std::unique_ptr<SequenceCache> kv = model_->new_cache();
    std::vector<int32_t> pos(r.prompt.size());
    std::iota(pos.begin(), pos.end(), 0);
    std::vector<float> logits;
    EXPECT_TRUE(model_->forward(r.prompt, pos, *kv, LogitsFor::kLast, &logits).ok());
    std::vector<int32_t> out;
    while (true) {
      const int32_t next = sampler.sample(state, logits).token;
      const auto finish = state.accept(next);
      out.push_back(next);  // a stop id is part of the output, as vLLM
      if (finish) break;
      const int32_t p = static_cast<int32_t>(kv->n_tokens());
      EXPECT_TRUE(model_->forward({&next, 1}, {&p, 1}, *kv, LogitsFor::kLast, &logits).ok());
    }
    return out;
  }

  static std::vector<std::vector<int32_t>> run(LlmEngine& e, const std::vector<Req>& reqs) {
    std::vector<std::vector<int32_t>> out(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      Status s = e.add_request(i, reqs[i].prompt, reqs[i].options);
      EXPECT_TRUE(s.ok()) << s.message();
    }
    while (e.has_unfinished_requests()) {
      Result<std::vector<EngineOutput>> step = e.step();
      EXPECT_TRUE(step.ok()) << step.status().message();
      if (!step.ok()) break;
      for (const EngineOutput& o : *step) {
        out[o.id].insert(out[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      }
    }
    EXPECT_TRUE(e.scheduler().check_invariants().ok());
    return out;
  }

  static std::vector<Req> random_requests(int n, int max_len, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<Req> reqs;
    for (int i = 0; i < n; ++i) {
      Req r;
      r.prompt.resize(1 + rng() % max_len);
      for (int32_t& t : r.prompt) t = static_cast<int32_t>(rng() % kVocab);
      r.options = greedy(1 + static_cast<int>(rng() % 12));
      reqs.push_back(std::move(r));
    }
    return reqs;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CausalLm> model_;
};

TEST_F(EngineTest, BatchedChunkedRunsEqualSoloRuns) {
  for (int block_size : {4, 16, 128}) {
    const std::vector<Req> reqs = random_requests(12, 100, 1);
    auto engine = LlmEngine::create(*model_, config(200, block_size));
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    const auto got = run(**engine, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], solo(reqs[i])) << i;
    const EngineStats s = (*engine)->stats();
    EXPECT_EQ(s.n_free_blocks, s.n_blocks);
    EXPECT_EQ(s.n_preemptions, 0);
  }
}

TEST_F(EngineTest, PreemptionKeepsOutputs) {
  const std::vector<Req> reqs = random_requests(12, 100, 2);
  auto engine = LlmEngine::create(*model_, config(40));  // 160 token slots for ~700 tokens
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  const auto got = run(**engine, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], solo(reqs[i])) << i;
  const EngineStats s = (*engine)->stats();
  EXPECT_GT(s.n_preemptions, 0);
  EXPECT_EQ(s.n_free_blocks, s.n_blocks);
}

// F16 KV cache: the same bits whatever the batch, so a batched (chunked) run and a
// preempted one equal each request alone through an F16 engine of the same block size
// (block boundaries cut the attention's key steps), token for token.
TEST_F(EngineTest, F16CacheBatchedAndPreemptedRunsEqualAloneRuns) {
  const std::vector<Req> reqs = random_requests(12, 100, 8);
  auto alone_runs = [&](int block_size) {
    std::vector<std::vector<int32_t>> out;
    for (const Req& r : reqs) {
      auto engine = LlmEngine::create(*model_, config(1600 / block_size, block_size, DType::kF16));
      EXPECT_TRUE(engine.ok()) << engine.status().message();
      if (!engine.ok()) break;
      out.push_back(run(**engine, {r})[0]);
    }
    return out;
  };
  for (int block_size : {4, 16, 128}) {
    auto engine = LlmEngine::create(*model_, config(1600 / block_size, block_size, DType::kF16));
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    EXPECT_EQ(run(**engine, reqs), alone_runs(block_size)) << "block size " << block_size;
    EXPECT_EQ((*engine)->stats().n_preemptions, 0);
  }
  auto tight = LlmEngine::create(*model_, config(40, 4, DType::kF16));
  ASSERT_TRUE(tight.ok()) << tight.status().message();
  EXPECT_EQ(run(**tight, reqs), alone_runs(4));
  const EngineStats s = (*tight)->stats();
  EXPECT_GT(s.n_preemptions, 0);
  EXPECT_EQ(s.n_free_blocks, s.n_blocks);
}

// The block budget counts the cache's real bytes: F16 halves bytes per token, so the
// same memory holds twice the blocks.
TEST_F(EngineTest, F16CacheHoldsTwiceTheBlocks) {
  EXPECT_EQ(model_->paged_bytes_per_token(DType::kF32),
            size_t{2} * kLayers * kKvHeads * kHeadDim * sizeof(float));
  EXPECT_EQ(model_->paged_bytes_per_token(DType::kF16) * 2,
            model_->paged_bytes_per_token(DType::kF32));
  EngineConfig c = config(100);  // 100 F32 blocks' worth of memory
  auto f32 = LlmEngine::create(*model_, c);
  c.kv_cache_dtype = DType::kF16;
  auto f16 = LlmEngine::create(*model_, c);
  ASSERT_TRUE(f32.ok() && f16.ok());
  EXPECT_EQ((*f32)->stats().n_blocks, 100);
  EXPECT_EQ((*f16)->stats().n_blocks, 200);
  c.kv_cache_dtype = DType::kBF16;
  EXPECT_EQ(LlmEngine::create(*model_, c).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, PrefixCachingSkipsTheSharedPrefix) {
  std::vector<Req> reqs = random_requests(2, 1, 3);
  std::vector<int32_t> prefix(50);
  for (size_t i = 0; i < prefix.size(); ++i) prefix[i] = static_cast<int32_t>((i * 7) % kVocab);
  reqs[0].prompt.insert(reqs[0].prompt.begin(), prefix.begin(), prefix.end());
  reqs[1].prompt.insert(reqs[1].prompt.begin(), prefix.begin(), prefix.end());
  auto engine = LlmEngine::create(*model_, config(100));
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ(run(**engine, {reqs[0]})[0], solo(reqs[0]));
  const EngineStats a = (*engine)->stats();
  EXPECT_EQ(run(**engine, {reqs[1]})[0], solo(reqs[1]));
  const EngineStats b = (*engine)->stats();
  EXPECT_EQ(b.n_prefix_hit_tokens - a.n_prefix_hit_tokens, 48);  // 12 full blocks of 4
  EXPECT_EQ(b.n_computed_tokens - a.n_computed_tokens,
            static_cast<int64_t>(reqs[1].prompt.size()) - 48 + reqs[1].options.max_tokens - 1);
}

TEST_F(EngineTest, BadRequestsAreRefusedAndOthersGoOn) {
  auto engine = LlmEngine::create(*model_, config(40));
  ASSERT_TRUE(engine.ok());
  LlmEngine& e = **engine;
  const std::vector<Req> good = random_requests(3, 20, 4);
  ASSERT_TRUE(e.add_request(100, good[0].prompt, good[0].options).ok());
  SamplingOptions bad = greedy(4);
  bad.temperature = -1.0f;
  EXPECT_EQ(e.add_request(1, {1, 2}, bad).code(), StatusCode::kInvalidArgument);
  bad = greedy(4);
  bad.top_p = 0.0f;
  EXPECT_EQ(e.add_request(1, {1, 2}, bad).code(), StatusCode::kInvalidArgument);
  bad = greedy(4);
  bad.top_k = -2;
  EXPECT_EQ(e.add_request(1, {1, 2}, bad).code(), StatusCode::kInvalidArgument);
  bad = greedy(4);
  bad.n = 0;
  EXPECT_EQ(e.add_request(1, {1, 2}, bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.add_request(1, {1, kVocab}, greedy(4)).code(), StatusCode::kInvalidArgument);
  bad = greedy(4);
  bad.logit_bias = {{kVocab, 1.0f}};
  EXPECT_EQ(e.add_request(1, {1, 2}, bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.add_request(1, std::vector<int32_t>(161, 1), greedy(4)).code(),
            StatusCode::kInvalidArgument);  // longer than max_model_len (161)
  // (A request that cannot fit even alone cannot reach add_request: create() refuses a
  // cache smaller than one max_model_len request; the scheduler tests cover the check.)
  EXPECT_EQ(e.add_request(100, {1}, greedy(1)).code(), StatusCode::kInvalidArgument);  // dup
  EXPECT_EQ(e.stats().n_waiting, 1);
  std::vector<int32_t> out;
  while (e.has_unfinished_requests()) {
    auto step = e.step();
    ASSERT_TRUE(step.ok());
    for (const EngineOutput& o : *step)
      out.insert(out.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  }
  EXPECT_EQ(out, solo(good[0]));
}

TEST_F(EngineTest, AbortAtAnyStepReturnsEveryBlock) {
  const std::vector<Req> reqs = random_requests(8, 60, 5);
  for (int abort_step = 0; abort_step < 6; ++abort_step) {
    auto engine = LlmEngine::create(*model_, config(60));
    ASSERT_TRUE(engine.ok());
    LlmEngine& e = **engine;
    for (size_t i = 0; i < reqs.size(); ++i)
      ASSERT_TRUE(e.add_request(i, reqs[i].prompt, reqs[i].options).ok());
    for (int s = 0; s < abort_step && e.has_unfinished_requests(); ++s) ASSERT_TRUE(e.step().ok());
    for (size_t i = 0; i < reqs.size(); i += 2) (void)e.abort_request(i);
    while (e.has_unfinished_requests()) ASSERT_TRUE(e.step().ok());
    EXPECT_EQ(e.stats().n_free_blocks, e.stats().n_blocks);
    EXPECT_TRUE(e.scheduler().check_invariants().ok());
  }
}

TEST_F(EngineTest, SeededSamplingIsTheSameAloneAndInABatch) {
  std::vector<Req> reqs = random_requests(8, 40, 6);
  for (Req& r : reqs) {
    r.options.temperature = 0.9f;
    r.options.top_p = 0.9f;
    r.options.seed = 1234;
  }
  auto batch_engine = LlmEngine::create(*model_, config(200));
  ASSERT_TRUE(batch_engine.ok());
  const auto batched = run(**batch_engine, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto alone = LlmEngine::create(*model_, config(200));
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ(run(**alone, {reqs[i]})[0], batched[i]) << i;
  }
}

// Prompt-lookup drafts verified inside the batch: greedy and seeded-sampled requests
// (with penalties) give the tokens they give without drafts, with ample blocks and
// with a pool so small that requests are preempted; every block comes back.
TEST_F(EngineTest, SpeculativeDecodingKeepsEveryOutput) {
  std::vector<Req> reqs = random_requests(12, 30, 9);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Req& r = reqs[i];
    const std::vector<int32_t> passage = r.prompt;
    for (int k = 0; k < 2; ++k) r.prompt.insert(r.prompt.end(), passage.begin(), passage.end());
    r.options.max_tokens = 10 + static_cast<int>(i);
    if (i % 2 == 1) {
      r.options.temperature = 0.8f;
      r.options.repetition_penalty = 1.1f;
      r.options.seed = 40 + i;
    }
  }
  spec::SpeculativeConfig ngram;
  ngram.method = spec::SpeculativeMethod::kNgram;
  ngram.num_speculative_tokens = 3;
  ngram.prompt_lookup_min = 1;
  ngram.prompt_lookup_max = 3;
  for (int n_blocks : {400, 60}) {
    auto plain = LlmEngine::create(*model_, config(n_blocks));
    ASSERT_TRUE(plain.ok());
    const auto want = run(**plain, reqs);
    EngineConfig c = config(n_blocks);
    c.speculative = ngram;
    auto spec = LlmEngine::create(*model_, c);
    ASSERT_TRUE(spec.ok());
    const auto got = run(**spec, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;
    const EngineStats s = (*spec)->stats();
    EXPECT_GT(s.spec.n_draft_tokens, 0);
    EXPECT_EQ(s.n_free_blocks, s.n_blocks);
    if (n_blocks == 60) {
      EXPECT_GT(s.n_preemptions, 0);
    }
  }
}

// DeepSeek's MTP drafts (a tiny random V3 with an MTP layer) verified inside the
// batch, 1 to 3 per step, greedy and seeded-sampled, with ample blocks and a pool that
// preempts: the tokens of plain decoding; every block comes back. (Random MTP weights:
// drafts are rejected, so every verify step corrects.)
TEST(EngineMtpTest, MtpDraftsKeepEveryOutput) {
  set_log_level("warning");
  std::unique_ptr<Backend> backend = make_cpu_backend({});
  auto load = [&] {
    Result<std::unique_ptr<ModelFiles>> files = ModelFiles::open(tiny_deepseek::write());
    EXPECT_TRUE(files.ok());
    return load_causal_lm(std::move(*files), *backend, tiny_deepseek::kContext);
  };
  Result<std::unique_ptr<CausalLm>> plain_model = load(), mtp_model = load();
  ASSERT_TRUE(plain_model.ok() && mtp_model.ok()) << plain_model.status().message();
  std::mt19937 rng(3);
  std::vector<std::pair<std::vector<int32_t>, SamplingOptions>> reqs;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 40);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % tiny_deepseek::kVocab);
    SamplingOptions o = greedy(6 + i);
    if (i % 2 == 1) {
      o.temperature = 0.8f;
      o.seed = 70 + i;
    }
    reqs.emplace_back(std::move(prompt), o);
  }
  auto run_all = [&](CausalLm& model, int n_blocks, int n_drafts, EngineStats* stats) {
    EngineConfig c;
    c.block_size = 4;
    c.kv_cache_dtype = DType::kF32;
    c.max_num_batched_tokens = 32;
    if (n_drafts > 0) {
      c.speculative.method = spec::SpeculativeMethod::kMtp;
      c.speculative.num_speculative_tokens = n_drafts;
      EXPECT_TRUE(model.enable_mtp().ok());  // so that the bytes per block count it
    }
    c.kv_cache_memory = int64_t{n_blocks} * c.block_size *
                        static_cast<int64_t>(model.paged_bytes_per_token(c.kv_cache_dtype));
    c.max_model_len = 100;
    auto e = LlmEngine::create(model, c);
    EXPECT_TRUE(e.ok()) << e.status().message();
    std::vector<std::vector<int32_t>> out(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_TRUE((*e)->add_request(i, reqs[i].first, reqs[i].second).ok());
    }
    while ((*e)->has_unfinished_requests()) {
      Result<std::vector<EngineOutput>> step = (*e)->step();
      EXPECT_TRUE(step.ok()) << step.status().message();
      if (!step.ok()) break;
      for (const EngineOutput& o : *step) {
        out[o.id].insert(out[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      }
      EXPECT_TRUE((*e)->scheduler().check_invariants().ok());
    }
    *stats = (*e)->stats();
    return out;
  };
  for (int n_blocks : {200, 30}) {
    EngineStats ps, ms;
    const auto want = run_all(**plain_model, n_blocks, 0, &ps);
    for (int n : {1, 3}) {
      const auto got = run_all(**mtp_model, n_blocks, n, &ms);
      for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], want[i]) << i << " N=" << n;
      EXPECT_GT(ms.spec.n_draft_tokens, 0);
      EXPECT_EQ(ms.n_free_blocks, ms.n_blocks);
      if (n_blocks == 30) {
        EXPECT_GT(ms.n_preemptions, 0);
      }
    }
  }
}

TEST_F(EngineTest, TooSmallKvBudgetSuggestsAValue) {
  EngineConfig c = config(10);
  c.max_model_len = kContext;  // 40 slots < 511
  auto engine = LlmEngine::create(*model_, c);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(engine.status().message().find("--kv-cache-memory"), std::string::npos)
      << engine.status().message();
}

TEST_F(EngineTest, LogprobsComeWithTheTokens) {
  Req r = random_requests(1, 10, 7)[0];
  r.options.logprobs = 3;
  auto engine = LlmEngine::create(*model_, config(50));
  ASSERT_TRUE(engine.ok());
  LlmEngine& e = **engine;
  ASSERT_TRUE(e.add_request(0, r.prompt, r.options).ok());
  int n = 0;
  while (e.has_unfinished_requests()) {
    auto step = e.step();
    ASSERT_TRUE(step.ok());
    for (const EngineOutput& o : *step) {
      ASSERT_EQ(o.logprobs.size(), o.new_token_ids.size());
      for (const SampleResult& lp : o.logprobs) {
        EXPECT_EQ(lp.top_logprobs.size(), 3u);
        EXPECT_EQ(lp.rank, 1);  // greedy
        EXPECT_LE(lp.logprob, 0.0f);
      }
      n += static_cast<int>(o.new_token_ids.size());
    }
  }
  EXPECT_EQ(n, r.options.max_tokens);
}

}  // namespace
}  // namespace dserve

namespace dserve {
namespace {

// n > 1: the prompt is computed once (the forks take its blocks and recompute only its
// last token); greedy forks all equal the solo run; seeded fork j equals a lone request
// seeded with seed + j; aborting one fork leaves the others going; no block leaks.
TEST_F(EngineTest, ParallelSamplingSharesThePrompt) {
  Req r = random_requests(1, 1, 8)[0];
  r.prompt.resize(70);
  for (size_t i = 0; i < r.prompt.size(); ++i) r.prompt[i] = static_cast<int32_t>((i * 5) % kVocab);
  r.options = greedy(6);
  r.options.n = 3;
  auto engine = LlmEngine::create(*model_, config(100));
  ASSERT_TRUE(engine.ok());
  LlmEngine& e = **engine;
  const std::vector<RequestId> forks = {1, 2};
  ASSERT_TRUE(e.add_request(0, r.prompt, r.options, forks).ok());
  EXPECT_EQ(e.add_request(5, r.prompt, r.options, std::vector<RequestId>{6}).code(),
            StatusCode::kInvalidArgument);  // n = 3 needs two fork ids
  std::vector<std::vector<int32_t>> out(3);
  while (e.has_unfinished_requests()) {
    auto step = e.step();
    ASSERT_TRUE(step.ok());
    for (const EngineOutput& o : *step) {
      out[o.id].insert(out[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
  }
  Req one = r;
  one.options.n = 1;
  const std::vector<int32_t> want = solo(one);
  for (const auto& o : out) EXPECT_EQ(o, want);
  const EngineStats s = e.stats();
  // Prompt once, the last prompt token again per fork, then 5 decode steps each.
  EXPECT_EQ(s.n_computed_tokens, 70 + 2 + 3 * 5);
  EXPECT_EQ(s.n_free_blocks, s.n_blocks);

  // Seeded: fork j samples like a lone request seeded with seed + j.
  Req seeded = r;
  seeded.options.temperature = 1.0f;
  seeded.options.seed = 77;
  seeded.options.n = 2;
  auto e2 = LlmEngine::create(*model_, config(100));
  ASSERT_TRUE(e2.ok());
  ASSERT_TRUE((*e2)->add_request(0, seeded.prompt, seeded.options, std::vector<RequestId>{1}).ok());
  std::vector<std::vector<int32_t>> got(2);
  while ((*e2)->has_unfinished_requests()) {
    auto step = (*e2)->step();
    ASSERT_TRUE(step.ok());
    for (const EngineOutput& o : *step)
      got[o.id].insert(got[o.id].end(), o.new_token_ids.begin(), o.new_token_ids.end());
  }
  for (int j = 0; j < 2; ++j) {
    Req lone = seeded;
    lone.options.n = 1;
    lone.options.seed = 77 + j;
    auto e3 = LlmEngine::create(*model_, config(100));
    ASSERT_TRUE(e3.ok());
    EXPECT_EQ(run(**e3, {lone})[0], got[j]) << j;
  }
}

}  // namespace
}  // namespace dserve
