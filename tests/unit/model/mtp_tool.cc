// mtp_tool: test-only driver of a DeepSeek model's MTP layer for
// tests/reference/test_deepseek_mtp.py. Runs the main model over a prompt (one
// sequence, paged), then the MTP layer over every position p < n - 1 with the next
// prompt token and the main model's hidden state at p, and prints JSON
// {"logits": [[vocab floats] per position]} on stdout.
//   mtp_tool --model DIR --prompt-ids 1,2,3 [--threads N]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "backend/backend.h"
#include "base/log.h"
#include "loader/model_files.h"
#include "model/causal_lm.h"

namespace dserve {
namespace {

int fail(const Status& s) {
  std::fprintf(stderr, "mtp_tool: error: %s\n", s.message().c_str());
  return 1;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"mtp_tool"};
  std::string model_path, ids_text;
  int n_threads = 0;
  app.add_option("--model", model_path)->required();
  app.add_option("--prompt-ids", ids_text)->required();
  app.add_option("--threads", n_threads);
  CLI11_PARSE(app, argc, argv);
  set_log_level("warning");
  std::vector<int32_t> prompt;
  std::stringstream in(ids_text);
  for (std::string t; std::getline(in, t, ',');) prompt.push_back(std::stoi(t));
  const int n = static_cast<int>(prompt.size());
  if (n < 2) return fail(invalid_argument("at least two prompt tokens"));

  Result<std::unique_ptr<ModelFiles>> files = ModelFiles::open(model_path);
  if (!files.ok()) return fail(files.status());
  CpuBackendOptions bo;
  bo.n_threads = n_threads;
  std::unique_ptr<Backend> backend = make_cpu_backend(bo);
  Result<std::unique_ptr<CausalLm>> model = load_causal_lm(std::move(*files), *backend, n + 16);
  if (!model.ok()) return fail(model.status());
  CausalLm& lm = **model;
  if (Status s = lm.enable_mtp(); !s.ok()) return fail(s);
  constexpr int kBlock = 16;
  const int n_blocks = (n + kBlock - 1) / kBlock;
  Result<std::unique_ptr<PagedCache>> cache = lm.new_paged_cache(n_blocks, kBlock, DType::kF32);
  if (!cache.ok()) return fail(cache.status());

  std::vector<int32_t> positions(n), seq(n, 0), table(n_blocks);
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(table.begin(), table.end(), 0);
  const std::vector<int64_t> offsets = {0, n_blocks};
  const std::vector<int32_t> last = {n - 1};
  ModelBatch target{prompt, positions, seq, table, offsets, last, {}};
  std::vector<float> logits;
  if (Status s = lm.forward_batch(target, **cache, &logits); !s.ok()) return fail(s);

  // MTP: position p pairs the token at p + 1 with the main model's state at p.
  const int m = n - 1;
  std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
  std::vector<int32_t> rows(m);
  std::iota(rows.begin(), rows.end(), 0);
  ModelBatch draft{next, std::span<const int32_t>(positions).first(m),
                   std::span<const int32_t>(seq).first(m), table, offsets, rows, {}};
  if (Status s = lm.forward_mtp(draft, **cache, rows, /*prev_is_target=*/true, &logits); !s.ok()) {
    return fail(s);
  }
  const int64_t vocab = lm.info().vocab_size;
  nlohmann::json out = nlohmann::json::array();
  for (int p = 0; p < m; ++p) {
    out.push_back(std::vector<float>(logits.begin() + p * vocab, logits.begin() + (p + 1) * vocab));
  }
  std::printf("%s\n", nlohmann::json{{"logits", out}}.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace dserve

int main(int argc, char** argv) { return dserve::main_impl(argc, argv); }
