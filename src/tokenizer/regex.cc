#include "tokenizer/regex.h"

#include <oniguruma.h>

#include <mutex>
#include <optional>

#include "tokenizer/utf8.h"

namespace dserve {

namespace {

void init_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

size_t next_char(std::string_view text, size_t pos) {
  if (pos >= text.size()) return pos + 1;
  return pos + utf8::scan(text, pos).length;
}

}  // namespace

Result<std::unique_ptr<Regex>> Regex::compile(std::string_view pattern) {
  init_oniguruma();
  OnigRegex re = nullptr;
  OnigErrorInfo einfo;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&re, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_DEFAULT, &einfo);
  if (rc != ONIG_NORMAL) {
    OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(msg, rc, &einfo);
    return invalid_argument("bad regex /" + std::string(pattern) +
                            "/: " + reinterpret_cast<const char*>(msg));
  }
  return std::unique_ptr<Regex>(new Regex(re));
}

std::string Regex::escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    const unsigned char u = static_cast<unsigned char>(c);
    const bool plain = u >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                       (c >= 'A' && c <= 'Z') || c == '_';
    if (!plain) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

Regex::~Regex() { onig_free(static_cast<OnigRegex>(re_)); }

void Regex::find_all(std::string_view text, std::vector<Match>* out) const {
  auto* re = static_cast<OnigRegex>(re_);
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = str + text.size();
  OnigRegion* region = onig_region_new();
  size_t pos = 0;
  std::optional<size_t> last_match_end;
  while (pos <= text.size()) {
    onig_region_clear(region);
    const int rc = onig_search(re, str, end, str + pos, end, region, ONIG_OPTION_NONE);
    if (rc < 0) break;  // ONIG_MISMATCH, or a match limit: the rest is no match, as in HF
    const auto b = static_cast<size_t>(region->beg[0]);
    const auto e = static_cast<size_t>(region->end[0]);
    if (b == e && last_match_end == e) {
      pos = next_char(text, pos);
      continue;
    }
    out->push_back({b, e});
    pos = e;
    last_match_end = e;
  }
  onig_region_free(region, 1);
}

}  // namespace dserve
