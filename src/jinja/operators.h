// Python's arithmetic, comparison and membership operators on Values, as Jinja
// evaluates `+ - * / // % ** ~ == != < <= > >= in` (Python ints are unbounded; here an
// int64 overflow is an error instead).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>

#include "jinja/value.h"

namespace dserve::jinja {

// `op` is one of + - * / // % ** ~. A result string or list longer than `max_size`
// (bytes or items) is an error.
Value binary_op(std::string_view op, const Value& a, const Value& b, size_t max_size);
// Unary - and +.
Value unary_op(std::string_view op, const Value& a);
// `op` is one of == != < <= > >= in notin.
bool compare_op(std::string_view op, const Value& a, const Value& b);
// item in container.
bool contains(const Value& container, const Value& item);

}  // namespace dserve::jinja
