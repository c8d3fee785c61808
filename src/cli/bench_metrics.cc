#include "cli/bench_metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <fmt/format.h>

namespace dserve::cli {
namespace {

constexpr int kTableWidth = 50;

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(sep, i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    // Trim spaces: "ttft, tpot" is fine.
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) out.push_back(item);
    i = j + 1;
  }
  return out;
}

std::optional<double> parse_double(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

MetricSummary summarize(const std::vector<double>& seconds, std::span<const double> percentiles) {
  MetricSummary s;
  s.mean_ms = mean(seconds) * 1000;
  s.median_ms = percentile(seconds, 50) * 1000;
  s.std_ms = stddev(seconds) * 1000;
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, percentile(seconds, p) * 1000);
  return s;
}

// Python's "{s:{c}^{n}}": centred, the odd fill character on the right.
std::string centred(const std::string& s, char fill) {
  const int pad = std::max(0, kTableWidth - static_cast<int>(s.size()));
  return std::string(pad / 2, fill) + s + std::string(pad - pad / 2, fill);
}

// Python's "{:<40} {:<10}" and "{:<40} {:<10.2f}".
std::string row(const std::string& key, const std::string& value) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%-40s %-10s\n", key.c_str(), value.c_str());
  return buf;
}
std::string fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

struct MetricView {
  const char* key;     // "ttft"
  const char* name;    // "TTFT"
  const char* header;  // "Time to First Token"
  const MetricSummary* summary;
};

std::vector<MetricView> metric_views(const BenchmarkMetrics& m) {
  return {{"ttft", "TTFT", "Time to First Token", &m.ttft},
          {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &m.tpot},
          {"itl", "ITL", "Inter-token Latency", &m.itl},
          {"e2el", "E2EL", "End-to-end Latency", &m.e2el}};
}

bool shown(const ReportInfo& info, const char* key) {
  return std::find(info.percentile_metrics.begin(), info.percentile_metrics.end(), key) !=
         info.percentile_metrics.end();
}

}  // namespace

Result<GoodputSlos> parse_goodput(const std::vector<std::string>& items) {
  GoodputSlos slos;
  for (const std::string& item : items) {
    for (const std::string& kv : split(item, ' ')) {
      const size_t colon = kv.find(':');
      const std::string name = kv.substr(0, colon);
      const std::optional<double> v =
          colon == std::string::npos ? std::nullopt : parse_double(kv.substr(colon + 1));
      if (!v || *v < 0) {
        return invalid_argument("--goodput " + kv +
                                ": expected NAME:MILLISECONDS with a number >= 0, e.g. ttft:500");
      }
      if (name == "ttft") {
        slos.ttft_ms = v;
      } else if (name == "tpot") {
        slos.tpot_ms = v;
      } else if (name == "e2el") {
        slos.e2el_ms = v;
      } else {
        return invalid_argument("--goodput " + kv + ": the SLO name must be ttft, tpot or e2el");
      }
    }
  }
  return slos;
}

Result<std::vector<std::string>> parse_percentile_metrics(const std::string& text) {
  std::vector<std::string> out = split(text, ',');
  for (const std::string& m : out) {
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el") {
      return invalid_argument("--percentile-metrics: '" + m +
                              "' is not one of ttft, tpot, itl, e2el");
    }
  }
  if (out.empty()) return invalid_argument("--percentile-metrics: no metric named");
  return out;
}

Result<std::vector<double>> parse_metric_percentiles(const std::string& text) {
  std::vector<double> out;
  for (const std::string& s : split(text, ',')) {
    const std::optional<double> v = parse_double(s);
    if (!v || *v < 0 || *v > 100) {
      return invalid_argument("--metric-percentiles: '" + s + "' is not a number in [0, 100]");
    }
    out.push_back(*v);
  }
  if (out.empty()) return invalid_argument("--metric-percentiles: no percentile given");
  return out;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(values.size() - 1, lo + 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

double mean(std::span<const double> values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

double stddev(std::span<const double> values) {
  if (values.empty()) return 0;
  const double mu = mean(values);
  double sq = 0;
  for (double v : values) sq += (v - mu) * (v - mu);
  return std::sqrt(sq / static_cast<double>(values.size()));
}

std::string python_float_str(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e16) {
    std::snprintf(buf, sizeof(buf), "%.0f.0", v);
    return buf;
  }
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string percentile_label(double p) {
  const std::string s = python_float_str(p);
  return s.ends_with(".0") ? s.substr(0, s.size() - 2) : s;
}

BenchmarkMetrics calculate_metrics(std::span<const RequestOutcome> outcomes, double duration_s,
                                   std::span<const double> percentiles, const GoodputSlos& slos) {
  BenchmarkMetrics m;
  std::vector<double> ttfts, tpots, itls, e2els;
  int n_good = 0;
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) {
      m.output_lens.push_back(0);
      ++m.failed;
      continue;
    }
    m.output_lens.push_back(o.output_tokens);
    m.total_input += o.prompt_len;
    m.total_output += o.output_tokens;
    double tpot = 0;  // vLLM: 0 for a single output token, for the goodput check only
    if (o.output_tokens > 1) {
      tpot = (o.latency - o.ttft) / (o.output_tokens - 1);
      tpots.push_back(tpot);
    }
    itls.insert(itls.end(), o.itl.begin(), o.itl.end());
    ttfts.push_back(o.ttft);
    e2els.push_back(o.latency);
    ++m.completed;
    if (slos.any()) {
      const bool good = (!slos.ttft_ms || o.ttft * 1000 <= *slos.ttft_ms) &&
                        (!slos.tpot_ms || tpot * 1000 <= *slos.tpot_ms) &&
                        (!slos.e2el_ms || o.latency * 1000 <= *slos.e2el_ms);
      n_good += good ? 1 : 0;
    }
  }
  const double dur = duration_s > 0 ? duration_s : 1e-9;
  m.request_throughput = m.completed / dur;
  m.request_goodput = n_good / dur;
  m.output_throughput = static_cast<double>(m.total_output) / dur;
  m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / dur;
  m.ttft = summarize(ttfts, percentiles);
  m.tpot = summarize(tpots, percentiles);
  m.itl = summarize(itls, percentiles);
  m.e2el = summarize(e2els, percentiles);
  return m;
}

std::string format_result_table(const BenchmarkMetrics& m, const ReportInfo& info) {
  std::string s = centred(" Serving Benchmark Result ", '=') + "\n";
  s += row("Successful requests:", std::to_string(m.completed));
  if (m.failed > 0) s += row("Failed requests:", std::to_string(m.failed));
  if (info.max_concurrency) {
    s += row("Maximum request concurrency:", std::to_string(*info.max_concurrency));
  }
  if (std::isfinite(info.request_rate)) {
    s += row("Request rate configured (RPS):", fixed2(info.request_rate));
  }
  s += row("Benchmark duration (s):", fixed2(info.duration_s));
  s += row("Total input tokens:", std::to_string(m.total_input));
  s += row("Total generated tokens:", std::to_string(m.total_output));
  s += row("Request throughput (req/s):", fixed2(m.request_throughput));
  if (info.has_goodput) s += row("Request goodput (req/s):", fixed2(m.request_goodput));
  s += row("Output token throughput (tok/s):", fixed2(m.output_throughput));
  s += row("Total Token throughput (tok/s):", fixed2(m.total_token_throughput));
  for (const MetricView& v : metric_views(m)) {
    if (!shown(info, v.key)) continue;
    s += centred(v.header, '-') + "\n";
    s += row(std::string("Mean ") + v.name + " (ms):", fixed2(v.summary->mean_ms));
    s += row(std::string("Median ") + v.name + " (ms):", fixed2(v.summary->median_ms));
    for (const auto& [p, value] : v.summary->percentiles_ms) {
      // Appended piecewise: "P" + std::string trips GCC 12's -Wrestrict false positive.
      std::string key = "P";
      key += percentile_label(p);
      key += std::string(" ") + v.name + " (ms):";
      s += row(key, fixed2(value));
    }
  }
  s += std::string(kTableWidth, '=') + "\n";
  return s;
}

nlohmann::json result_json(const BenchmarkMetrics& m, const ReportInfo& info,
                           std::span<const RequestOutcome> outcomes) {
  nlohmann::json j;
  j["duration"] = info.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = info.has_goodput ? nlohmann::json(m.request_goodput) : nlohmann::json();
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  nlohmann::json input_lens = nlohmann::json::array(), ttfts = nlohmann::json::array(),
                 itls = nlohmann::json::array(), texts = nlohmann::json::array(),
                 errors = nlohmann::json::array();
  for (const RequestOutcome& o : outcomes) {
    input_lens.push_back(o.prompt_len);
    ttfts.push_back(o.ttft);
    itls.push_back(o.itl);
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = m.output_lens;
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["generated_texts"] = std::move(texts);
  j["errors"] = std::move(errors);
  for (const MetricView& v : metric_views(m)) {
    if (!shown(info, v.key)) continue;
    const std::string k = v.key;
    j["mean_" + k + "_ms"] = v.summary->mean_ms;
    j["median_" + k + "_ms"] = v.summary->median_ms;
    j["std_" + k + "_ms"] = v.summary->std_ms;
    for (const auto& [p, value] : v.summary->percentiles_ms) {
      std::string key = "p";
      key += percentile_label(p);
      key += "_" + k + "_ms";
      j[key] = value;
    }
  }
  return j;
}

SpecDecodeCounts SpecDecodeCounts::minus(const SpecDecodeCounts& before) const {
  SpecDecodeCounts d;
  d.drafts = drafts - before.drafts;
  d.draft_tokens = draft_tokens - before.draft_tokens;
  d.accepted_tokens = accepted_tokens - before.accepted_tokens;
  d.accepted_per_pos = accepted_per_pos;
  for (size_t i = 0; i < d.accepted_per_pos.size() && i < before.accepted_per_pos.size(); ++i) {
    d.accepted_per_pos[i] -= before.accepted_per_pos[i];
  }
  return d;
}

SpecDecodeCounts parse_spec_decode_counts(const std::string& text) {
  SpecDecodeCounts c;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_at = line.rfind(' ');
    if (name_end == std::string::npos || value_at == std::string::npos) continue;
    const std::string name = line.substr(0, name_end);
    char* end = nullptr;
    const double v = std::strtod(line.c_str() + value_at + 1, &end);
    if (end == line.c_str() + value_at + 1 || !std::isfinite(v)) continue;
    if (name == "vllm:spec_decode_num_drafts_total") {
      c.drafts += v;
    } else if (name == "vllm:spec_decode_num_draft_tokens_total") {
      c.draft_tokens += v;
    } else if (name == "vllm:spec_decode_num_accepted_tokens_total") {
      c.accepted_tokens += v;
    } else if (name == "vllm:spec_decode_num_accepted_tokens_per_pos_total") {
      const size_t at = line.find("position=\"");
      if (at == std::string::npos) continue;
      const long pos = std::strtol(line.c_str() + at + 10, nullptr, 10);
      if (pos < 0 || pos >= 64) continue;
      if (c.accepted_per_pos.size() <= static_cast<size_t>(pos)) c.accepted_per_pos.resize(pos + 1);
      c.accepted_per_pos[pos] += v;
    }
  }
  return c;
}

std::string format_spec_decode_table(const SpecDecodeCounts& run) {
  if (run.drafts <= 0) return "";
  std::string s = centred("Speculative Decoding", '-') + "\n";
  s += row("Acceptance rate (%):", fixed2(100.0 * run.accepted_tokens / std::max(1.0, run.draft_tokens)));
  s += row("Acceptance length:", fixed2(1.0 + run.accepted_tokens / run.drafts));
  s += row("Drafts:", fmt::format("{}", run.drafts));
  s += row("Draft tokens:", fmt::format("{}", run.draft_tokens));
  s += row("Accepted tokens:", fmt::format("{}", run.accepted_tokens));
  std::string per_pos;
  for (double a : run.accepted_per_pos) {
    per_pos += (per_pos.empty() ? "" : ", ") + fixed2(100.0 * a / run.drafts);
  }
  s += "Per-position acceptance (%): " + per_pos + "\n";
  s += std::string(50, '=') + "\n";
  return s;
}

void add_spec_decode_json(const SpecDecodeCounts& run, nlohmann::json* result) {
  if (run.drafts <= 0) return;
  (*result)["spec_decode_acceptance_rate"] =
      100.0 * run.accepted_tokens / std::max(1.0, run.draft_tokens);
  (*result)["spec_decode_acceptance_length"] = 1.0 + run.accepted_tokens / run.drafts;
  (*result)["spec_decode_num_drafts"] = run.drafts;
  (*result)["spec_decode_draft_tokens"] = run.draft_tokens;
  (*result)["spec_decode_accepted_tokens"] = run.accepted_tokens;
  std::vector<double> per_pos;
  for (double a : run.accepted_per_pos) per_pos.push_back(a / run.drafts);
  (*result)["spec_decode_per_position_acceptance_rate"] = per_pos;
}

}  // namespace dserve::cli
