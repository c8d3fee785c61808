// The entry point of constrained decoding: StructuredOutputs (plain data from a
// request) -> Grammar -> a per-sequence GrammarMatcher (a TokenConstraint the sampler
// applies). Use:
//
//   // once per model: the vocabulary trie
//   StructuredOutputCompiler compiler(TokenVocabulary::from_tokenizer(tok, vocab_size));
//   // per request (errors are InvalidArgument naming the problem, for a 400)
//   DS_ASSIGN_OR_RETURN(auto matcher, compiler.matcher(spec));
//   // per step: matcher->fill_allowed(bits); after sampling: matcher->accept(token)
//
// compile_grammar() alone validates a spec without a tokenizer (the API server does
// this before queueing). Tool calling builds its own grammar the same way: a JSON
// schema (kJson) for a function's arguments, or GBNF text (kGrammar) for a whole call.
//
// Thread-safety: compile_grammar is a pure function. StructuredOutputCompiler caches,
// per spec, the compiled grammar's automaton (states, transitions and masks shared by
// every sequence with that spec) behind a mutex: matcher() may be called from any
// thread; each matcher belongs to one sequence.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/token_vocabulary.h"
#include "sampling/sampling_params.h"

namespace dserve::grammar {

Result<std::shared_ptr<const Grammar>> compile_grammar(const StructuredOutputs& spec);
// A choice list as a grammar: exactly one of the strings.
Result<std::shared_ptr<const Grammar>> choice_grammar(const std::vector<std::string>& choices);

class StructuredOutputCompiler {
 public:
  // max_cached: distinct specs whose automata are kept (each holds at most ~16 MiB of
  // masks, GrammarAutomaton::full()), least recently used dropped first.
  explicit StructuredOutputCompiler(std::shared_ptr<const TokenVocabulary> vocab,
                                    size_t max_cached = 64)
      : vocab_(std::move(vocab)), max_cached_(max_cached) {}
  StructuredOutputCompiler(const StructuredOutputCompiler&) = delete;
  StructuredOutputCompiler& operator=(const StructuredOutputCompiler&) = delete;

  Result<std::unique_ptr<GrammarMatcher>> matcher(const StructuredOutputs& spec);
  const std::shared_ptr<const TokenVocabulary>& vocabulary() const { return vocab_; }

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  const size_t max_cached_;
  std::mutex mu_;
  // key -> automaton, least recently used first in lru_. GUARDED_BY(mu_)
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<GrammarAutomaton>,
                                            std::list<std::string>::iterator>> cache_;
};

}  // namespace dserve::grammar
