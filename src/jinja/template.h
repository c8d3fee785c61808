// Template: a parsed Jinja template that renders with the semantics transformers
// gives chat templates (jinja2's ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, loop controls, its own tojson, raise_exception and strftime_now).
//
// Parse once, render many times: render() is const and keeps all its state local.
// Deviation from the sandbox: `list.append` works (minja and llama.cpp allow it;
// transformers refuses it), so templates that accumulate into a list still render.
//
// Thread-safety: immutable after parse(); render() may run concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "jinja/ast.h"
#include "jinja/value.h"

namespace dserve::jinja {

// Bounds on one render, so a runaway template fails instead of hanging or growing
// without limit.
struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;  // any one string the template builds
  int64_t max_steps = 5'000'000;               // loop iterations plus macro calls
  int max_call_depth = 50;                     // nested macro calls
  // All the strings and lists it builds, summed (BuildBudget in value.h).
  size_t max_built_bytes = size_t{256} << 20;
  // Wall time, checked as steps go: the bounds above leave each step free to read a long
  // string or list (its length, a search, a comparison) again and again.
  double max_seconds = 5.0;
};

class Template {
 public:
  // A malformed template is InvalidArgument "line L, column C: what is wrong".
  static Result<std::unique_ptr<Template>> parse(std::string_view source);

  // Renders with `variables` as the template's context. Any render-time error
  // (raise_exception, a type error, an undefined value used, a limit) is
  // InvalidArgument with Jinja's message.
  Result<std::string> render(const std::vector<std::pair<std::string, Value>>& variables,
                             const RenderLimits& limits = {}) const;

 private:
  Template() = default;
  Body body_;
};

}  // namespace dserve::jinja
