#include "cli/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <vector>

#include "model/causal_lm.h"
#include "sampling/log_softmax.h"
#include "tokenizer/tokenizer.h"

namespace dserve::cli {
namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open file");
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return io_error(path + ": read failed");
  return s.str();
}

// One scored position: the model's log-probability of tokens[position] given
// tokens before it in the same window, and its top-1 guess for that position.
struct Scored {
  int64_t position;
  int32_t token_id;
  double logprob;
  int32_t top_id;
};

Status perplexity(const PerplexityOptions& o) {
  if (o.file.empty() == o.token_ids_file.empty()) {
    return invalid_argument("give exactly one of --file TEXT and --token-ids FILE");
  }
  if (o.ctx < 0) return invalid_argument("--ctx must not be negative");
  if (o.batch <= 0) return invalid_argument("--batch must be positive");

  // Opened first so that an unwritable path fails before minutes of scoring.
  std::ofstream json_out;
  if (!o.logprobs_out.empty()) {
    json_out.open(o.logprobs_out);
    if (!json_out) return io_error(o.logprobs_out + ": cannot open for writing");
  }

  DS_ASSIGN_OR_RETURN(std::unique_ptr<ModelFiles> files, open_model_files(o.common));
  DS_ASSIGN_OR_RETURN(ModelInfo config, read_model_info(*files));

  std::vector<int32_t> tokens;
  if (!o.file.empty()) {
    DS_ASSIGN_OR_RETURN(std::string text, read_file(o.file));
    DS_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::from_model_files(*files));
    tokens = tokenizer->encode(text, /*add_special_tokens=*/true);
  } else {
    DS_ASSIGN_OR_RETURN(std::string text, read_file(o.token_ids_file));
    DS_ASSIGN_OR_RETURN(tokens, parse_id_list(text, o.token_ids_file));
  }
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  if (n_tokens < 2)
    return invalid_argument("need at least 2 tokens to score, got " + std::to_string(n_tokens));
  for (int32_t id : tokens) {
    if (id >= config.vocab_size) {
      return invalid_argument("token id " + std::to_string(id) +
                              " is outside the model's vocabulary of " +
                              std::to_string(config.vocab_size));
    }
  }
  const int64_t ctx = o.ctx > 0 ? o.ctx : std::min(n_tokens, config.max_position_embeddings);
  if (ctx < 2) return invalid_argument("--ctx must be at least 2");
  if (ctx > config.max_position_embeddings) {
    return invalid_argument("--ctx " + std::to_string(ctx) + " exceeds the model's context of " +
                            std::to_string(config.max_position_embeddings));
  }

  DS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_backend(o.common));
  DS_ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> model,
                      load_model_on_ranks(o.tp, std::move(files), *backend, ctx,
                                          "perplexity model=" + o.common.model +
                                              " ctx=" + std::to_string(ctx)));
  std::unique_ptr<SequenceCache> kv = model->new_cache();
  const int64_t vocab = config.vocab_size;

  // Non-overlapping windows of ctx tokens, each from an empty cache; inside a window
  // every token but the first is scored against the logits of the one before it.
  std::vector<Scored> scored;
  scored.reserve(n_tokens);
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t start = 0; start + 1 < n_tokens; start += ctx) {
    const int64_t len = std::min(ctx, n_tokens - start);
    if (len < 2) break;
    kv->clear();
    for (int64_t b = 0; b < len; b += o.batch) {
      const int64_t n = std::min(o.batch, len - b);
      std::vector<int32_t> positions(n);
      std::iota(positions.begin(), positions.end(), static_cast<int32_t>(b));
      const std::span<const int32_t> batch(tokens.data() + start + b, n);
      DS_RETURN_IF_ERROR(model->forward(batch, positions, *kv, LogitsFor::kAll, &logits));
      for (int64_t t = 0; t < n; ++t) {
        const int64_t target = b + t + 1;  // window-relative index being predicted
        if (target >= len) break;
        const std::span<const float> row(logits.data() + t * vocab, vocab);
        const int32_t id = tokens[start + target];
        scored.push_back({start + target, id, log_prob(row, id), argmax(row)});
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  double nll = 0.0;
  for (const Scored& s : scored) nll -= s.logprob;
  const double ppl = std::exp(nll / static_cast<double>(scored.size()));
  std::printf("perplexity: %.6f\n", ppl);
  std::fflush(stdout);
  std::fprintf(stderr, "%zu tokens scored in windows of %lld, %.2f s (%.1f tokens/s)\n",
               scored.size(), static_cast<long long>(ctx), seconds,
               n_tokens / std::max(seconds, 1e-9));

  if (!o.logprobs_out.empty()) {
    nlohmann::json j;
    j["perplexity"] = ppl;
    j["ctx"] = ctx;
    j["input_ids"] = tokens;
    nlohmann::json rows = nlohmann::json::array();
    for (const Scored& s : scored) {
      rows.push_back({{"position", s.position},
                      {"token_id", s.token_id},
                      {"logprob", s.logprob},
                      {"top_id", s.top_id}});
    }
    j["scored"] = std::move(rows);
    json_out << j.dump() << '\n';
    json_out.close();
    if (!json_out) return io_error(o.logprobs_out + ": write failed");
  }
  return Status::Ok();
}

}  // namespace

int run_perplexity(const PerplexityOptions& options) {
  Status s = perplexity(options);
  if (!s.ok()) return report_error(s);
  return 0;
}

}  // namespace dserve::cli
