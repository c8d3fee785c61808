#include "grammar/json_schema.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/gbnf_parser.h"
#include "grammar/regex_parser.h"

namespace dserve::grammar {
namespace {

using json = nlohmann::ordered_json;

// The basic JSON rules, in the layout of the header comment.
constexpr std::string_view kBasicRules = R"(
json_value ::= json_number | json_string | json_boolean | json_null | json_array | json_object
json_string ::= "\"" json_char* "\""
json_char ::= [^"\\\x00-\x1F] | "\\" json_escape
json_escape ::= ["\\/bfnrt] | "u" [A-Fa-f0-9]{4}
json_integer ::= "0" | "-"? [1-9] [0-9]*
json_number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [+\-]? [0-9]+)?
json_boolean ::= "true" | "false"
json_null ::= "null"
json_array ::= "[" json_value (", " json_value)* "]" | "[]"
json_object ::= "{" json_string ": " json_value (", " json_string ": " json_value)* "}" | "{}"
)";

// Keywords that only annotate.
const std::set<std::string> kIgnored = {
    "title", "description", "default", "examples", "format", "$schema", "$id", "$comment",
    "$defs", "definitions", "deprecated", "readOnly", "writeOnly", "contentMediaType",
    "contentEncoding", "discriminator", "strict", "name"};
const std::set<std::string> kHandled = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf",
    "allOf", "$ref", "items", "minItems", "maxItems", "prefixItems", "minLength", "maxLength",
    "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

// value as the grammar writes it: ", " and ": " separators, UTF-8 kept.
std::string dump_value(const json& v) {
  if (v.is_object()) {
    std::string s = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) s += ", ";
      first = false;
      s += json(it.key()).dump() + ": " + dump_value(it.value());
    }
    return s + "}";
  }
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) s += ", ";
      s += dump_value(v[i]);
    }
    return s + "]";
  }
  return v.dump();
}

// Decimal digit strings of equal length n, each digit between lo[i] and hi[i]
// lexicographically: the strings s with lo <= s <= hi (leading zeros allowed).
ExprPtr digits_between(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return literal("");
  const uint32_t a = static_cast<uint32_t>(lo[0]), b = static_cast<uint32_t>(hi[0]);
  const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
  if (a == b) return sequence({literal(std::string(1, lo[0])), digits_between(lo_rest, hi_rest)});
  const std::string nines(lo_rest.size(), '9'), zeros(lo_rest.size(), '0');
  std::vector<ExprPtr> alts;
  alts.push_back(sequence({literal(std::string(1, lo[0])), digits_between(lo_rest, nines)}));
  if (b > a + 1) {
    alts.push_back(sequence({char_class({{a + 1, b - 1}}),
                             repeat(char_class({{'0', '9'}}), static_cast<int>(lo_rest.size()),
                                    static_cast<int>(lo_rest.size()))}));
  }
  alts.push_back(sequence({literal(std::string(1, hi[0])), digits_between(zeros, hi_rest)}));
  return alternatives(std::move(alts));
}

// Non-negative integers in [lo, hi] without leading zeros; hi < 0: unbounded.
ExprPtr naturals_between(int64_t lo, int64_t hi) {
  std::vector<ExprPtr> alts;
  const std::string los = std::to_string(lo);
  if (hi < 0) {
    alts.push_back(digits_between(los, std::string(los.size(), '9')));
    alts.push_back(sequence({char_class({{'1', '9'}}),
                             repeat(char_class({{'0', '9'}}), static_cast<int>(los.size()), -1)}));
    return alternatives(std::move(alts));
  }
  const std::string his = std::to_string(hi);
  for (size_t n = los.size(); n <= his.size(); ++n) {
    std::string a = los;
    if (n != los.size()) {
      a.assign(n, '0');
      a[0] = '1';
    }
    const std::string b = n == his.size() ? his : std::string(n, '9');
    if (a <= b) alts.push_back(digits_between(a, b));
  }
  return alternatives(std::move(alts));
}

class SchemaCompiler {
 public:
  // Helper rules are named prefix + "_..." (the basic json_* rules are shared).
  SchemaCompiler(const json& root, std::string prefix, GrammarBuilder* b)
      : root_(root), prefix_(std::move(prefix)), b_(*b) {}

  // Defines rule `name` (and its helpers) for the schema.
  Status add(const std::string& name) {
    if (!b_.has_rule("json_value")) DS_RETURN_IF_ERROR(parse_gbnf_into(kBasicRules, &b_));
    DS_ASSIGN_OR_RETURN(ExprPtr e, schema(root_, "#", 0));
    return b_.add_rule(name, e);
  }

 private:
  Status error(const std::string& path, const std::string& what) const {
    return invalid_argument("JSON schema: " + what + " at " + path);
  }

  std::string new_rule_name(const std::string& base) {
    return prefix_ + "_" + base + std::to_string(++counter_);
  }

  Result<ExprPtr> ref(const std::string& target, const std::string& path) {
    if (auto it = refs_.find(target); it != refs_.end()) return rule_ref(it->second);
    if (target.empty() || target[0] != '#') {
      return error(path, "$ref '" + target + "' is not a reference into this document");
    }
    const json* node = &root_;
    std::string pointer = target.substr(1);
    if (!pointer.empty()) {
      try {
        node = &root_.at(json::json_pointer(pointer));
      } catch (const std::exception&) {
        return error(path, "$ref '" + target + "' does not resolve");
      }
    }
    const std::string name = new_rule_name("ref");
    refs_.emplace(target, name);
    DS_ASSIGN_OR_RETURN(ExprPtr body, schema(*node, target, 0));
    DS_RETURN_IF_ERROR(b_.add_rule(name, std::move(body)));
    return rule_ref(name);
  }

  Result<ExprPtr> schema(const json& s, const std::string& path, int depth) {
    if (depth > 64) return error(path, "schema nested too deeply");
    if (s.is_boolean()) {
      if (s.get<bool>()) return rule_ref("json_value");
      return error(path, "the schema false matches nothing");
    }
    if (!s.is_object()) return error(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (kIgnored.count(it.key()) == 0 && kHandled.count(it.key()) == 0) {
        return error(path, "keyword '" + it.key() + "' is not supported");
      }
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return error(path, "$ref must be a string");
      return ref(s["$ref"].get<std::string>(), path);
    }
    if (s.contains("const")) return literal(dump_value(s["const"]));
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) return error(path, "enum must be a non-empty list");
      std::vector<ExprPtr> alts;
      for (const json& v : e) alts.push_back(literal(dump_value(v)));
      return alternatives(std::move(alts));
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const json& list = s[key];
      if (!list.is_array() || list.empty()) {
        return error(path, std::string(key) + " must be a non-empty list");
      }
      std::vector<ExprPtr> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        DS_ASSIGN_OR_RETURN(ExprPtr a, schema(list[i], path + "/" + key + "/" + std::to_string(i),
                                              depth + 1));
        alts.push_back(std::move(a));
      }
      return alternatives(std::move(alts));
    }
    if (s.contains("allOf")) {
      const json& list = s["allOf"];
      if (!list.is_array() || list.size() != 1) {
        return error(path, "allOf is supported with exactly one schema");
      }
      return schema(list[0], path + "/allOf/0", depth + 1);
    }
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) return typed(s, t.get<std::string>(), path, depth);
      if (!t.is_array() || t.empty()) return error(path, "type must be a string or a list");
      std::vector<ExprPtr> alts;
      for (const json& x : t) {
        if (!x.is_string()) return error(path, "type must be a string or a list of strings");
        DS_ASSIGN_OR_RETURN(ExprPtr a, typed(s, x.get<std::string>(), path, depth));
        alts.push_back(std::move(a));
      }
      return alternatives(std::move(alts));
    }
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      return typed(s, "object", path, depth);
    }
    if (s.contains("items") || s.contains("prefixItems")) return typed(s, "array", path, depth);
    if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength")) {
      return typed(s, "string", path, depth);
    }
    if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
        s.contains("exclusiveMaximum")) {
      return error(path, "numeric bounds are supported with type integer only");
    }
    return rule_ref("json_value");
  }

  Result<int> count(const json& s, const char* key, const std::string& path, int fallback) {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return error(path, std::string(key) + " must be a non-negative integer");
    }
    if (v.get<int64_t>() > kMaxRepeat) {
      return error(path, std::string(key) + " above " + std::to_string(kMaxRepeat) +
                             " is not supported");
    }
    return static_cast<int>(v.get<int64_t>());
  }

  Result<ExprPtr> typed(const json& s, const std::string& type, const std::string& path,
                        int depth) {
    if (type == "string") return string_schema(s, path);
    if (type == "integer") return integer_schema(s, path);
    if (type == "number") {
      for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (s.contains(k)) return error(path, std::string("'") + k + "' on a number is not supported");
      }
      return rule_ref("json_number");
    }
    if (type == "boolean") return rule_ref("json_boolean");
    if (type == "null") return rule_ref("json_null");
    if (type == "array") return array_schema(s, path, depth);
    if (type == "object") return object_schema(s, path, depth);
    return error(path, "unknown type '" + type + "'");
  }

  Result<ExprPtr> string_schema(const json& s, const std::string& path) {
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return error(path, "pattern must be a string");
      if (s.contains("minLength") || s.contains("maxLength")) {
        return error(path, "pattern together with minLength / maxLength is not supported");
      }
      Result<ExprPtr> re = parse_regex(s["pattern"].get<std::string>());
      if (!re.ok()) return error(path + "/pattern", re.status().message());
      return sequence({literal("\""), *re, literal("\"")});
    }
    if (!s.contains("minLength") && !s.contains("maxLength")) return rule_ref("json_string");
    DS_ASSIGN_OR_RETURN(int lo, count(s, "minLength", path, 0));
    DS_ASSIGN_OR_RETURN(int hi, count(s, "maxLength", path, -1));
    if (hi >= 0 && hi < lo) return error(path, "maxLength is below minLength");
    return sequence({literal("\""), repeat(rule_ref("json_char"), lo, hi), literal("\"")});
  }

  Result<ExprPtr> integer_schema(const json& s, const std::string& path) {
    std::optional<int64_t> lo, hi;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      const json& v = s[k];
      if (!v.is_number()) return error(path, std::string(k) + " must be a number");
      const double d = v.get<double>();
      if (std::abs(d) > 1e18) return error(path, std::string(k) + " is out of range");
      const std::string key = k;
      if (key == "minimum") lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::ceil(d)));
      if (key == "exclusiveMinimum") lo = std::max(lo.value_or(INT64_MIN), static_cast<int64_t>(std::floor(d)) + 1);
      if (key == "maximum") hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::floor(d)));
      if (key == "exclusiveMaximum") hi = std::min(hi.value_or(INT64_MAX), static_cast<int64_t>(std::ceil(d)) - 1);
    }
    if (!lo && !hi) return rule_ref("json_integer");
    if (lo && hi && *lo > *hi) return error(path, "the integer bounds leave no value");
    std::vector<ExprPtr> alts;
    // Negative part: -(1 .. ) as "-" + naturals.
    if (!lo || *lo < 0) {
      const int64_t neg_hi = lo ? -*lo : -1;  // largest magnitude; -1: unbounded
      const int64_t neg_lo = hi && *hi < 0 ? -*hi : 1;
      alts.push_back(sequence({literal("-"), naturals_between(neg_lo, neg_hi)}));
    }
    if (!hi || *hi >= 0) {
      const int64_t pos_lo = lo && *lo > 0 ? *lo : 0;
      alts.push_back(naturals_between(pos_lo, hi ? *hi : -1));
    }
    return alternatives(std::move(alts));
  }

  Result<ExprPtr> array_schema(const json& s, const std::string& path, int depth) {
    DS_ASSIGN_OR_RETURN(int lo, count(s, "minItems", path, 0));
    DS_ASSIGN_OR_RETURN(int hi, count(s, "maxItems", path, -1));
    if (hi >= 0 && hi < lo) return error(path, "maxItems is below minItems");
    std::vector<ExprPtr> prefix;
    if (s.contains("prefixItems")) {
      const json& p = s["prefixItems"];
      if (!p.is_array()) return error(path, "prefixItems must be a list");
      for (size_t i = 0; i < p.size(); ++i) {
        DS_ASSIGN_OR_RETURN(ExprPtr e, schema(p[i], path + "/prefixItems/" + std::to_string(i),
                                              depth + 1));
        prefix.push_back(std::move(e));
      }
    }
    ExprPtr item = rule_ref("json_value");
    bool no_more = false;
    if (s.contains("items")) {
      if (s["items"].is_boolean() && !s["items"].get<bool>()) {
        no_more = true;
      } else {
        DS_ASSIGN_OR_RETURN(item, schema(s["items"], path + "/items", depth + 1));
      }
    }
    if (!prefix.empty()) {
      // The prefix items in order (all of them: a shorter array is valid, but a fixed
      // tuple is what a prefixItems schema asks for), then any further items.
      if (static_cast<int>(prefix.size()) < lo || (hi >= 0 && static_cast<int>(prefix.size()) > hi)) {
        return error(path, "prefixItems together with minItems / maxItems is not supported");
      }
      std::vector<ExprPtr> seq = {literal("[")};
      for (size_t i = 0; i < prefix.size(); ++i) {
        if (i > 0) seq.push_back(literal(", "));
        seq.push_back(prefix[i]);
      }
      if (!no_more) {
        const int more = hi < 0 ? -1 : hi - static_cast<int>(prefix.size());
        seq.push_back(repeat(sequence({literal(", "), item}), 0, more));
      }
      seq.push_back(literal("]"));
      return sequence(std::move(seq));
    }
    if (no_more) hi = 0;
    // Name the item so that its grammar is lowered once however often it repeats.
    const std::string name = new_rule_name("item");
    DS_RETURN_IF_ERROR(b_.add_rule(name, item));
    item = rule_ref(name);
    if (hi == 0) return literal("[]");
    ExprPtr nonempty = sequence({literal("["), item,
                                 repeat(sequence({literal(", "), item}), std::max(lo, 1) - 1,
                                        hi < 0 ? -1 : hi - 1),
                                 literal("]")});
    if (lo == 0) return alternatives({literal("[]"), nonempty});
    return nonempty;
  }

  Result<ExprPtr> object_schema(const json& s, const std::string& path, int depth) {
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return error(path, "required must be a list");
      for (const json& r : s["required"]) {
        if (!r.is_string()) return error(path, "required must be a list of strings");
        required.insert(r.get<std::string>());
      }
    }
    const json empty = json::object();
    const json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) return error(path, "properties must be an object");
    for (const std::string& r : required) {
      if (!props.contains(r)) {
        return error(path, "required property '" + r + "' is not in properties");
      }
    }
    if (props.empty()) {
      const json* ap = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
      if (ap && ap->is_boolean() && !ap->get<bool>()) return literal("{}");
      if (!ap || (ap->is_boolean() && ap->get<bool>())) return rule_ref("json_object");
      DS_ASSIGN_OR_RETURN(ExprPtr value, schema(*ap, path + "/additionalProperties", depth + 1));
      const std::string name = new_rule_name("value");
      DS_RETURN_IF_ERROR(b_.add_rule(name, value));
      ExprPtr member = sequence({rule_ref("json_string"), literal(": "), rule_ref(name)});
      return alternatives({literal("{}"), sequence({literal("{"), member,
                                                     repeat(sequence({literal(", "), member}), 0, -1),
                                                     literal("}")})});
    }
    // Members in schema order. tail_k: members k.. each written after ", "; head_k: the
    // members k.. when none was written before (so the first has no comma).
    struct Member {
      ExprPtr kv;
      bool required;
    };
    std::vector<Member> members;
    for (auto it = props.begin(); it != props.end(); ++it) {
      DS_ASSIGN_OR_RETURN(ExprPtr value, schema(it.value(), path + "/properties/" + it.key(),
                                                depth + 1));
      members.push_back({sequence({literal(json(it.key()).dump() + ": "), std::move(value)}),
                         required.count(it.key()) != 0});
    }
    const int id = ++counter_;
    auto tail_name = [&](size_t k) {
      return prefix_ + "_obj" + std::to_string(id) + "_tail" + std::to_string(k);
    };
    auto head_name = [&](size_t k) {
      return prefix_ + "_obj" + std::to_string(id) + "_head" + std::to_string(k);
    };
    const size_t n = members.size();
    DS_RETURN_IF_ERROR(b_.add_rule(tail_name(n), literal("")));
    DS_RETURN_IF_ERROR(b_.add_rule(head_name(n), literal("")));
    for (size_t k = n; k-- > 0;) {
      ExprPtr with = sequence({literal(", "), members[k].kv, rule_ref(tail_name(k + 1))});
      DS_RETURN_IF_ERROR(b_.add_rule(
          tail_name(k), members[k].required ? with : alternatives({with, rule_ref(tail_name(k + 1))})));
      ExprPtr first = sequence({members[k].kv, rule_ref(tail_name(k + 1))});
      DS_RETURN_IF_ERROR(b_.add_rule(
          head_name(k), members[k].required ? first : alternatives({first, rule_ref(head_name(k + 1))})));
    }
    return sequence({literal("{"), rule_ref(head_name(0)), literal("}")});
  }

  const json& root_;
  const std::string prefix_;
  GrammarBuilder& b_;
  std::map<std::string, std::string> refs_;
  int counter_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> compile_json_schema(std::string_view schema_json) {
  json schema;
  try {
    schema = json::parse(schema_json);
  } catch (const std::exception& e) {
    return invalid_argument(std::string("JSON schema: not valid JSON: ") + e.what());
  }
  GrammarBuilder b;
  SchemaCompiler c(schema, "root", &b);
  DS_RETURN_IF_ERROR(c.add("root"));
  Result<std::shared_ptr<const Grammar>> g = b.build("root");
  if (!g.ok()) return invalid_argument("JSON schema: " + g.status().message());
  return g;
}

Status add_json_schema_rule(std::string_view schema_json, const std::string& name,
                            GrammarBuilder* builder) {
  json schema;
  try {
    schema = json::parse(schema_json);
  } catch (const std::exception& e) {
    return invalid_argument("JSON schema for rule '" + name + "': not valid JSON: " + e.what());
  }
  SchemaCompiler c(schema, name, builder);
  Status s = c.add(name);
  if (!s.ok()) return invalid_argument("rule '" + name + "': " + s.message());
  return s;
}

Result<std::shared_ptr<const Grammar>> json_object_grammar() {
  return compile_json_schema(R"({"type": "object"})");
}

}  // namespace dserve::grammar
