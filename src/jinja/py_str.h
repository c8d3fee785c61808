// Python `str` semantics over UTF-8 std::string, for the Jinja engine.
//
// Chat templates run under Python, where a string is a sequence of code points:
// len(), indexing, slicing, strip(), split(), upper() and repr() all work on code
// points and use Python's notion of whitespace and printability. These helpers give
// the same results on UTF-8 bytes. Ill-formed UTF-8 never fails: each invalid byte
// decodes to a private code point (0xDC00 + byte, as Python's "surrogateescape") and
// encodes back to the same byte, so bytes round-trip unchanged.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dserve::jinja {

std::u32string decode_utf8(std::string_view s);
std::string encode_utf8(std::u32string_view s);
void append_utf8(std::string* out, char32_t c);
size_t count_code_points(std::string_view s);

// Python's str.isspace() for one code point (also what `\s` matches in `re`).
bool py_isspace(char32_t c);
// Python's str.isalnum() (approximated with ICU's properties) or '_': what `\w` matches.
bool py_isword(char32_t c);

// str.strip/lstrip/rstrip: `chars` absent strips whitespace.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
// str.split(sep, maxsplit) (sep absent: runs of whitespace) and str.rsplit.
// `sep` must not be empty (the caller reports Python's ValueError).
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                   int64_t maxsplit);
// str.splitlines(keepends): \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029.
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
// str.replace(old, new, count); count < 0 replaces all.
std::string py_replace(std::string_view s, std::string_view old_sub, std::string_view new_sub,
                       int64_t count);
// str.find/rfind in code points (-1 when absent); str.count.
int64_t py_find(std::string_view s, std::string_view sub, bool reverse);
int64_t py_count(std::string_view s, std::string_view sub);

// Full Unicode case mappings (ICU root locale, as Python's str.upper/lower).
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
// str.capitalize(): first character title-cased, the rest lower-cased.
std::string py_capitalize(std::string_view s);
// str.title(): a cased character after an uncased one is title-cased, others lowered.
std::string py_title(std::string_view s);
bool py_is_cased(std::string_view s, bool upper);  // str.isupper() / str.islower()

// repr(str): quotes and escapes as CPython does.
std::string py_repr_string(std::string_view s);
// repr(float): the shortest round-trip digits, laid out as CPython's float.__repr__.
std::string py_repr_float(double x);

// Python's slice.indices(): normalises (start, stop, step) against `length`.
// step must not be 0. Returns the selected indices in order.
std::vector<int64_t> py_slice_indices(int64_t length, std::optional<int64_t> start,
                                      std::optional<int64_t> stop, std::optional<int64_t> step);

}  // namespace dserve::jinja
