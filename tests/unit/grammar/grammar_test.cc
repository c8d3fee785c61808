// The grammar engine on a small byte-level vocabulary: which strings each front end
// accepts, masks against a brute-force check of every token, and malformed input.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "grammar/gbnf_parser.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "grammar/regex_parser.h"
#include "grammar/structured_output.h"

namespace dserve::grammar {
namespace {

// Every single byte, plus multi-byte tokens that cross grammar symbols and split
// UTF-8 characters ("é" is C3 A9, "€" is E2 82 AC).
std::shared_ptr<const TokenVocabulary> test_vocab() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, static_cast<char>(b));
  for (const char* s : {"{\"", "\":", "\": ", "\", \"", "true", "false", "null", "}", "\"}",
                        "12", "3.5", "ab", "abc", "\xC3", "\xA9\"", "\xE2\x82", "\xAC", "é",
                        "€", "name", "\"name\": \"", ", ", "]}", "[1, 2", "aaaa"}) {
    t.emplace_back(s);
  }
  t.emplace_back();  // a special token: no bytes
  return std::make_shared<const TokenVocabulary>(std::move(t));
}

bool matches(const std::shared_ptr<const Grammar>& g, const std::string& s) {
  GrammarMatcher m(g, test_vocab());
  return m.accept_bytes(s) && m.is_complete();
}

std::shared_ptr<const Grammar> regex(const std::string& p) {
  StructuredOutputs s;
  s.kind = StructuredOutputs::Kind::kRegex;
  s.text = p;
  auto g = compile_grammar(s);
  EXPECT_TRUE(g.ok()) << p << ": " << g.status().message();
  return g.ok() ? *g : nullptr;
}

std::shared_ptr<const Grammar> schema(const std::string& text) {
  auto g = compile_json_schema(text);
  EXPECT_TRUE(g.ok()) << text << ": " << g.status().message();
  return g.ok() ? *g : nullptr;
}

TEST(RegexTest, FullMatchSemantics) {
  auto g = regex(R"(^(ab|c)+[0-9]{2,3}\.x?$)");
  EXPECT_TRUE(matches(g, "ab12."));
  EXPECT_TRUE(matches(g, "cabc123.x"));
  EXPECT_FALSE(matches(g, "ab1."));
  EXPECT_FALSE(matches(g, "ab1234."));
  EXPECT_FALSE(matches(g, "12."));
  auto any = regex(R"([^a]\d\w\s.)");
  EXPECT_TRUE(matches(any, "é1_ x"));
  EXPECT_FALSE(matches(any, "a1_ x"));
  EXPECT_FALSE(matches(any, "b1_ \n"));
  auto utf = regex("[à-ö€]+");
  EXPECT_TRUE(matches(utf, "é€"));
  EXPECT_FALSE(matches(utf, "e"));
  auto nullable_star = regex("(a?)*b");
  EXPECT_TRUE(matches(nullable_star, "aab"));
  EXPECT_TRUE(matches(nullable_star, "b"));
}

TEST(RegexTest, MalformedPatternsAreErrors) {
  for (const char* p : {"(ab", "ab)", "[a-", "a{3,2}", "*a", "a**", "a{2}{3}", "a*{2}", "\\",
                        "(?=a)", "(a)\\1", "\\bword", "[z-a]", "\\x4", "a^b"}) {
    auto e = parse_regex(p);
    EXPECT_FALSE(e.ok()) << p;
    if (!e.ok()) {
      EXPECT_NE(e.status().message().find("regex:"), std::string::npos);
    }
  }
  EXPECT_FALSE(parse_regex("\xFF").ok());
}

TEST(GbnfTest, ParsesAndMatches) {
  auto g = parse_gbnf(R"(
    # a comment
    root ::= "{" ws pair ("," ws pair)* "}"
    pair ::= key ":" ws
             value
    key  ::= [a-z]+
    value ::= "true" | "false" | [0-9]{1,3} | "\u00e9"
    ws ::= [ \t\n]*
  )");
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(matches(*g, "{a:true}"));
  EXPECT_TRUE(matches(*g, "{ ab: 123, c:\té}"));
  EXPECT_FALSE(matches(*g, "{ab:1234}"));
  EXPECT_FALSE(matches(*g, "{}"));
}

TEST(GbnfTest, MalformedGrammarsAreErrors) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"", "empty"},
      {"root ::= foo", "'foo' is referenced but not defined"},
      {"start ::= \"a\"", "no 'root' rule"},
      {"root ::= \"a", "unterminated string"},
      {"root ::= [a-", "unterminated character class"},
      {"root ::= (\"a\"", "missing ')'"},
      {"root ::= \"a\")", "unbalanced"},
      {"root ::= root \"a\"", "left-recursive"},
      {"root ::= a\na ::= b \"x\"\nb ::= \"\" | a", "left-recursive"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
      {"root ::= \"a\"{5,2}", "n < m"},
      {"root ::= \"a\" root", "matches no finite string"},
      {"root ::= \"a\"{99999}", "above the limit"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root = \"a\"", "expected '::='"},
      {"root ::= @", "unexpected character"},
  };
  for (const Case& c : cases) {
    auto g = parse_gbnf(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_NE(g.status().message().find(c.want), std::string::npos)
        << c.text << " -> " << g.status().message();
  }
}

// What a grammar may cost the matcher is bounded: each of these once exhausted the stack
// or ran for seconds (fuzz/corpus/gbnf, fuzz/corpus/grammar_matcher).
TEST(GbnfTest, NestingAndLongRunsAreBounded) {
  // Repetitions of an item that can match nothing, nested: x+ over such an item adds no
  // ways to pass over it.
  auto nested = parse_gbnf("root ::= \"a\" ws" + std::string(40, '+') + " \"b\"\nws ::= [ ]*");
  ASSERT_TRUE(nested.ok()) << nested.status().message();
  EXPECT_TRUE(matches(*nested, "ab"));
  EXPECT_TRUE(matches(*nested, "a   b"));
  EXPECT_FALSE(matches(*nested, "a b "));
  // Stacked quantifiers count as nesting.
  auto stacked = parse_gbnf("root ::= \"a\"" + std::string(300, '+'));
  ASSERT_FALSE(stacked.ok());
  EXPECT_NE(stacked.status().message().find("nested too deeply"), std::string::npos);
  auto optional_plus = parse_gbnf("root ::= \"a\"+? \"b\"");
  ASSERT_TRUE(optional_plus.ok()) << optional_plus.status().message();
  EXPECT_TRUE(matches(*optional_plus, "b"));
  EXPECT_TRUE(matches(*optional_plus, "aab"));
  // Thousands of optional items in a row: one path through all of them.
  std::string run = "root ::=";
  for (int i = 0; i < 8000; ++i) run += " \"a\"?";
  auto long_run = parse_gbnf(run + " \"b\"");
  ASSERT_TRUE(long_run.ok()) << long_run.status().message();
  EXPECT_TRUE(matches(*long_run, std::string(5000, 'a') + "b"));
  EXPECT_FALSE(matches(*long_run, std::string(8001, 'a') + "b"));
}

TEST(RegexTest, GrammarsWhosePathsMultiplyAreRefused) {
  // ((a?){2}){2}...: 2^k ways to begin, one per choice of which a? matches.
  auto pattern = [](int k) {
    std::string p(k, '(');
    p += "a?";
    for (int i = 0; i < k; ++i) p += "){2}";
    return p;
  };
  StructuredOutputs s;
  s.kind = StructuredOutputs::Kind::kRegex;
  s.text = pattern(8);
  ASSERT_TRUE(compile_grammar(s).ok());
  EXPECT_TRUE(matches(*compile_grammar(s), std::string(200, 'a')));
  s.text = pattern(20);
  auto refused = compile_grammar(s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("too complex"), std::string::npos);
}

// Nested x+ over any character: the ways to split the input among the levels grow with
// every byte. The automaton cuts its work (too_complex), and what it still allows is
// allowed by the grammar.
TEST(MatcherTest, AmbiguityGrowingWithTheInputIsCutSoundly) {
  auto g = parse_gbnf("root ::= \"a\" ." + std::string(14, '+') + "? \"b\"");
  ASSERT_TRUE(g.ok()) << g.status().message();
  GrammarMatcher m(*g, test_vocab());
  ASSERT_TRUE(m.accept_bytes("a"));
  std::vector<uint64_t> mask((test_vocab()->size() + 63) / 64);
  for (int i = 0; i < 12; ++i) {
    std::fill(mask.begin(), mask.end(), 0);
    m.fill_allowed(mask);
    ASSERT_TRUE(m.accept_bytes("x"));
  }
  EXPECT_TRUE(m.automaton().too_complex());
  std::fill(mask.begin(), mask.end(), 0);
  m.fill_allowed(mask);
  const std::shared_ptr<const TokenVocabulary> v = test_vocab();
  for (int32_t id = 0; id < v->size(); ++id) {
    if (!((mask[id / 64] >> (id % 64)) & 1)) continue;
    GrammarMatcher fresh(*g, v);
    EXPECT_TRUE(fresh.accept_bytes("a" + std::string(12, 'x') + v->bytes(id))) << id;
  }
  EXPECT_TRUE(m.accept_bytes("b") && m.is_complete());
}

TEST(JsonSchemaTest, ObjectsArraysAndRefs) {
  auto g = schema(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 3},
      "age": {"type": "integer", "minimum": 18, "maximum": 120},
      "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 2},
      "ok": {"type": ["boolean", "null"]}
    },
    "required": ["name", "tags"],
    "$defs": {"tag": {"enum": ["a", "b", 3]}}
  })");
  EXPECT_TRUE(matches(g, R"({"name": "ab", "tags": ["a"]})"));
  EXPECT_TRUE(matches(g, R"({"name": "\u00e9é", "age": 18, "tags": ["b", 3], "ok": null})"));
  EXPECT_TRUE(matches(g, R"({"name": "", "age": 120, "tags": [3], "ok": true})"));
  EXPECT_FALSE(matches(g, R"({"name": "abcd", "tags": ["a"]})"));
  EXPECT_FALSE(matches(g, R"({"name": "ab", "age": 17, "tags": ["a"]})"));
  EXPECT_FALSE(matches(g, R"({"name": "ab", "age": 121, "tags": ["a"]})"));
  EXPECT_FALSE(matches(g, R"({"name": "ab", "tags": []})"));
  EXPECT_FALSE(matches(g, R"({"name": "ab", "tags": ["a", "a", "a"]})"));
  EXPECT_FALSE(matches(g, R"({"tags": ["a"], "name": "ab"})"));  // schema order
  EXPECT_FALSE(matches(g, R"({"name": "ab"})"));
  EXPECT_FALSE(matches(g, R"({"name":"ab", "tags": ["a"]})"));  // the one layout
}

TEST(JsonSchemaTest, IntegerRanges) {
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{{-15, 7}, {0, 0}, {5, 230}, {-300, -12}}) {
    auto g = schema(R"({"type": "integer", "minimum": )" + std::to_string(lo) +
                    R"(, "maximum": )" + std::to_string(hi) + "}");
    for (int v = -400; v <= 400; ++v) {
      EXPECT_EQ(matches(g, std::to_string(v)), v >= lo && v <= hi) << v << " in " << lo << ".." << hi;
    }
    EXPECT_FALSE(matches(g, "-0"));
    EXPECT_FALSE(matches(g, "007"));
  }
  auto open = schema(R"({"type": "integer", "exclusiveMinimum": 9})");
  EXPECT_FALSE(matches(open, "9"));
  EXPECT_TRUE(matches(open, "10"));
  EXPECT_TRUE(matches(open, "123456789012"));
}

TEST(JsonSchemaTest, RecursionAndAnyJson) {
  auto g = schema(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
    "properties": {"v": {"type": "number"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["v"], "additionalProperties": false}}})");
  EXPECT_TRUE(matches(g, R"({"v": -1.5e+3, "kids": [{"v": 0}, {"v": 2, "kids": []}]})"));
  EXPECT_FALSE(matches(g, R"({"v": 01})"));
  auto obj = json_object_grammar();
  ASSERT_TRUE(obj.ok());
  EXPECT_TRUE(matches(*obj, R"({"a": [1, {"b": null}], "c": "x\n\"y\""})"));
  EXPECT_TRUE(matches(*obj, "{}"));
  EXPECT_FALSE(matches(*obj, "[]"));
  EXPECT_FALSE(matches(*obj, "{\"a\": \"\x01\"}"));
}

TEST(JsonSchemaTest, MalformedSchemasAreErrors) {
  struct Case {
    const char* text;
    const char* want;
  } cases[] = {
      {"{", "not valid JSON"},
      {"[1]", "must be an object"},
      {"false", "matches nothing"},
      {R"({"type": "strung"})", "unknown type 'strung'"},
      {R"({"$ref": "#/$defs/missing"})", "does not resolve"},
      {R"({"$ref": "http://x/y"})", "not a reference into this document"},
      {R"({"type": "object", "properties": {"a": {"not": {}}}})", "keyword 'not'"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "maxItems is below minItems"},
      {R"({"type": "string", "pattern": "(a"})", "regex"},
      {R"({"type": "object", "required": ["x"]})", "'x' is not in properties"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", "leave no value"},
      {R"({"type": "number", "minimum": 1})", "not supported"},
      {R"({"enum": []})", "non-empty"},
      {R"({"$ref": "#"})", "matches no finite string"},
  };
  for (const Case& c : cases) {
    auto g = compile_json_schema(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_NE(g.status().message().find(c.want), std::string::npos)
        << c.text << " -> " << g.status().message();
  }
}

// Each token is allowed exactly when its bytes continue the text so far.
void expect_masks_match_brute_force(const std::shared_ptr<const Grammar>& g,
                                    const std::vector<std::string>& prefixes) {
  auto vocab = test_vocab();
  for (const std::string& prefix : prefixes) {
    GrammarMatcher m(g, vocab);
    ASSERT_TRUE(m.accept_bytes(prefix)) << prefix;
    std::vector<uint64_t> bits((vocab->size() + 63) / 64, 0);
    m.fill_allowed(bits);
    for (int32_t id = 0; id < vocab->size(); ++id) {
      GrammarMatcher probe(g, vocab);
      ASSERT_TRUE(probe.accept_bytes(prefix));
      const bool want = !vocab->bytes(id).empty() && probe.accept_bytes(vocab->bytes(id));
      EXPECT_EQ(((bits[id >> 6] >> (id & 63)) & 1) != 0, want)
          << "prefix '" << prefix << "' token " << id << " '" << vocab->bytes(id) << "'";
    }
    // Accepting through the mask's token path agrees too.
    for (int32_t id = 0; id < vocab->size(); ++id) {
      if (((bits[id >> 6] >> (id & 63)) & 1) == 0) continue;
      GrammarMatcher again(g, vocab);
      ASSERT_TRUE(again.accept_bytes(prefix));
      EXPECT_TRUE(again.accept(id));
    }
  }
}

TEST(MatcherTest, MasksAgreeWithBruteForce) {
  auto g = schema(R"({"type": "object", "properties": {"name": {"type": "string"},
    "n": {"type": "integer"}, "xs": {"type": "array", "items": {"type": "boolean"}}},
    "required": ["name"]})");
  expect_masks_match_brute_force(g, {"", "{", "{\"name\": \"", "{\"name\": \"\xC3", "{\"name\": \"ab\"",
                                     "{\"name\": \"a\", \"n\": 1", "{\"name\": \"a\", \"xs\": [tr",
                                     "{\"name\": \"a\"}"});
  expect_masks_match_brute_force(regex("[€é]{2}x|abc"), {"", "\xE2", "\xE2\x82", "é", "ab"});
}

TEST(MatcherTest, CompletionAndRejection) {
  auto g = regex("ab|abc");
  GrammarMatcher m(g, test_vocab());
  EXPECT_FALSE(m.is_complete());
  EXPECT_FALSE(m.accept_bytes("x"));
  EXPECT_TRUE(m.accept_bytes("ab"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_TRUE(m.can_continue());
  EXPECT_TRUE(m.accept_bytes("c"));
  EXPECT_TRUE(m.is_complete());
  EXPECT_FALSE(m.can_continue());
  std::vector<uint64_t> bits((test_vocab()->size() + 63) / 64, 0);
  m.fill_allowed(bits);
  for (uint64_t w : bits) EXPECT_EQ(w, 0u);
  EXPECT_FALSE(m.accept(test_vocab()->size() - 1));  // a special token
  EXPECT_FALSE(m.accept(-1));
}

TEST(ChoiceTest, ExactlyOneOfTheChoices) {
  auto g = choice_grammar({"yes", "no", "maybe so"});
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(matches(*g, "no"));
  EXPECT_TRUE(matches(*g, "maybe so"));
  EXPECT_FALSE(matches(*g, "maybe"));
  EXPECT_FALSE(choice_grammar({}).ok());
}

}  // namespace
}  // namespace dserve::grammar

namespace dserve::grammar {
namespace {

// Sequences under one spec share an automaton; masks are the same whether computed
// first by this sequence, by another, or by several threads at once.
TEST(CompilerTest, SharedAutomatonAcrossThreads) {
  StructuredOutputCompiler compiler(test_vocab());
  StructuredOutputs spec;
  spec.kind = StructuredOutputs::Kind::kJson;
  spec.text = R"({"type": "object", "properties": {"a": {"type": "string"},
                  "b": {"type": "array", "items": {"type": "integer"}}}, "required": ["a"]})";
  const std::string doc = R"({"a": "é€x\"", "b": [12, 3]})";
  const size_t n_words = (test_vocab()->size() + 63) / 64;
  // Reference: a private automaton, byte by byte.
  std::vector<std::vector<uint64_t>> want;
  {
    auto g = compile_grammar(spec);
    ASSERT_TRUE(g.ok());
    GrammarMatcher m(*g, test_vocab());
    for (char c : doc) {
      want.emplace_back(n_words, 0);
      m.fill_allowed(want.back());
      ASSERT_TRUE(m.accept_bytes(std::string(1, c)));
    }
    EXPECT_TRUE(m.is_complete());
  }
  auto first = compiler.matcher(spec);
  ASSERT_TRUE(first.ok());
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 3; ++round) {
        auto m = compiler.matcher(spec);
        if (!m.ok() || &(*m)->automaton() != &(*first)->automaton()) {
          ++mismatches;
          return;
        }
        for (size_t i = 0; i < doc.size(); ++i) {
          std::vector<uint64_t> bits(n_words, 0);
          (*m)->fill_allowed(bits);
          if (bits != want[i] || !(*m)->accept_bytes(doc.substr(i, 1))) ++mismatches;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  StructuredOutputs other = spec;
  other.text = R"({"type": "integer"})";
  auto m2 = compiler.matcher(other);
  ASSERT_TRUE(m2.ok());
  EXPECT_NE(&(*m2)->automaton(), &(*first)->automaton());
  other.text = "{";
  auto bad = compiler.matcher(other);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not valid JSON"), std::string::npos);
}

// The tool-calling shape: literal text around JSON-schema rules inside GBNF.
TEST(CompilerTest, GrammarWithSchemaRules) {
  StructuredOutputs spec;
  spec.kind = StructuredOutputs::Kind::kGrammar;
  spec.text = R"(root ::= call | call "\n" root
call ::= "<tool_call>{\"name\": \"f\", \"arguments\": " f_args "}</tool_call>" | "<tool_call>{\"name\": \"g\", \"arguments\": " g_args "}</tool_call>")";
  spec.schema_rules = {{"f_args", R"({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})"},
                       {"g_args", R"({"type": "object", "properties": {"s": {"enum": ["a", "b"]}, "t": {"type": "object", "properties": {"u": {"type": "boolean"}}}}, "required": ["s"]})"}};
  auto g = compile_grammar(spec);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(matches(*g, R"(<tool_call>{"name": "f", "arguments": {"x": -3}}</tool_call>)"));
  EXPECT_TRUE(matches(*g, "<tool_call>{\"name\": \"g\", \"arguments\": {\"s\": \"b\", \"t\": {\"u\": true}}}</tool_call>\n"
                          "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>"));
  EXPECT_FALSE(matches(*g, R"(<tool_call>{"name": "f", "arguments": {"s": "a"}}</tool_call>)"));
  EXPECT_FALSE(matches(*g, R"(<tool_call>{"name": "h", "arguments": {}}</tool_call>)"));
  spec.schema_rules[1].second = "{";
  auto bad = compile_grammar(spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rule 'g_args'"), std::string::npos);
}

}  // namespace
}  // namespace dserve::grammar
