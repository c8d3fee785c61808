// grammar_tool: the grammar engine on a real tokenizer, for the Python reference tests.
//
//   grammar_tool walk <tokenizer> <kind> <spec_file> <n_prefixes> <max_steps> <seed>
//     Random walks through the engine's own allowed sets (each step a uniformly drawn
//     allowed token; a walk ends after max_steps tokens or when nothing is allowed),
//     until n_prefixes states were visited. One line per visited state:
//       <prefix ids, comma-separated or "-"> <complete 0|1> <mask: hex of the
//       little-endian bytes of the [ceil(vocab / 64)] uint64 words>
//     and on stderr the mean microseconds per mask (first computation and cached).
//   grammar_tool check <kind> <spec_file>
//     "ok", or the compile error (exit 1).
//   grammar_tool match <kind> <spec_file> <text_file>
//     "1" if the text is a complete match, else "0".
// kind: json | json_object | regex | choice (spec: a JSON list of strings) | grammar.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/structured_output.h"
#include "tokenizer/tokenizer.h"

using namespace dserve;

namespace {

Result<StructuredOutputs> read_spec(const std::string& kind, const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return invalid_argument("cannot read " + file);
  std::stringstream ss;
  ss << in.rdbuf();
  StructuredOutputs s;
  s.text = ss.str();
  if (kind == "json") {
    s.kind = StructuredOutputs::Kind::kJson;
  } else if (kind == "json_object") {
    s.kind = StructuredOutputs::Kind::kJsonObject;
  } else if (kind == "regex") {
    s.kind = StructuredOutputs::Kind::kRegex;
  } else if (kind == "grammar") {
    s.kind = StructuredOutputs::Kind::kGrammar;
  } else if (kind == "choice") {
    s.kind = StructuredOutputs::Kind::kChoice;
    for (const auto& c : nlohmann::json::parse(s.text)) s.choices.push_back(c.get<std::string>());
    s.text.clear();
  } else {
    return invalid_argument("unknown kind " + kind);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  if (a.size() == 3 && a[0] == "check") {
    Result<StructuredOutputs> spec = read_spec(a[1], a[2]);
    if (!spec.ok()) return fprintf(stderr, "%s\n", spec.status().message().c_str()), 2;
    Result<std::shared_ptr<const grammar::Grammar>> g = grammar::compile_grammar(*spec);
    if (!g.ok()) {
      printf("%s\n", g.status().message().c_str());
      return 1;
    }
    printf("ok\n");
    return 0;
  }
  if (a.size() == 4 && a[0] == "match") {
    Result<StructuredOutputs> spec = read_spec(a[1], a[2]);
    if (!spec.ok()) return fprintf(stderr, "%s\n", spec.status().message().c_str()), 2;
    Result<std::shared_ptr<const grammar::Grammar>> g = grammar::compile_grammar(*spec);
    if (!g.ok()) return fprintf(stderr, "%s\n", g.status().message().c_str()), 1;
    std::ifstream in(a[3], std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    grammar::GrammarMatcher m(*g, std::make_shared<const grammar::TokenVocabulary>(
                                      std::vector<std::string>{}));
    printf("%d\n", m.accept_bytes(text.str()) && m.is_complete() ? 1 : 0);
    return 0;
  }
  if (a.size() != 7 || a[0] != "walk") {
    fprintf(stderr, "usage: grammar_tool walk <tokenizer> <kind> <spec_file> <n_prefixes> "
                    "<max_steps> <seed> | check <kind> <spec_file> | match <kind> <spec_file> <text_file>\n");
    return 2;
  }
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_path(a[1]);
  if (!tok.ok()) return fprintf(stderr, "%s\n", tok.status().message().c_str()), 2;
  Result<StructuredOutputs> spec = read_spec(a[2], a[3]);
  if (!spec.ok()) return fprintf(stderr, "%s\n", spec.status().message().c_str()), 2;
  const int n_prefixes = std::stoi(a[4]), max_steps = std::stoi(a[5]);
  std::mt19937_64 rng(std::stoull(a[6]));
  grammar::StructuredOutputCompiler compiler(
      grammar::TokenVocabulary::from_tokenizer(**tok, (*tok)->vocab_size()));
  const int32_t vocab = (*tok)->vocab_size();
  const size_t n_words = (static_cast<size_t>(vocab) + 63) / 64;
  std::vector<uint64_t> bits(n_words);
  double mask_us = 0;
  int64_t n_masks = 0;
  while (n_masks < n_prefixes) {
    Result<std::unique_ptr<grammar::GrammarMatcher>> m = compiler.matcher(*spec);
    if (!m.ok()) return fprintf(stderr, "%s\n", m.status().message().c_str()), 1;
    std::vector<int32_t> prefix;
    for (int step = 0; step <= max_steps && n_masks < n_prefixes; ++step) {
      std::fill(bits.begin(), bits.end(), 0);
      const auto t0 = std::chrono::steady_clock::now();
      (*m)->fill_allowed(bits);
      mask_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      ++n_masks;
      std::string line;
      for (size_t i = 0; i < prefix.size(); ++i) {
        if (i > 0) line += ',';
        line += std::to_string(prefix[i]);
      }
      if (line.empty()) line.push_back('-');
      line += (*m)->is_complete() ? " 1 " : " 0 ";
      static const char* hex = "0123456789abcdef";
      for (uint64_t word : bits) {
        for (int byte = 0; byte < 8; ++byte) {
          const auto b = static_cast<uint8_t>(word >> (8 * byte));
          line += hex[b >> 4];
          line += hex[b & 15];
        }
      }
      printf("%s\n", line.c_str());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab; ++id) {
        if ((bits[id >> 6] >> (id & 63)) & 1) allowed.push_back(id);
      }
      if (allowed.empty() || step == max_steps) break;
      const int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      if (!(*m)->accept(t)) return fprintf(stderr, "an allowed token was refused\n"), 1;
      prefix.push_back(t);
    }
  }
  fprintf(stderr, "masks: %lld, mean %.1f us\n", static_cast<long long>(n_masks),
          n_masks ? mask_us / static_cast<double>(n_masks) : 0.0);
  return 0;
}
