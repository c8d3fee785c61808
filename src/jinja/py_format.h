// Python's two string formatting languages, as templates use them: `"%s" % x` (and
// Jinja's |format filter) and str.format ("{} {name!r:>10}").
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "jinja/value.h"

namespace dserve::jinja {

// format % args: %s %r %a %d %i %u %f %F %e %E %g %G %x %X %o %c %%, with flags,
// width, precision and %(name)s keys. `args` is a tuple, a dict (for keys) or one value.
std::string percent_format(const std::string& format, const Value& args);

// format.format(*args, **kwargs): auto and numbered fields, names, .attr and [key]
// lookups, !r/!s/!a and the common format specs ([[fill]align][sign][0][width][,]
// [.precision][type]); nested replacement fields in a spec are not supported.
std::string str_format(const std::string& format, const CallArgs& args);

// format(value, spec), the builtin behind a str.format field.
std::string format_value(const Value& v, std::string_view spec);

}  // namespace dserve::jinja
