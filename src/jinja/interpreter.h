// Interpreter: renders a syntax tree. One Interpreter serves one render call; it owns
// the scopes (globals, the template's variables, then one frame per loop iteration,
// macro call or {% with %}) and enforces the RenderLimits.
//
// Scoping follows Jinja: {% if %} opens no scope; each loop iteration and macro call
// does, so a {% set %} inside them is not seen outside (namespaces exist for that).
// A macro body sees the globals, the template's top-level variables and its own
// arguments. Errors throw TemplateError (template.cc turns them into a Status).
//
// Thread-safety: confined to one thread.
#pragma once

#include <chrono>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "jinja/ast.h"
#include "jinja/template.h"
#include "jinja/value.h"

namespace dserve::jinja {

class Interpreter {
 public:
  explicit Interpreter(const RenderLimits& limits);
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  std::string render(const Body& body, const std::vector<std::pair<std::string, Value>>& vars);

 private:
  using Frame = std::unordered_map<std::string, Value>;
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec_body(const Body& body, std::string* out);
  Flow exec(const Node& node, std::string* out);
  Flow exec_for(const Node& node, std::string* out);
  Value eval(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_filter(const Expr& e, const Value* input);
  CallArgs eval_args(const Expr& e, size_t first_arg);

  Value lookup(const std::string& name) const;
  void assign(const AssignTarget& target, const Value& value);
  Value make_macro(const Macro& macro);
  Value call_macro(const Macro& macro, CallArgs& args);
  std::string render_to_string(const Body& body);

  void append(std::string* out, std::string_view s) const;
  void step();

  RenderLimits limits_;
  std::vector<Frame> frames_;  // [0] globals, [1] template variables, then scopes
  size_t floor_ = 1;           // frames in (1, floor_) are hidden (caller's scopes in a macro)
  int64_t steps_ = 0;
  int call_depth_ = 0;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace dserve::jinja
