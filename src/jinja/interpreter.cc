#include "jinja/interpreter.h"

#include <cstdio>

#include "jinja/builtins.h"
#include "jinja/globals.h"
#include "jinja/operators.h"

namespace dserve::jinja {

Interpreter::Interpreter(const RenderLimits& limits) : limits_(limits) {}

std::string Interpreter::render(const Body& body,
                                const std::vector<std::pair<std::string, Value>>& vars) {
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                  std::chrono::duration<double>(limits_.max_seconds));
  frames_.clear();
  frames_.push_back(make_globals());
  frames_.emplace_back();
  for (const auto& [name, value] : vars) frames_[1][name] = value;
  floor_ = 1;
  std::string out;
  {
    MutationScope cycles;
    BuildBudget budget(limits_.max_built_bytes);
    exec_body(body, &out);
    frames_.clear();
  }
  return out;
}

void Interpreter::append(std::string* out, std::string_view s) const {
  if (out->size() + s.size() > limits_.max_output_bytes) {
    throw TemplateError("rendered output exceeds " + std::to_string(limits_.max_output_bytes) +
                        " bytes");
  }
  out->append(s);
}

void Interpreter::step() {
  if (++steps_ > limits_.max_steps) {
    throw TemplateError("template exceeded " + std::to_string(limits_.max_steps) +
                        " loop iterations and macro calls");
  }
  // The clock every 16 steps: reading it costs a tenth of an empty loop iteration.
  if (steps_ % 16 == 0 && std::chrono::steady_clock::now() > deadline_) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", limits_.max_seconds);
    throw TemplateError(std::string("template rendering took longer than ") + seconds + " s");
  }
}

Value Interpreter::lookup(const std::string& name) const {
  auto find_in = [&](size_t i) -> const Value* {
    const auto it = frames_[i].find(name);
    return it == frames_[i].end() ? nullptr : &it->second;
  };
  for (size_t i = frames_.size(); i-- > floor_;) {
    if (const Value* v = find_in(i)) return *v;
  }
  if (floor_ > 1) {
    if (const Value* v = find_in(1)) return *v;
  }
  if (const Value* v = find_in(0)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

void Interpreter::assign(const AssignTarget& target, const Value& value) {
  Frame& frame = frames_.back();
  if (!target.attribute.empty()) {
    const Value ns = lookup(target.names[0]);
    if (!ns.is_namespace()) {
      ns.fail("cannot assign attribute on non-namespace object");
    }
    if (!target.attribute.empty() && target.attribute[0] == '_') {
      throw TemplateError(
          "chat templates cannot store underscore-prefixed attributes on a namespace");
    }
    MutationScope::note(ns);
    ns.dict_obj().set(target.attribute, value);
    return;
  }
  if (!target.is_tuple) {
    frame[target.names[0]] = value;
    return;
  }
  const std::vector<Value> items = value.iterate();
  if (items.size() != target.names.size()) {
    throw TemplateError(
        items.size() > target.names.size()
            ? "too many values to unpack (expected " + std::to_string(target.names.size()) + ")"
            : "not enough values to unpack (expected " + std::to_string(target.names.size()) +
                  ", got " + std::to_string(items.size()) + ")");
  }
  for (size_t i = 0; i < items.size(); ++i) frame[target.names[i]] = items[i];
}

Interpreter::Flow Interpreter::exec_body(const Body& body, std::string* out) {
  for (const NodePtr& node : body) {
    const Flow flow = exec(*node, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

std::string Interpreter::render_to_string(const Body& body) {
  std::string out;
  frames_.emplace_back();
  exec_body(body, &out);
  frames_.pop_back();
  return out;
}

Interpreter::Flow Interpreter::exec(const Node& node, std::string* out) {
  switch (node.kind) {
    case Node::Kind::kText:
      append(out, node.text);
      return Flow::kNormal;
    case Node::Kind::kOutput:
      append(out, eval(*node.expr).to_str());
      return Flow::kNormal;
    case Node::Kind::kIf:
      for (const auto& [cond, body] : node.branches) {
        if (eval(*cond).truthy()) return exec_body(body, out);
      }
      return exec_body(node.else_body, out);
    case Node::Kind::kFor:
      return exec_for(node, out);
    case Node::Kind::kSet:
      assign(node.target, eval(*node.expr));
      return Flow::kNormal;
    case Node::Kind::kSetBlock:
    case Node::Kind::kFilterBlock: {
      Value v = Value::string(render_to_string(node.body));
      for (const ExprPtr& f : node.filters) v = eval_filter(*f, &v);
      if (node.kind == Node::Kind::kSetBlock) {
        assign(node.target, v);
      } else {
        append(out, v.to_str());
      }
      return Flow::kNormal;
    }
    case Node::Kind::kMacro:
      frames_.back()[node.macro->name] = make_macro(*node.macro);
      return Flow::kNormal;
    case Node::Kind::kCallBlock: {
      const Expr& call = *node.expr;
      const Value callee = eval(*call.children[0]);
      CallArgs args = eval_args(call, 1);
      args.keyword.emplace_back("caller", make_macro(*node.macro));
      if (!callee.is_function()) callee.fail("'" + callee.type_name() + "' object is not callable");
      append(out, callee.function_obj().fn(args).to_str());
      return Flow::kNormal;
    }
    case Node::Kind::kWith: {
      std::vector<Value> values;
      for (const auto& a : node.assigns) values.push_back(eval(*a.second));
      frames_.emplace_back();
      for (size_t i = 0; i < values.size(); ++i) assign(node.assigns[i].first, values[i]);
      const Flow flow = exec_body(node.body, out);
      frames_.pop_back();
      return flow;
    }
    case Node::Kind::kScope:
      return exec_body(node.body, out);
    case Node::Kind::kBreak:
      return Flow::kBreak;
    case Node::Kind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec_for(const Node& node, std::string* out) {
  std::vector<Value> items = eval(*node.expr).iterate();
  if (node.condition) {
    std::vector<Value> kept;
    for (const Value& item : items) {
      step();
      frames_.emplace_back();
      assign(node.target, item);
      const bool keep = eval(*node.condition).truthy();
      frames_.pop_back();
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec_body(node.else_body, out);
  const auto n = static_cast<int64_t>(items.size());
  // One `loop` object for the whole loop, updated in place each iteration, as Jinja's
  // LoopContext is one object: a fresh dict of twelve entries per iteration cost dozens
  // of allocations, which made a loop iteration many times dearer than its body.
  enum Entry { kIndex, kIndex0, kRevindex, kRevindex0, kFirst, kLast, kLength, kDepth, kDepth0,
               kPrevitem, kNextitem, kCycle };  // positions in the object's entries
  Value loop = Value::dict();
  DictObj& l = loop.dict_obj();
  l.kind = DictKind::kLoop;
  for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                          "depth", "depth0", "previtem", "nextitem", "cycle"}) {
    l.set(key, Value::none());
  }
  const std::shared_ptr<int64_t> index0 = std::make_shared<int64_t>(0);
  l.entries[kCycle].second = Value::function("cycle", [index0](CallArgs& args) {
    if (args.positional.empty()) throw TemplateError("no items for cycling given");
    return args.positional[*index0 % args.positional.size()];
  });
  l.entries[kLength].second = Value::integer(n);
  l.entries[kDepth].second = Value::integer(1);
  l.entries[kDepth0].second = Value::integer(0);
  const Value no_previous = Value::undefined("there is no previous item");
  const Value no_next = Value::undefined("there is no next item");
  for (int64_t i = 0; i < n; ++i) {
    step();
    frames_.emplace_back();
    assign(node.target, items[i]);
    *index0 = i;
    l.entries[kIndex].second = Value::integer(i + 1);
    l.entries[kIndex0].second = Value::integer(i);
    l.entries[kRevindex].second = Value::integer(n - i);
    l.entries[kRevindex0].second = Value::integer(n - i - 1);
    l.entries[kFirst].second = Value::boolean(i == 0);
    l.entries[kLast].second = Value::boolean(i == n - 1);
    l.entries[kPrevitem].second = i > 0 ? items[i - 1] : no_previous;
    l.entries[kNextitem].second = i + 1 < n ? items[i + 1] : no_next;
    frames_.back()["loop"] = loop;
    const Flow flow = exec_body(node.body, out);
    frames_.pop_back();
    if (flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

CallArgs Interpreter::eval_args(const Expr& e, size_t first_arg) {
  CallArgs args;
  for (size_t i = first_arg; i < e.children.size(); ++i)
    args.positional.push_back(eval(*e.children[i]));
  for (const auto& [name, expr] : e.kwargs) args.keyword.emplace_back(name, eval(*expr));
  return args;
}

Value Interpreter::eval_filter(const Expr& e, const Value* input) {
  const Value in = input ? *input : eval(*e.children[0]);
  CallArgs args = eval_args(e, 1);
  return apply_filter(e.name, in, args);
}

Value Interpreter::eval_call(const Expr& e) {
  const Value callee = eval(*e.children[0]);
  if (!callee.is_function()) {
    callee.fail("'" + callee.type_name() + "' object is not callable");
  }
  CallArgs args = eval_args(e, 1);
  return callee.function_obj().fn(args);
}

Value Interpreter::eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName:
      return lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.children.size());
      for (const ExprPtr& c : e.children) items.push_back(eval(*c));
      return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        Value key = eval(*e.children[i]);
        if (key.is_list() && !key.is_tuple()) throw TemplateError("unhashable type: 'list'");
        if (key.is_dict()) throw TemplateError("unhashable type: 'dict'");
        d.dict_obj().set(key, eval(*e.children[i + 1]));
      }
      return d;
    }
    case Expr::Kind::kAttr: {
      const Value obj = eval(*e.children[0]);
      if (obj.is_undefined()) obj.fail("");
      return get_attribute(obj, e.name);
    }
    case Expr::Kind::kItem: {
      const Value obj = eval(*e.children[0]);
      const Value key = eval(*e.children[1]);
      if (obj.is_undefined()) obj.fail("");
      return get_item(obj, key);
    }
    case Expr::Kind::kSlice: {
      const Value obj = eval(*e.children[0]);
      if (obj.is_undefined()) obj.fail("");
      auto part = [&](size_t i) { return e.children[i] ? eval(*e.children[i]) : Value::none(); };
      return get_slice(obj, part(1), part(2), part(3));
    }
    case Expr::Kind::kCall:
      return eval_call(e);
    case Expr::Kind::kFilter:
      return eval_filter(e, nullptr);
    case Expr::Kind::kTest: {
      const Value in = eval(*e.children[0]);
      CallArgs args = eval_args(e, 1);
      return Value::boolean(apply_test(e.name, in, args));
    }
    case Expr::Kind::kUnary:
      return unary_op(e.name, eval(*e.children[0]));
    case Expr::Kind::kNot:
      return Value::boolean(!eval(*e.children[0]).truthy());
    case Expr::Kind::kBinary: {
      const Value a = eval(*e.children[0]);
      const Value b = eval(*e.children[1]);
      return binary_op(e.name, a, b, limits_.max_output_bytes);
    }
    case Expr::Kind::kCompare: {
      Value left = eval(*e.children[0]);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.children[i + 1]);
        if (!compare_op(e.ops[i], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case Expr::Kind::kAnd: {
      Value left = eval(*e.children[0]);
      return left.truthy() ? eval(*e.children[1]) : left;
    }
    case Expr::Kind::kOr: {
      Value left = eval(*e.children[0]);
      return left.truthy() ? left : eval(*e.children[1]);
    }
    case Expr::Kind::kCond:
      if (eval(*e.children[1]).truthy()) return eval(*e.children[0]);
      if (e.children[2]) return eval(*e.children[2]);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
  }
  return Value();
}

Value Interpreter::make_macro(const Macro& macro) {
  const Macro* m = &macro;
  return Value::function(macro.name, [this, m](CallArgs& args) { return call_macro(*m, args); });
}

Value Interpreter::call_macro(const Macro& macro, CallArgs& args) {
  step();
  if (call_depth_ >= limits_.max_call_depth) {
    throw TemplateError("maximum macro call depth (" + std::to_string(limits_.max_call_depth) +
                        ") exceeded in '" + macro.name + "'");
  }
  Frame frame;
  std::vector<bool> given(macro.params.size(), false);
  std::vector<Value> varargs;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i < macro.params.size()) {
      frame[macro.params[i].first] = args.positional[i];
      given[i] = true;
    } else {
      varargs.push_back(args.positional[i]);
    }
  }
  Value kwargs = Value::dict();
  for (auto& [name, value] : args.keyword) {
    size_t i = 0;
    while (i < macro.params.size() && macro.params[i].first != name) ++i;
    if (i < macro.params.size()) {
      if (given[i]) {
        throw TemplateError("macro '" + macro.name + "' got multiple values for argument '" + name +
                            "'");
      }
      frame[name] = value;
      given[i] = true;
    } else if (name == "caller") {
      frame["caller"] = value;
    } else {
      kwargs.dict_obj().set(name, value);
    }
  }
  frame["varargs"] = Value::list(std::move(varargs), /*is_tuple=*/true);
  frame["kwargs"] = kwargs;

  const size_t saved_floor = floor_;
  frames_.push_back(std::move(frame));
  floor_ = frames_.size() - 1;
  ++call_depth_;
  // An error abandons the whole render, so the scopes need no unwinding on throw.
  std::string out;
  // Defaults are evaluated at call time, seeing the arguments before them.
  for (size_t i = 0; i < macro.params.size(); ++i) {
    if (given[i]) continue;
    const auto& [name, dflt] = macro.params[i];
    frames_.back()[name] =
        dflt ? eval(*dflt) : Value::undefined("parameter '" + name + "' was not provided");
  }
  exec_body(macro.body, &out);
  --call_depth_;
  frames_.resize(floor_);
  floor_ = saved_floor;
  return Value::string(std::move(out));
}

}  // namespace dserve::jinja
