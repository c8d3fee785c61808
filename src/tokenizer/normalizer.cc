#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <vector>

namespace dserve {

namespace {

enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd };

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* impl) : impl_(impl) {}

  std::string normalize(std::string_view text) const override {
    UErrorCode status = U_ZERO_ERROR;
    const icu::StringPiece in(text.data(), static_cast<int32_t>(text.size()));
    if (impl_->isNormalizedUTF8(in, status) && U_SUCCESS(status)) return std::string(text);
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    impl_->normalizeUTF8(0, in, sink, nullptr, status);
    return U_SUCCESS(status) ? out : std::string(text);
  }

 private:
  const icu::Normalizer2* impl_;  // owned by ICU
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}

  std::string normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& step : steps_) s = step->normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

Result<std::unique_ptr<Normalizer>> make_unicode(UnicodeForm form, const std::string& where) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* impl = nullptr;
  switch (form) {
    case UnicodeForm::kNfc:
      impl = icu::Normalizer2::getNFCInstance(status);
      break;
    case UnicodeForm::kNfd:
      impl = icu::Normalizer2::getNFDInstance(status);
      break;
    case UnicodeForm::kNfkc:
      impl = icu::Normalizer2::getNFKCInstance(status);
      break;
    case UnicodeForm::kNfkd:
      impl = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status) || impl == nullptr) {
    return internal_error(where + ": ICU normalizer unavailable: " + u_errorName(status));
  }
  return std::unique_ptr<Normalizer>(new UnicodeNormalizer(impl));
}

}  // namespace

Result<std::unique_ptr<Normalizer>> Normalizer::from_json(const nlohmann::json& j,
                                                          const std::string& where) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return corrupt(where + ": expected an object with a string \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "NFC") return make_unicode(UnicodeForm::kNfc, where);
  if (type == "NFD") return make_unicode(UnicodeForm::kNfd, where);
  if (type == "NFKC") return make_unicode(UnicodeForm::kNfkc, where);
  if (type == "NFKD") return make_unicode(UnicodeForm::kNfkd, where);
  if (type == "Sequence") {
    const auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return corrupt(where + ": Sequence without a \"normalizers\" array");
    }
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < it->size(); ++i) {
      DS_ASSIGN_OR_RETURN(auto step,
                          from_json((*it)[i], where + ".normalizers[" + std::to_string(i) + "]"));
      if (step) steps.push_back(std::move(step));
    }
    if (steps.empty()) return std::unique_ptr<Normalizer>();
    if (steps.size() == 1) return std::move(steps[0]);
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  return unimplemented(where + ": normalizer type \"" + type + "\" is not supported");
}

}  // namespace dserve
