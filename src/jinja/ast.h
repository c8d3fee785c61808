// The syntax tree of a parsed Jinja template: expressions (Expr) and statements
// (Node). Built once by the parser, then only read by the interpreter.
//
// Thread-safety: immutable after parsing; many renders may walk one tree at once.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace dserve::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // children: items
    kTuple,    // children: items
    kDict,     // children: key0, value0, key1, value1, ...
    kAttr,     // children: [object]; name: the attribute (obj.name)
    kItem,     // children: [object, index] (obj[index])
    kSlice,    // children: [object, start, stop, step], any of the last three null
    kCall,     // children: [callee, positional args...]; kwargs
    kFilter,   // children: [input (null inside {% filter %}), args...]; name; kwargs
    kTest,     // children: [input, args...]; name; kwargs (x is name(args))
    kUnary,    // children: [operand]; name: "-" or "+"
    kNot,      // children: [operand]
    kBinary,   // children: [left, right]; name: + - * / // % ** ~
    kCompare,  // children: [first, others...]; ops: ==, !=, <, <=, >, >=, in, notin
    kAnd,      // children: [left, right]
    kOr,       // children: [left, right]
    kCond,     // children: [then, condition, else (null: undefined)]
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::string> ops;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

// The left side of {% set %} / {% for %}: one name, a tuple of names, or ns.attr.
struct AssignTarget {
  std::vector<std::string> names;
  bool is_tuple = false;
  std::string attribute;  // non-empty: names[0].attribute (namespace assignment)
};

struct Macro {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
};

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // expr
    kIf,           // branches (condition, body); else_body
    kFor,          // target in expr [if condition] body [else else_body]
    kSet,          // target = expr
    kSetBlock,     // target = rendered body, through filters
    kMacro,        // macro
    kCallBlock,    // {% call [(params)] expr %}body: macro = caller; expr = the call
    kFilterBlock,  // filters applied to the rendered body
    kWith,         // assigns, then body in a new scope
    kScope,        // body rendered as is ({% generation %})
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  AssignTarget target;
  std::vector<ExprPtr> filters;  // kFilter exprs whose input is null
  std::unique_ptr<Macro> macro;
  std::vector<std::pair<AssignTarget, ExprPtr>> assigns;
};

}  // namespace dserve::jinja
