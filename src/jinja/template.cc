#include "jinja/template.h"

#include <new>

#include "jinja/interpreter.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"

namespace dserve::jinja {

Result<std::unique_ptr<Template>> Template::parse(std::string_view source) {
  std::unique_ptr<Template> t(new Template());
  try {
    t->body_ = parse_template(source);
  } catch (const SyntaxError& e) {
    return invalid_argument("template syntax error at line " + std::to_string(e.line) +
                            ", column " + std::to_string(e.column) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted, "out of memory parsing the template");
  } catch (const std::exception& e) {
    return invalid_argument(std::string("template syntax error: ") + e.what());
  }
  return t;
}

Result<std::string> Template::render(const std::vector<std::pair<std::string, Value>>& variables,
                                     const RenderLimits& limits) const {
  try {
    Interpreter interpreter(limits);
    return interpreter.render(body_, variables);
  } catch (const TemplateError& e) {
    return invalid_argument(e.what());
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted, "out of memory rendering the template");
  } catch (const std::exception& e) {
    // std::stoll and friends on malformed format fields, and the like.
    return invalid_argument(std::string("template error: ") + e.what());
  }
}

}  // namespace dserve::jinja
