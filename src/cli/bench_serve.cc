#include "cli/bench_serve.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>

#include "base/log.h"
#include "base/progress_bar.h"
#include "cli/bench_datasets.h"
#include "cli/bench_metrics.h"
#include "cli/cli_common.h"
#include "cli/http_stream_client.h"
#include "tokenizer/tokenizer.h"

namespace dserve::cli {
namespace {

constexpr auto kMaxPollWait = std::chrono::milliseconds(100);
constexpr auto kModelsTimeout = std::chrono::seconds(10);
constexpr const char* kNoFirstChunk =
    "Never received a valid chunk to calculate TTFT. This response will be marked as failed!";

// The options, checked once (make_plan) and completed with the served model's name;
// constant from then on.
struct ServePlan {
  bool chat = false;
  std::string server_url;     // scheme://host:port, for /v1/models
  std::string api_url;        // server_url + endpoint
  std::string model_id;       // --model as given (or the server's), for the report
  std::string request_model;  // what "model" says in each request
  std::string tokenizer_path;
  double request_rate = INFINITY;
  double burstiness = 1.0;
  std::optional<int> max_concurrency;
  std::vector<std::string> percentile_metrics;
  std::vector<double> percentiles;
  GoodputSlos slos;
  std::vector<std::string> headers;
};

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string strip_trailing_slash(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

// "20250101-120000", vLLM's date format for results and file names.
std::string now_compact() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

Result<double> parse_request_rate(const std::string& s) {
  if (s == "inf" || s == "Inf" || s == "INF") return INFINITY;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v > 0)) {
    return invalid_argument("--request-rate " + s + ": expected 'inf' or requests/s > 0");
  }
  return v;
}

Result<ServePlan> make_plan(const BenchServeOptions& o) {
  ServePlan p;
  if (o.backend != "openai" && o.backend != "openai-chat") {
    return invalid_argument("--backend " + o.backend + ": expected openai or openai-chat");
  }
  p.chat = o.backend == "openai-chat";
  const std::string endpoint =
      !o.endpoint.empty() ? o.endpoint : (p.chat ? "/v1/chat/completions" : "/v1/completions");
  const bool chat_endpoint = endpoint.ends_with("chat/completions");
  if (p.chat && !chat_endpoint) {
    return invalid_argument(
        "--backend openai-chat needs an --endpoint ending in chat/completions, "
        "not " +
        endpoint);
  }
  if (!p.chat && chat_endpoint) {
    return invalid_argument("--endpoint " + endpoint +
                            " is a chat endpoint: use --backend openai-chat");
  }
  if (!o.base_url.empty() && (!o.host.empty() || o.port != 0)) {
    return invalid_argument("give either --base-url or --host/--port, not both");
  }
  if (o.port < 0 || o.port > 65535) return invalid_argument("--port must be in 1..65535");
  p.server_url = !o.base_url.empty()
                     ? strip_trailing_slash(o.base_url)
                     : "http://" + (o.host.empty() ? std::string("127.0.0.1") : o.host) + ":" +
                           std::to_string(o.port == 0 ? 8000 : o.port);
  if (p.server_url.find("://") == std::string::npos) {
    return invalid_argument("--base-url " + o.base_url + ": expected http://HOST:PORT");
  }
  p.api_url = p.server_url + (endpoint.starts_with('/') ? "" : "/") + endpoint;

  if (o.num_prompts < 1) return invalid_argument("--num-prompts must be >= 1");
  DS_ASSIGN_OR_RETURN(p.request_rate, parse_request_rate(o.request_rate));
  if (!(o.burstiness > 0)) return invalid_argument("--burstiness must be > 0");
  p.burstiness = o.burstiness;
  if (o.max_concurrency && *o.max_concurrency < 1) {
    return invalid_argument("--max-concurrency must be >= 1");
  }
  p.max_concurrency = o.max_concurrency;
  DS_ASSIGN_OR_RETURN(p.percentile_metrics, parse_percentile_metrics(o.percentile_metrics));
  DS_ASSIGN_OR_RETURN(p.percentiles, parse_metric_percentiles(o.metric_percentiles));
  DS_ASSIGN_OR_RETURN(p.slos, parse_goodput(o.goodput));

  if (o.dataset_name != "random" && o.dataset_name != "sharegpt" &&
      o.dataset_name != "prefix-repetition") {
    return invalid_argument("--dataset-name " + o.dataset_name +
                            ": expected random, sharegpt or prefix-repetition");
  }
  if (o.dataset_name == "sharegpt" && o.dataset_path.empty()) {
    return invalid_argument("--dataset-name sharegpt needs --dataset-path");
  }
  if (o.dataset_name != "sharegpt" && !o.dataset_path.empty()) {
    return invalid_argument("--dataset-path is for --dataset-name sharegpt, not " + o.dataset_name);
  }
  if (o.sharegpt_output_len && *o.sharegpt_output_len < 1) {
    return invalid_argument("--sharegpt-output-len must be >= 1");
  }
  if (!o.save_result && (!o.result_dir.empty() || !o.result_filename.empty())) {
    return invalid_argument("--result-dir and --result-filename need --save-result");
  }

  p.model_id = o.model;
  if (!o.tokenizer.empty()) {
    p.tokenizer_path = o.tokenizer;
  } else if (!o.model.empty() && path_exists(o.model)) {
    p.tokenizer_path = o.model;
  } else {
    p.tokenizer_path = default_model_path();
  }

  const std::string api_key = !o.api_key.empty() ? o.api_key : env_or_empty("OPENAI_API_KEY");
  p.headers = {"Content-Type: application/json", "Accept: text/event-stream",
               "Expect:"};  // no 100-continue round trip for large prompts
  if (!api_key.empty()) p.headers.push_back("Authorization: Bearer " + api_key);

  return p;
}

// Where --save-result writes: --result-dir / (--result-filename, or vLLM's
// BACKEND-RATEqps[-concurrencyN]-MODEL-DATE.json).
std::string result_path(const ServePlan& p, const BenchServeOptions& o, const std::string& date) {
  std::string name = o.result_filename;
  if (name.empty()) {
    const std::string base_model = p.model_id.substr(p.model_id.find_last_of('/') + 1);
    name = o.backend + "-" + python_float_str(p.request_rate) + "qps" +
           (p.max_concurrency ? "-concurrency" + std::to_string(*p.max_concurrency) : "") + "-" +
           (base_model.empty() ? "model" : base_model) + "-" + date + ".json";
  }
  return o.result_dir.empty() ? name : o.result_dir + "/" + name;
}

// The server's first model, as vLLM picks one when --model is not given.
Result<std::string> first_served_model(const ServePlan& p) {
  Result<std::string> body = http_get(p.server_url + "/v1/models", p.headers, kModelsTimeout);
  if (!body.ok()) {
    return body.status().with_context("--model not given and the server's models are unknown");
  }
  const nlohmann::json j = nlohmann::json::parse(*body, nullptr, false);
  if (j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
      j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string()) {
    return j["data"][0]["id"].get<std::string>();
  }
  return invalid_argument("--model not given and " + p.server_url +
                          "/v1/models lists no model: pass --model");
}

// The server's speculative-decoding counters now, or none when it has no /metrics
// (another server kind): the run then reports no acceptance.
std::optional<SpecDecodeCounts> spec_decode_counts(const ServePlan& p) {
  Result<std::string> body = http_get(p.server_url + "/metrics", p.headers, kModelsTimeout);
  if (!body.ok()) return std::nullopt;
  return parse_spec_decode_counts(*body);
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& path) {
  if (!path_exists(path)) {
    return not_found("tokenizer " + path +
                     " not found: pass --tokenizer PATH (a .gguf file or a Hugging Face "
                     "directory), or run `make model` for the default one");
  }
  return Tokenizer::from_path(path);
}

Result<std::vector<SampleRequest>> load_dataset(const BenchServeOptions& o, const Tokenizer& tok) {
  if (o.dataset_name == "sharegpt") {
    ShareGptOptions so;
    so.path = o.dataset_path;
    so.num_prompts = o.num_prompts;
    so.output_len = o.sharegpt_output_len.value_or(0);
    so.seed = o.seed;
    return sample_sharegpt(tok, so);
  }
  if (o.dataset_name == "prefix-repetition") {
    PrefixRepetitionOptions po;
    po.num_prompts = o.num_prompts;
    po.prefix_len = o.prefix_repetition_prefix_len;
    po.suffix_len = o.prefix_repetition_suffix_len;
    po.num_prefixes = o.prefix_repetition_num_prefixes;
    po.output_len = o.prefix_repetition_output_len;
    po.seed = o.seed;
    return sample_prefix_repetition(tok, po);
  }
  RandomDatasetOptions ro;
  ro.num_prompts = o.num_prompts;
  ro.input_len = o.random_input_len;
  ro.output_len = o.random_output_len;
  ro.range_ratio = o.random_range_ratio;
  ro.prefix_len = o.random_prefix_len;
  ro.seed = o.seed;
  return sample_random(tok, ro);
}

// The JSON body of one streaming request, as vLLM's openai / openai-chat clients send it.
std::string request_body(const ServePlan& p, const BenchServeOptions& o, const SampleRequest& r) {
  nlohmann::json b;
  b["model"] = p.request_model;
  if (p.chat) {
    b["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", r.prompt}}});
    b["max_completion_tokens"] = r.expected_output_len;
  } else {
    b["prompt"] = r.prompt;
  }
  b["max_tokens"] = r.expected_output_len;
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) b["ignore_eos"] = true;
  if (o.temperature) b["temperature"] = *o.temperature;
  return b.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Sends every request on schedule and records what each stream returns. Owns the
// client; all of it runs on the calling thread.
class LoadRun final : public StreamListener {
 public:
  LoadRun(const ServePlan& plan, const BenchServeOptions& options,
          std::span<const SampleRequest> requests)
      : plan_(plan), options_(options), requests_(requests), states_(requests.size()) {}

  // Runs to the last response; returns the benchmark duration in seconds.
  Result<double> run(std::span<const double> arrivals) {
    DS_ASSIGN_OR_RETURN(client_, HttpStreamClient::create(this));
    const int n = static_cast<int>(requests_.size());
    std::unique_ptr<ProgressBar> bar;
    if (!options_.disable_tqdm) bar = std::make_unique<ProgressBar>("bench serve", n);
    std::deque<int> ready;  // arrived, waiting for a concurrency slot
    int next = 0;
    const SteadyTime start = std::chrono::steady_clock::now();
    auto due = [&](int i) {
      return start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(arrivals[i]));
    };
    while (n_done_ < n) {
      const SteadyTime now = std::chrono::steady_clock::now();
      while (next < n && due(next) <= now) ready.push_back(next++);
      while (!ready.empty() &&
             (!plan_.max_concurrency || client_->n_active() < *plan_.max_concurrency)) {
        send(ready.front());
        ready.pop_front();
      }
      auto wait = kMaxPollWait;
      if (next < n && ready.empty()) {
        wait =
            std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(due(next) - now));
      }
      DS_RETURN_IF_ERROR(client_->poll(std::max(wait, std::chrono::milliseconds(0))));
      if (bar && n_done_ < n) bar->update(n_done_);  // the destructor draws 100%
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // Outcomes in dataset order; output tokens from usage, else counted with `tok`.
  std::vector<RequestOutcome> outcomes(const Tokenizer& tok) {
    std::vector<RequestOutcome> out;
    out.reserve(states_.size());
    for (size_t i = 0; i < states_.size(); ++i) {
      RequestState& s = states_[i];
      RequestOutcome& r = s.outcome;
      r.prompt_len = requests_[i].prompt_len;
      if (r.success) {
        r.output_tokens = s.usage_tokens > 0
                              ? s.usage_tokens
                              : static_cast<int>(tok.encode(r.generated_text, false).size());
      }
      out.push_back(std::move(r));
    }
    return out;
  }

 private:
  struct RequestState {
    SteadyTime sent;
    SteadyTime last;  // the latest chunk with a choice
    bool got_first = false;
    int usage_tokens = 0;
    RequestOutcome outcome;
  };

  void send(int i) {
    StreamRequest req;
    req.url = plan_.api_url;
    req.body = request_body(plan_, options_, requests_[i]);
    req.headers = plan_.headers;
    states_[i].sent = std::chrono::steady_clock::now();
    Status s = client_->start(static_cast<uint64_t>(i), std::move(req));
    if (!s.ok()) {
      states_[i].outcome.error = s.message();
      ++n_done_;
    }
  }

  Status on_event(uint64_t id, std::string_view data, SteadyTime time) override {
    RequestState& s = states_[id];
    if (data == "[DONE]") return Status::Ok();
    const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return corrupt("bad SSE data (not a JSON object): " + std::string(data.substr(0, 200)));
    }
    if (auto e = j.find("error"); e != j.end()) {
      return internal_error("error in stream: " +
                            e->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    }
    auto choices = j.find("choices");
    if (choices != j.end() && choices->is_array() && !choices->empty()) {
      const nlohmann::json& c = (*choices)[0];
      const nlohmann::json* text = nullptr;
      if (plan_.chat) {
        if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
          if (auto t = d->find("content"); t != d->end()) text = &*t;
        }
      } else if (auto t = c.find("text"); t != c.end()) {
        text = &*t;
      }
      if (!s.got_first) {
        s.got_first = true;
        s.outcome.ttft = std::chrono::duration<double>(time - s.sent).count();
      } else {
        s.outcome.itl.push_back(std::chrono::duration<double>(time - s.last).count());
      }
      s.last = time;
      if (text != nullptr && text->is_string()) {
        s.outcome.generated_text += text->get_ref<const std::string&>();
      }
    } else if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
      if (auto ct = u->find("completion_tokens"); ct != u->end() && ct->is_number_integer()) {
        s.usage_tokens = ct->get<int>();
      }
    }
    return Status::Ok();
  }

  void on_end(uint64_t id, const StreamEnd& end) override {
    RequestState& s = states_[id];
    ++n_done_;
    if (!end.ok) {
      s.outcome.error = end.error;
      return;
    }
    if (!s.got_first) {
      s.outcome.error = kNoFirstChunk;
      return;
    }
    s.outcome.success = true;
    s.outcome.latency = std::chrono::duration<double>(s.last - s.sent).count();
  }

  const ServePlan& plan_;
  const BenchServeOptions& options_;
  std::span<const SampleRequest> requests_;
  std::vector<RequestState> states_;  // by request index == stream id
  std::unique_ptr<HttpStreamClient> client_;
  int n_done_ = 0;
};

// A thousand streams need a thousand sockets: lift the soft descriptor limit.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// The distinct errors with their counts, most frequent first, on stderr.
void report_failures(std::span<const RequestOutcome> outcomes) {
  std::map<std::string, int> counts;
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) ++counts[o.error];
  }
  if (counts.empty()) return;
  std::vector<std::pair<int, std::string>> sorted;
  for (auto& [e, c] : counts) sorted.emplace_back(c, e);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::fprintf(stderr, "Failed requests by error:\n");
  for (size_t i = 0; i < sorted.size() && i < 5; ++i) {
    std::fprintf(stderr, "  %d x %s\n", sorted[i].first, sorted[i].second.substr(0, 300).c_str());
  }
  if (sorted.size() > 5) std::fprintf(stderr, "  ... %zu more kinds\n", sorted.size() - 5);
}

Status save_result(const ServePlan& p, const BenchServeOptions& o, const std::string& date,
                   const std::string& file, int n_prompts, nlohmann::json result) {
  nlohmann::json j;
  j["date"] = date;
  j["backend"] = o.backend;
  j["model_id"] = p.model_id;
  j["tokenizer_id"] = p.tokenizer_path;
  j["num_prompts"] = n_prompts;
  j["request_rate"] =
      std::isinf(p.request_rate) ? nlohmann::json("inf") : nlohmann::json(p.request_rate);
  j["burstiness"] = p.burstiness;
  j["max_concurrency"] = p.max_concurrency ? nlohmann::json(*p.max_concurrency) : nlohmann::json();
  j.update(result);
  const std::filesystem::path path(file);
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream f(path);
  if (!f) return io_error(path.string() + ": cannot write");
  f << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  if (!f) return io_error(path.string() + ": write failed");
  return Status::Ok();
}

Status bench(const BenchServeOptions& o) {
  const std::string date = now_compact();
  DS_ASSIGN_OR_RETURN(ServePlan draft, make_plan(o));
  if (draft.model_id.empty()) {
    DS_ASSIGN_OR_RETURN(draft.model_id, first_served_model(draft));
  }
  draft.request_model = o.served_model_name.empty() ? draft.model_id : o.served_model_name;
  const ServePlan plan = std::move(draft);
  DS_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, load_tokenizer(plan.tokenizer_path));
  DS_ASSIGN_OR_RETURN(std::vector<SampleRequest> requests, load_dataset(o, *tok));

  raise_fd_limit();
  std::signal(SIGPIPE, SIG_IGN);  // a server closing a socket must not end the run
  std::printf("Traffic request rate: %s\n", python_float_str(plan.request_rate).c_str());
  std::printf("Burstiness factor: %s (%s)\n", python_float_str(plan.burstiness).c_str(),
              plan.burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
  std::printf("Maximum request concurrency: %s\n",
              plan.max_concurrency ? std::to_string(*plan.max_concurrency).c_str() : "None");
  std::fflush(stdout);

  const int n = static_cast<int>(requests.size());
  const std::vector<double> arrivals = arrival_times(n, plan.request_rate, plan.burstiness, o.seed);
  const std::optional<SpecDecodeCounts> spec_before = spec_decode_counts(plan);
  LoadRun load(plan, o, requests);
  DS_ASSIGN_OR_RETURN(const double duration, load.run(arrivals));
  std::optional<SpecDecodeCounts> spec_run = spec_decode_counts(plan);
  if (spec_before && spec_run) spec_run = spec_run->minus(*spec_before);
  const std::vector<RequestOutcome> outcomes = load.outcomes(*tok);

  const BenchmarkMetrics m = calculate_metrics(outcomes, duration, plan.percentiles, plan.slos);
  ReportInfo info;
  info.max_concurrency = plan.max_concurrency;
  info.request_rate = plan.request_rate;
  info.has_goodput = plan.slos.any();
  info.duration_s = duration;
  info.percentile_metrics = plan.percentile_metrics;
  std::fputs(format_result_table(m, info).c_str(), stdout);
  if (spec_run) std::fputs(format_spec_decode_table(*spec_run).c_str(), stdout);
  std::fflush(stdout);
  report_failures(outcomes);
  if (m.completed == 0) DS_LOG_WARN("all requests failed");
  if (o.save_result) {
    const std::string file = result_path(plan, o, date);
    nlohmann::json result = result_json(m, info, outcomes);
    if (spec_run) add_spec_decode_json(*spec_run, &result);
    DS_RETURN_IF_ERROR(save_result(plan, o, date, file, n, std::move(result)));
    std::printf("Saved result to %s\n", file.c_str());
  }
  return Status::Ok();
}

}  // namespace

std::vector<double> arrival_times(int n, double request_rate, double burstiness, uint64_t seed) {
  std::vector<double> t(std::max(0, n), 0.0);
  if (std::isinf(request_rate) || n <= 1) return t;
  // A different stream from the dataset's, which uses the same seed.
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  for (int i = 1; i < n; ++i) t[i] = t[i - 1] + gap(rng);
  return t;
}

CLI::App* add_bench_serve_command(CLI::App* bench, BenchServeOptions* o) {
  CLI::App* cmd = bench->add_subcommand(
      "serve", "online load against an OpenAI-compatible server (as vLLM's bench serve)");
  cmd->add_option("--backend", o->backend,
                  "openai (/v1/completions) or openai-chat (/v1/chat/completions)")
      ->check(CLI::IsMember({"openai", "openai-chat"}));
  cmd->add_option("--base-url", o->base_url,
                  "server URL, e.g. http://host:8000 (instead of --host/--port)");
  cmd->add_option("--host", o->host, "server host (default 127.0.0.1)");
  cmd->add_option("--port", o->port, "server port (default 8000)");
  cmd->add_option("--endpoint", o->endpoint,
                  "API path (default /v1/completions, or /v1/chat/completions for openai-chat)");
  cmd->add_option("--model", o->model,
                  "model name sent in requests (default: the server's first in /v1/models); "
                  "a path also serves as the tokenizer");
  cmd->add_option("--served-model-name", o->served_model_name,
                  "name sent in requests instead of --model");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "model path (.gguf or Hugging Face dir) whose tokenizer counts tokens "
                  "(default: --model if a path, else the default model)");
  cmd->add_option("--dataset-name", o->dataset_name,
                  "random, sharegpt or prefix-repetition (default random)")
      ->check(CLI::IsMember({"random", "sharegpt", "prefix-repetition"}));
  cmd->add_option("--dataset-path", o->dataset_path, "ShareGPT JSON file");
  cmd->add_option("--num-prompts", o->num_prompts, "requests to send (default 1000)");
  cmd->add_option("--request-rate", o->request_rate,
                  "requests/s, arrivals Poisson (or gamma with --burstiness); inf: all at once "
                  "(default inf)");
  cmd->add_option("--burstiness", o->burstiness,
                  "gamma shape of the arrivals: 1 Poisson, < 1 burstier, > 1 steadier (default 1)");
  cmd->add_option_function<int>(
      "--max-concurrency", [o](const int& v) { o->max_concurrency = v; },
      "requests in flight at most (default: no limit)");
  cmd->add_option("--random-input-len", o->random_input_len,
                  "random: prompt tokens (default 1024)");
  cmd->add_option("--random-output-len", o->random_output_len, "random: max_tokens (default 128)");
  cmd->add_option("--random-range-ratio", o->random_range_ratio,
                  "random: lengths uniform in [len*(1-r), len*(1+r)], 0 <= r < 1 (default 0)");
  cmd->add_option(
      "--random-prefix-len", o->random_prefix_len,
      "random: tokens of a prefix shared by every prompt, before the input (default 0)");
  cmd->add_option_function<int>(
      "--sharegpt-output-len", [o](const int& v) { o->sharegpt_output_len = v; },
      "sharegpt: max_tokens for every prompt (default: the reply's length)");
  cmd->add_option("--prefix-repetition-prefix-len", o->prefix_repetition_prefix_len,
                  "prefix-repetition: prefix tokens (default 256)");
  cmd->add_option("--prefix-repetition-suffix-len", o->prefix_repetition_suffix_len,
                  "prefix-repetition: suffix tokens (default 256)");
  cmd->add_option("--prefix-repetition-num-prefixes", o->prefix_repetition_num_prefixes,
                  "prefix-repetition: distinct prefixes (default 10)");
  cmd->add_option("--prefix-repetition-output-len", o->prefix_repetition_output_len,
                  "prefix-repetition: max_tokens (default 128)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "send ignore_eos: generate max_tokens every time");
  cmd->add_option_function<double>(
      "--temperature", [o](const double& v) { o->temperature = v; },
      "sampling temperature to send (default: the server's)");
  cmd->add_option("--seed", o->seed, "dataset and arrival seed (default 0)");
  cmd->add_option("--percentile-metrics", o->percentile_metrics,
                  "metrics to report, of ttft,tpot,itl,e2el (default ttft,tpot,itl)");
  cmd->add_option("--metric-percentiles", o->metric_percentiles,
                  "percentiles to report, e.g. 50,90,99 (default 99)");
  cmd->add_option(
      "--goodput", o->goodput,
      "SLOs in ms for goodput, e.g. --goodput ttft:500 tpot:50 (names: ttft, tpot, e2el)");
  cmd->add_flag("--save-result", o->save_result, "write the result JSON");
  cmd->add_option("--result-dir", o->result_dir, "directory for the result JSON (default .)");
  cmd->add_option("--result-filename", o->result_filename,
                  "result file name (default BACKEND-RATEqps[-concurrencyN]-MODEL-DATE.json)");
  cmd->add_option("--api-key", o->api_key, "bearer token (default $OPENAI_API_KEY)");
  cmd->add_flag("--disable-tqdm", o->disable_tqdm, "no progress bar");
  cmd->add_option("--log-level", o->log_level, "debug, info, warning or error")
      ->check(CLI::IsMember({"debug", "info", "warning", "warn", "error"}));
  return cmd;
}

int run_bench_serve(const BenchServeOptions& options) {
  set_log_level(options.log_level);
  Status s = bench(options);
  if (!s.ok()) return report_error(s);
  return 0;
}

}  // namespace dserve::cli
