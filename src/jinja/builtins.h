// Jinja's built-in filters and tests, Python's str/dict/list methods, and attribute and
// item access (Jinja's Environment.getattr / getitem) on Values.
//
// Errors (a TypeError, an unknown filter, use of an Undefined) throw TemplateError.
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "jinja/value.h"

namespace dserve::jinja {

// `input | name(args)`.
Value apply_filter(std::string_view name, const Value& input, CallArgs& args);
bool has_filter(std::string_view name);
// `input is name(args)`.
bool apply_test(std::string_view name, const Value& input, CallArgs& args);

// obj.name: for dicts, a method of that name (items, get, ...) wins over a key, as in
// Python; a missing attribute is Undefined. `obj` must not be Undefined. With
// `dict_keys` false a plain dict's keys are not attributes (Python's getattr, as the
// |attr filter uses it).
Value get_attribute(const Value& obj, std::string_view name, bool dict_keys = true);
// obj[key]: a key or index (negative counts from the end); for a string key that is no
// item, the attribute of that name; otherwise Undefined. `obj` must not be Undefined.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on a str, list or tuple.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// self.name(args) for the str, dict and list methods templates use.
Value call_method(const Value& self, std::string_view name, CallArgs& args);

}  // namespace dserve::jinja
