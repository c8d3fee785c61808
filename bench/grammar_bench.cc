// grammar_bench: what structured output costs per decode step, for real tokenizers.
//   build/bench/grammar_bench <tokenizer.json dir or .gguf> ...
// For each tokenizer: the vocabulary trie's build time, then a JSON-schema-constrained
// output (a fixed valid document, tokenized by the tokenizer itself) replayed token by
// token through a new matcher (a new request: every state seen for the first time),
// timing fill_allowed() at every step, then again with the mask cached. Twice: the
// second request finds the compiled grammar cached but builds its own states. Compare with a decode step of the model (tens of ms on the CPU).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "grammar/structured_output.h"
#include "tokenizer/tokenizer.h"

using namespace dserve;

namespace {

constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "number": {"type": "string", "pattern": "INV-[0-9]{4}"},
    "customer": {"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 40},
      "email": {"type": "string"},
      "vip": {"type": "boolean"}}, "required": ["name", "email", "vip"]},
    "lines": {"type": "array", "items": {"type": "object", "properties": {
      "product": {"enum": ["pen", "book", "lamp"]},
      "qty": {"type": "integer", "minimum": 1, "maximum": 99},
      "price": {"type": "number"},
      "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
      "required": ["product", "qty", "price", "note"]}, "maxItems": 5},
    "comment": {"type": "string"}
  },
  "required": ["number", "customer", "lines", "comment"]
})";

constexpr const char* kDocument =
    R"({"number": "INV-2031", "customer": {"name": "Zoë Müller-Lüdenscheidt", )"
    R"("email": "zoe@example.com", "vip": true}, "lines": [{"product": "pen", "qty": 12, )"
    R"("price": 1.25, "note": null}, {"product": "lamp", "qty": 1, "price": 39.9, )"
    R"("note": "fragile \"glass\" shade"}], "comment": "Deliver after 5 pm, ring twice. )"
    R"(Payment by bank transfer within 30 days; questions to accounts@example.com."})";

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: grammar_bench <tokenizer dir or .gguf> ...\n");
    return 2;
  }
  for (int a = 1; a < argc; ++a) {
    Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_path(argv[a]);
    if (!tok.ok()) return fprintf(stderr, "%s\n", tok.status().message().c_str()), 1;
    const int32_t vocab = (*tok)->vocab_size();
    double t0 = now_us();
    auto v = grammar::TokenVocabulary::from_tokenizer(**tok, vocab);
    const double trie_ms = (now_us() - t0) / 1000;
    grammar::StructuredOutputCompiler compiler(v);
    StructuredOutputs spec;
    spec.kind = StructuredOutputs::Kind::kJson;
    spec.text = kSchema;
    const std::vector<int32_t> ids = (*tok)->encode(kDocument, /*add_special_tokens=*/false);
    std::vector<uint64_t> bits((static_cast<size_t>(vocab) + 63) / 64);
    for (int request = 0; request < 2; ++request) {
      t0 = now_us();
      auto m = compiler.matcher(spec);
      if (!m.ok()) return fprintf(stderr, "%s\n", m.status().message().c_str()), 1;
      const double compile_us = now_us() - t0;
      std::vector<double> cold, warm;
      grammar::GrammarMatcher& g = **m;
      for (int32_t id : ids) {
        for (int pass = 0; pass < 2; ++pass) {  // the second call finds the mask cached
          std::fill(bits.begin(), bits.end(), 0);
          const double s = now_us();
          g.fill_allowed(bits);
          (pass == 0 ? cold : warm).push_back(now_us() - s);
        }
        if (!((bits[id >> 6] >> (id & 63)) & 1) || !g.accept(id)) {
          return fprintf(stderr, "the document's token %d is not allowed\n", id), 1;
        }
      }
      if (!g.is_complete()) return fprintf(stderr, "the document is not complete\n"), 1;
      auto stat = [](std::vector<double> x) {
        std::sort(x.begin(), x.end());
        double sum = 0;
        for (double y : x) sum += y;
        char buf[128];
        snprintf(buf, sizeof buf, "mean %.0f us, p50 %.0f, p90 %.0f, max %.0f", sum / x.size(),
                 x[x.size() / 2], x[x.size() * 9 / 10], x.back());
        return std::string(buf);
      };
      printf("vocab %d (%d trie nodes, built in %.0f ms), %zu tokens, request %d "
             "(grammar %s, %.0f us): first time per state %s | cached %s\n",
             vocab, v->n_nodes(), trie_ms, ids.size(), request,
             request == 0 ? "compiled" : "cached", compile_us, stat(cold).c_str(),
             stat(warm).c_str());
    }
  }
  return 0;
}
