#include "cli/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

#include "base/log.h"
#include "model/causal_lm.h"
#include "sampling/sampler.h"
#include "sampling/stop_string_matcher.h"
#include "tokenizer/tokenizer.h"

namespace dserve::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Status generate(const GenerateOptions& o) {
  if (o.max_tokens <= 0) return invalid_argument("--max-tokens must be positive");
  if (o.prompt.empty() == o.prompt_ids.empty()) {
    return invalid_argument("give exactly one of --prompt TEXT and --prompt-ids IDS");
  }
  SamplingOptions sampling = o.sampling;
  sampling.max_tokens = o.max_tokens;
  sampling.seed = o.seed;
  sampling.ignore_eos = o.ignore_eos;
  DS_ASSIGN_OR_RETURN(SamplingParams params, SamplingParams::create(std::move(sampling)));

  DS_ASSIGN_OR_RETURN(std::unique_ptr<ModelFiles> files, open_model_files(o.common));
  DS_ASSIGN_OR_RETURN(ModelInfo config, read_model_info(*files));

  // The tokenizer is needed to encode a text prompt, to print text and to find stop
  // strings; with --prompt-ids --print-ids the model runs without one (tiny test
  // checkpoints).
  const bool need_text = !o.print_ids || !params.stop().empty();
  std::unique_ptr<Tokenizer> tokenizer;
  if (!o.prompt.empty() || need_text) {
    DS_ASSIGN_OR_RETURN(tokenizer, Tokenizer::from_model_files(*files));
  }
  std::vector<int32_t> prompt;
  if (!o.prompt.empty()) {
    prompt = tokenizer->encode(o.prompt, /*add_special_tokens=*/true);
    if (prompt.empty()) return invalid_argument("the prompt encodes to no tokens");
  } else {
    DS_ASSIGN_OR_RETURN(prompt, parse_id_list(o.prompt_ids, "--prompt-ids"));
  }
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt >= config.max_position_embeddings) {
    return invalid_argument("the prompt has " + std::to_string(n_prompt) +
                            " tokens; the model's context is " +
                            std::to_string(config.max_position_embeddings));
  }
  const int64_t context =
      std::min<int64_t>(config.max_position_embeddings, n_prompt + o.max_tokens);

  std::vector<int32_t> eos_ids = config.eos_ids;
  if (tokenizer) {
    for (int32_t id : tokenizer->stop_ids()) eos_ids.push_back(id);
  }

  DS_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_backend(o.common));
  DS_ASSIGN_OR_RETURN(std::unique_ptr<CausalLm> model,
                      load_model_on_ranks(o.tp, std::move(files), *backend, context,
                                          "generate model=" + o.common.model +
                                              " ctx=" + std::to_string(context)));
  std::unique_ptr<SequenceCache> kv = model->new_cache();
  SamplingState state(params, prompt, eos_ids);
  Sampler sampler;
  StopStringMatcher stop_strings(params.stop(), params.include_stop_str_in_output());
  std::unique_ptr<IncrementalDecoder> decoder;
  if (need_text) decoder = std::make_unique<IncrementalDecoder>(*tokenizer);

  std::vector<float> logits;
  std::vector<int32_t> positions(prompt.size());
  std::iota(positions.begin(), positions.end(), 0);

  // Prefill: the whole prompt in one batch; logits of its last token only.
  const Clock::time_point t_prompt = Clock::now();
  DS_RETURN_IF_ERROR(model->forward(prompt, positions, *kv, LogitsFor::kLast, &logits));
  const double prompt_s = seconds_since(t_prompt);

  // Decode: one token per step.
  std::vector<int32_t> generated;
  const Clock::time_point t_decode = Clock::now();
  int64_t n_decode_steps = 0;
  while (true) {
    const int32_t next = sampler.sample(state, logits).token;
    const std::optional<FinishReason> finish = state.accept(next);
    if (finish == FinishReason::kStop) break;  // an end-of-sequence or stop id: not output
    generated.push_back(next);
    if (decoder) {
      const StopStringMatcher::Output out = stop_strings.add(decoder->add(next));
      if (!o.print_ids) {
        std::fwrite(out.text.data(), 1, out.text.size(), stdout);
        std::fflush(stdout);
      }
      if (out.stopped) break;
    }
    if (finish == FinishReason::kLength || kv->n_tokens() >= context) break;
    const int32_t pos = static_cast<int32_t>(kv->n_tokens());
    DS_RETURN_IF_ERROR(model->forward({&next, 1}, {&pos, 1}, *kv, LogitsFor::kLast, &logits));
    ++n_decode_steps;
  }
  const double decode_s = seconds_since(t_decode);

  if (!o.print_ids) {
    std::string rest;
    if (!stop_strings.stopped()) {
      const StopStringMatcher::Output out = stop_strings.add(decoder->flush());
      rest = out.text;
      if (!out.stopped) rest += stop_strings.flush();
    }
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
  } else {
    for (size_t i = 0; i < generated.size(); ++i) std::printf("%s%d", i ? "," : "", generated[i]);
    std::printf("\n");
  }
  std::fflush(stdout);

  // Decode is bound by memory bandwidth: every step reads all the weights once.
  const double decode_tps = n_decode_steps / std::max(decode_s, 1e-9);
  const double weight_mib = model->weight_bytes_per_token() / (1024.0 * 1024.0);
  std::fprintf(stderr,
               "prompt: %lld tokens in %.3f s (%.1f tokens/s); decode: %lld tokens in %.3f s "
               "(%.1f tokens/s, %.0f MiB of weights/token, %.2f GB/s); KV cache %zu bytes/token; "
               "%s\n",
               static_cast<long long>(n_prompt), prompt_s, n_prompt / std::max(prompt_s, 1e-9),
               static_cast<long long>(n_decode_steps), decode_s, decode_tps, weight_mib,
               decode_tps * model->weight_bytes_per_token() / 1e9, kv->bytes_per_token(),
               std::string(backend->name()).c_str());
  if (const std::string stats = model->stats(); !stats.empty()) DS_LOG_INFO("{}", stats);
  return Status::Ok();
}

}  // namespace

int run_generate(const GenerateOptions& options) {
  Status s = generate(options);
  if (!s.ok()) return report_error(s);
  return 0;
}

}  // namespace dserve::cli
