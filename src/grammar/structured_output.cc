#include "grammar/structured_output.h"

#include "grammar/gbnf_parser.h"
#include "grammar/json_schema.h"
#include "grammar/regex_parser.h"

namespace dserve::grammar {

Result<std::shared_ptr<const Grammar>> choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return invalid_argument("choice: the list of choices is empty");
  std::vector<ExprPtr> alts;
  for (const std::string& c : choices) alts.push_back(literal(c));
  GrammarBuilder b;
  DS_RETURN_IF_ERROR(b.add_rule("root", alternatives(std::move(alts))));
  return b.build("root");
}

namespace {

Result<std::shared_ptr<const Grammar>> build_grammar(const StructuredOutputs& spec) {
  switch (spec.kind) {
    case StructuredOutputs::Kind::kJson:
      return compile_json_schema(spec.text);
    case StructuredOutputs::Kind::kJsonObject:
      return json_object_grammar();
    case StructuredOutputs::Kind::kRegex: {
      DS_ASSIGN_OR_RETURN(ExprPtr e, parse_regex(spec.text));
      GrammarBuilder b;
      DS_RETURN_IF_ERROR(b.add_rule("root", e));
      return b.build("root");
    }
    case StructuredOutputs::Kind::kChoice:
      return choice_grammar(spec.choices);
    case StructuredOutputs::Kind::kGrammar: {
      if (spec.schema_rules.empty()) return parse_gbnf(spec.text);
      GrammarBuilder b;
      for (const auto& [name, schema] : spec.schema_rules) {
        DS_RETURN_IF_ERROR(add_json_schema_rule(schema, name, &b));
      }
      DS_RETURN_IF_ERROR(parse_gbnf_into(spec.text, &b));
      Result<std::shared_ptr<const Grammar>> g = b.build("root");
      if (!g.ok()) return invalid_argument("grammar: " + g.status().message());
      return g;
    }
  }
  return invalid_argument("unknown structured output kind");
}

}  // namespace

Result<std::shared_ptr<const Grammar>> compile_grammar(const StructuredOutputs& spec) {
  DS_ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, build_grammar(spec));
  // A grammar whose first state is past the matcher's budget (GrammarAutomaton::
  // too_complex) would be held to a fraction of itself from the first token on: refused
  // here, where the request can still get a clear error.
  const GrammarAutomaton probe(g, std::make_shared<const TokenVocabulary>(std::vector<std::string>{}));
  if (probe.too_complex()) {
    return invalid_argument("the grammar is too complex: its first step has more than " +
                            std::to_string(GrammarAutomaton::kMaxExpansion) +
                            " parse paths (nested optional or repeated items multiply them)");
  }
  return g;
}

Result<std::unique_ptr<GrammarMatcher>> StructuredOutputCompiler::matcher(
    const StructuredOutputs& spec) {
  std::string key(1, static_cast<char>('0' + static_cast<int>(spec.kind)));
  key += spec.text;
  for (const std::string& c : spec.choices) {
    key += '\0' + std::to_string(c.size()) + ':' + c;
  }
  for (const auto& [name, schema] : spec.schema_rules) {
    key += '\1' + std::to_string(name.size()) + ':' + name + std::to_string(schema.size()) + ':' +
           schema;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      lru_.splice(lru_.end(), lru_, it->second.second);
      if (!it->second.first->full()) return std::make_unique<GrammarMatcher>(it->second.first);
    }
  }
  DS_ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, compile_grammar(spec));
  auto automaton = std::make_shared<GrammarAutomaton>(std::move(g), vocab_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      it->second.first = automaton;  // the old one was full; its matchers keep it
    } else {
      lru_.push_back(key);
      cache_.emplace(key, std::make_pair(automaton, std::prev(lru_.end())));
      while (cache_.size() > max_cached_) {
        cache_.erase(lru_.front());
        lru_.pop_front();
      }
    }
  }
  return std::make_unique<GrammarMatcher>(std::move(automaton));
}

}  // namespace dserve::grammar
