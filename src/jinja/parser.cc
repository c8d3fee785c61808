#include "jinja/parser.h"

#include <initializer_list>

#include "jinja/lexer.h"

namespace dserve::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse() {
    Body body = parse_body({}, "");
    if (cur().type != TokenType::kEof) fail("unexpected tag");
    return body;
  }

 private:
  // Counts recursion into nested blocks and expressions.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxNestingDepth) p_->fail("template nested too deeply");
    }
    ~DepthGuard() { --p_->depth_; }

   private:
    Parser* p_;
  };

  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t n = 1) const { return tokens_[std::min(pos_ + n, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }

  [[noreturn]] void fail(const std::string& message) const { fail_at(message, cur()); }
  [[noreturn]] void fail_at(const std::string& message, const Token& t) const {
    throw SyntaxError(message, t.line, t.column);
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kData:
        return "template data";
      case TokenType::kVariableBegin:
        return "'{{'";
      case TokenType::kVariableEnd:
        return "end of print statement";
      case TokenType::kBlockBegin:
        return "'{%'";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kName:
      case TokenType::kOperator:
        return "'" + t.value + "'";
      case TokenType::kString:
        return "string";
      case TokenType::kInteger:
      case TokenType::kFloat:
        return "number";
      case TokenType::kEof:
        return "end of template";
    }
    return "token";
  }

  bool is_op(std::string_view op) const {
    return cur().type == TokenType::kOperator && cur().value == op;
  }
  bool is_name(std::string_view name) const {
    return cur().type == TokenType::kName && cur().value == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail("expected '" + std::string(op) + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) fail("expected a name, got " + describe(cur()));
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) {
      fail("expected end of statement block, got " + describe(cur()));
    }
    next();
  }

  ExprPtr make_expr(Expr::Kind kind, const Token& at) const {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  NodePtr make_node(Node::Kind kind, const Token& at) const {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->line = at.line;
    n->column = at.column;
    return n;
  }

  // ---- statements ----

  // Parses until a {% tag %} whose name is in `end_tags`; the stream is then left at
  // that name. `block` names the construct being closed, for the error message.
  Body parse_body(std::initializer_list<std::string_view> end_tags, std::string_view block) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = cur();
      switch (t.type) {
        case TokenType::kData: {
          auto n = make_node(Node::Kind::kText, t);
          n->text = t.value;
          body.push_back(std::move(n));
          next();
          break;
        }
        case TokenType::kVariableBegin: {
          auto n = make_node(Node::Kind::kOutput, t);
          next();
          n->expr = parse_tuple(false, true, {}, false);
          if (cur().type != TokenType::kVariableEnd) {
            fail("expected end of print statement, got " + describe(cur()));
          }
          next();
          body.push_back(std::move(n));
          break;
        }
        case TokenType::kBlockBegin: {
          const Token& name = peek();
          if (name.type == TokenType::kName) {
            for (std::string_view end : end_tags) {
              if (name.value == end) {
                next();
                return body;
              }
            }
          }
          next();
          body.push_back(parse_statement(end_tags, block));
          break;
        }
        case TokenType::kEof: {
          if (end_tags.size() == 0) return body;
          std::string want;
          for (std::string_view end : end_tags) {
            want += (want.empty() ? "'" : " or '") + std::string(end) + "'";
          }
          fail("unexpected end of template: '" + std::string(block) +
               "' block not closed (looking for " + want + ")");
        }
        case TokenType::kVariableEnd:
        case TokenType::kBlockEnd:
        case TokenType::kName:
        case TokenType::kString:
        case TokenType::kInteger:
        case TokenType::kFloat:
        case TokenType::kOperator:
          fail("unexpected " + describe(t));
      }
    }
  }

  NodePtr parse_statement(std::initializer_list<std::string_view> end_tags,
                          std::string_view block) {
    const Token& t = cur();
    if (t.type != TokenType::kName) fail("tag name expected");
    const std::string name = t.value;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "call") return parse_call_block();
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "generation") {
      auto n = make_node(Node::Kind::kScope, t);
      next();
      expect_block_end();
      n->body = parse_body({"endgeneration"}, "generation");
      next();
      expect_block_end();
      return n;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail("'" + name + "' outside of a loop");
      auto n = make_node(name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, t);
      next();
      expect_block_end();
      return n;
    }
    std::string msg = "encountered unknown tag '" + name + "'";
    if (!block.empty()) msg += " inside '" + std::string(block) + "' block";
    fail(msg);
  }

  NodePtr parse_if() {
    auto n = make_node(Node::Kind::kIf, cur());
    next();
    while (true) {
      ExprPtr cond = parse_tuple(false, false, {}, false);
      expect_block_end();
      Body body = parse_body({"elif", "else", "endif"}, "if");
      n->branches.emplace_back(std::move(cond), std::move(body));
      const std::string tag = next().value;
      if (tag == "elif") continue;
      if (tag == "else") {
        expect_block_end();
        n->else_body = parse_body({"endif"}, "if");
        next();
      }
      expect_block_end();
      return n;
    }
  }

  NodePtr parse_for() {
    auto n = make_node(Node::Kind::kFor, cur());
    next();
    n->target = parse_assign_target(false);
    if (!skip_name("in")) fail("expected 'in', got " + describe(cur()));
    n->expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) n->condition = parse_expression(true);
    if (is_name("recursive")) fail("recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    n->body = parse_body({"endfor", "else"}, "for");
    --loop_depth_;
    if (next().value == "else") {
      expect_block_end();
      n->else_body = parse_body({"endfor"}, "for");
      next();
    }
    expect_block_end();
    return n;
  }

  NodePtr parse_set() {
    const Token& at = cur();
    next();
    AssignTarget target = parse_assign_target(true);
    if (skip_op("=")) {
      auto n = make_node(Node::Kind::kSet, at);
      n->target = std::move(target);
      n->expr = parse_tuple(false, true, {}, false);
      expect_block_end();
      return n;
    }
    auto n = make_node(Node::Kind::kSetBlock, at);
    n->target = std::move(target);
    n->filters = parse_filter_chain();
    expect_block_end();
    n->body = parse_body({"endset"}, "set");
    next();
    expect_block_end();
    return n;
  }

  std::vector<std::pair<std::string, ExprPtr>> parse_signature() {
    std::vector<std::pair<std::string, ExprPtr>> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string pname = expect_name();
      ExprPtr dflt;
      if (skip_op("=")) dflt = parse_expression(true);
      params.emplace_back(std::move(pname), std::move(dflt));
    }
    next();
    return params;
  }

  NodePtr parse_macro() {
    auto n = make_node(Node::Kind::kMacro, cur());
    next();
    n->macro = std::make_unique<Macro>();
    n->macro->name = expect_name();
    n->macro->params = parse_signature();
    expect_block_end();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    n->macro->body = parse_body({"endmacro"}, "macro");
    loop_depth_ = saved_loops;
    next();
    expect_block_end();
    return n;
  }

  NodePtr parse_call_block() {
    auto n = make_node(Node::Kind::kCallBlock, cur());
    next();
    n->macro = std::make_unique<Macro>();
    n->macro->name = "caller";
    if (is_op("(")) n->macro->params = parse_signature();
    n->expr = parse_expression(true);
    if (n->expr->kind != Expr::Kind::kCall) fail("expected a call in {% call %}");
    expect_block_end();
    n->macro->body = parse_body({"endcall"}, "call");
    next();
    expect_block_end();
    return n;
  }

  NodePtr parse_filter_block() {
    auto n = make_node(Node::Kind::kFilterBlock, cur());
    next();
    if (cur().type != TokenType::kName) fail("expected a filter name");
    n->filters = parse_filter_chain(/*start_inline=*/true);
    expect_block_end();
    n->body = parse_body({"endfilter"}, "filter");
    next();
    expect_block_end();
    return n;
  }

  NodePtr parse_with() {
    auto n = make_node(Node::Kind::kWith, cur());
    next();
    while (cur().type != TokenType::kBlockEnd) {
      if (!n->assigns.empty()) expect_op(",");
      AssignTarget target = parse_assign_target(false);
      expect_op("=");
      n->assigns.emplace_back(std::move(target), parse_expression(true));
    }
    expect_block_end();
    n->body = parse_body({"endwith"}, "with");
    next();
    expect_block_end();
    return n;
  }

  // name | name.attr (with_namespace) | name, name, ... | (name, name)
  AssignTarget parse_assign_target(bool with_namespace) {
    AssignTarget target;
    if (with_namespace && cur().type == TokenType::kName && peek().type == TokenType::kOperator &&
        peek().value == ".") {
      target.names.push_back(next().value);
      next();
      target.attribute = expect_name();
      return target;
    }
    const bool paren = skip_op("(");
    while (true) {
      target.names.push_back(expect_name());
      if (!skip_op(",")) break;
      target.is_tuple = true;
      if (cur().type != TokenType::kName) break;
    }
    if (paren) {
      target.is_tuple = true;
      expect_op(")");
    }
    return target;
  }

  // Filters after `{% set x | f %}` or `{% filter f | g %}`.
  std::vector<ExprPtr> parse_filter_chain(bool start_inline = false) {
    std::vector<ExprPtr> filters;
    while (start_inline || is_op("|")) {
      if (!start_inline) next();
      start_inline = false;
      filters.push_back(parse_filter_call(nullptr));
    }
    return filters;
  }

  // ---- expressions ----

  ExprPtr parse_expression(bool with_condexpr) {
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  bool at_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = cur();
    if (t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd ||
        t.type == TokenType::kEof) {
      return true;
    }
    if (t.type == TokenType::kOperator && t.value == ")") return true;
    if (t.type == TokenType::kName) {
      for (std::string_view e : extra_end) {
        if (t.value == e) return true;
      }
    }
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr,
                      std::initializer_list<std::string_view> extra_end, bool explicit_parens) {
    const Token& at = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (at_tuple_end(extra_end)) break;
      items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail("expected an expression, got " + describe(cur()));
    }
    auto e = make_expr(Expr::Kind::kTuple, at);
    e->children = std::move(items);
    return e;
  }

  ExprPtr parse_condexpr() {
    DepthGuard guard(this);
    const Token& at = cur();
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr cond = parse_or();
      ExprPtr otherwise;
      if (skip_name("else")) otherwise = parse_condexpr();
      auto e = make_expr(Expr::Kind::kCond, at);
      e->children.push_back(std::move(expr1));
      e->children.push_back(std::move(cond));
      e->children.push_back(std::move(otherwise));
      expr1 = std::move(e);
    }
    return expr1;
  }

  ExprPtr binary(Expr::Kind kind, const Token& at, std::string op, ExprPtr l, ExprPtr r) {
    auto e = make_expr(kind, at);
    e->name = std::move(op);
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const Token& at = next();
      left = binary(Expr::Kind::kOr, at, "or", std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const Token& at = next();
      left = binary(Expr::Kind::kAnd, at, "and", std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(this);
      auto e = make_expr(Expr::Kind::kNot, next());
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& at = cur();
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    while (true) {
      if (cur().type == TokenType::kOperator &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
           cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        ops.push_back(next().value);
      } else if (skip_name("in")) {
        ops.push_back("in");
      } else if (is_name("not") && peek().type == TokenType::kName && peek().value == "in") {
        next();
        next();
        ops.push_back("notin");
      } else {
        break;
      }
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make_expr(Expr::Kind::kCompare, at);
    e->children.push_back(std::move(first));
    for (auto& r : rest) e->children.push_back(std::move(r));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = next();
      left = binary(Expr::Kind::kBinary, at, at.value, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token& at = next();
      left = binary(Expr::Kind::kBinary, at, "~", std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = next();
      left = binary(Expr::Kind::kBinary, at, at.value, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& at = next();
      left = binary(Expr::Kind::kBinary, at, "**", std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& at = next();
      node = make_expr(Expr::Kind::kUnary, at);
      node->name = at.value;
      node->children.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    DepthGuard guard(this);
    const Token& t = cur();
    switch (t.type) {
      case TokenType::kName: {
        next();
        auto e = make_expr(Expr::Kind::kLiteral, t);
        if (t.value == "true" || t.value == "True") {
          e->literal = Value::boolean(true);
        } else if (t.value == "false" || t.value == "False") {
          e->literal = Value::boolean(false);
        } else if (t.value == "none" || t.value == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.value;
        }
        return e;
      }
      case TokenType::kString: {
        auto e = make_expr(Expr::Kind::kLiteral, t);
        std::string s;
        while (cur().type == TokenType::kString) s += next().value;
        e->literal = Value::string(std::move(s));
        return e;
      }
      case TokenType::kInteger: {
        next();
        auto e = make_expr(Expr::Kind::kLiteral, t);
        e->literal = Value::integer(t.int_value);
        return e;
      }
      case TokenType::kFloat: {
        next();
        auto e = make_expr(Expr::Kind::kLiteral, t);
        e->literal = Value::floating(t.float_value);
        return e;
      }
      case TokenType::kOperator:
        if (t.value == "(") {
          next();
          ExprPtr e = parse_tuple(false, true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      case TokenType::kData:
      case TokenType::kVariableBegin:
      case TokenType::kVariableEnd:
      case TokenType::kBlockBegin:
      case TokenType::kBlockEnd:
      case TokenType::kEof:
        break;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_list() {
    auto e = make_expr(Expr::Kind::kList, next());
    while (!is_op("]")) {
      if (!e->children.empty()) expect_op(",");
      if (is_op("]")) break;
      e->children.push_back(parse_expression(true));
    }
    next();
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make_expr(Expr::Kind::kDict, next());
    while (!is_op("}")) {
      if (!e->children.empty()) expect_op(",");
      if (is_op("}")) break;
      e->children.push_back(parse_expression(true));
      expect_op(":");
      e->children.push_back(parse_expression(true));
    }
    next();
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        while (skip_op("|")) node = parse_filter_call(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard guard(this);
    const Token& at = next();
    if (at.value == ".") {
      if (cur().type == TokenType::kName) {
        auto e = make_expr(Expr::Kind::kAttr, at);
        e->name = next().value;
        e->children.push_back(std::move(node));
        return e;
      }
      if (cur().type == TokenType::kInteger) {
        auto e = make_expr(Expr::Kind::kItem, at);
        auto idx = make_expr(Expr::Kind::kLiteral, cur());
        idx->literal = Value::integer(next().int_value);
        e->children.push_back(std::move(node));
        e->children.push_back(std::move(idx));
        return e;
      }
      fail("expected name or number after '.'");
    }
    // "[" subscript: an index, a slice, or a tuple of indices.
    std::vector<ExprPtr> args;
    bool has_slice = false;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      ExprPtr a = parse_subscribed(at);
      if (a->kind == Expr::Kind::kSlice) has_slice = true;
      args.push_back(std::move(a));
    }
    next();
    if (args.empty()) fail_at("expected a subscript", at);
    if (args.size() == 1 && has_slice) {
      ExprPtr s = std::move(args[0]);
      s->children[0] = std::move(node);
      return s;
    }
    if (has_slice) fail_at("multi-dimensional slices are not supported", at);
    auto e = make_expr(Expr::Kind::kItem, at);
    e->children.push_back(std::move(node));
    if (args.size() == 1) {
      e->children.push_back(std::move(args[0]));
    } else {
      auto tuple = make_expr(Expr::Kind::kTuple, at);
      tuple->children = std::move(args);
      e->children.push_back(std::move(tuple));
    }
    return e;
  }

  // One entry of [..]: an expression, or a slice (children[0] is left for the object).
  ExprPtr parse_subscribed(const Token& at) {
    std::vector<ExprPtr> parts;  // start, stop, step
    if (is_op(":")) {
      next();
      parts.push_back(nullptr);
    } else {
      ExprPtr e = parse_expression(true);
      if (!is_op(":")) return e;
      next();
      parts.push_back(std::move(e));
    }
    if (is_op(":") || is_op("]") || is_op(",")) {
      parts.push_back(nullptr);
    } else {
      parts.push_back(parse_expression(true));
    }
    if (skip_op(":")) {
      if (is_op("]") || is_op(",")) {
        parts.push_back(nullptr);
      } else {
        parts.push_back(parse_expression(true));
      }
    } else {
      parts.push_back(nullptr);
    }
    auto s = make_expr(Expr::Kind::kSlice, at);
    s->children.push_back(nullptr);
    for (auto& p : parts) s->children.push_back(std::move(p));
    return s;
  }

  // Parses "(args)" into e->children (after any already there) and e->kwargs.
  void parse_call_args(Expr* e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == TokenType::kName && peek().type == TokenType::kOperator &&
          peek().value == "=") {
        std::string key = next().value;
        next();
        e->kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e->kwargs.empty()) fail("positional argument follows keyword argument");
        e->children.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    DepthGuard guard(this);
    auto e = make_expr(Expr::Kind::kCall, cur());
    e->children.push_back(std::move(callee));
    parse_call_args(e.get());
    return e;
  }

  // After "|": name(.name)* [(args)]; `input` may be null ({% filter %}, {% set | %}).
  ExprPtr parse_filter_call(ExprPtr input) {
    DepthGuard guard(this);
    const Token& at = cur();
    auto e = make_expr(Expr::Kind::kFilter, at);
    e->name = expect_name();
    while (skip_op(".")) e->name += "." + expect_name();
    e->children.push_back(std::move(input));
    if (is_op("(")) parse_call_args(e.get());
    return e;
  }

  ExprPtr parse_test(ExprPtr input) {
    DepthGuard guard(this);
    const Token& at = next();  // "is"
    const bool negated = skip_name("not");
    auto e = make_expr(Expr::Kind::kTest, at);
    e->name = expect_name();
    while (skip_op(".")) e->name += "." + expect_name();
    e->children.push_back(std::move(input));
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(e.get());
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                t.type == TokenType::kInteger || t.type == TokenType::kFloat ||
                (t.type == TokenType::kOperator &&
                 (t.value == "(" || t.value == "[" || t.value == "{"))) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with 'is'");
      e->children.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = make_expr(Expr::Kind::kNot, at);
    n->children.push_back(std::move(e));
    return n;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(tokenize(source)).parse(); }

}  // namespace dserve::jinja
