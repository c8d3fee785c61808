// Status and Result<T>: how every fallible operation in dserve reports failure.
//
// A Status is a code plus one human-readable line ("file.gguf: tensor 'x' runs past
// the end of the file"). Result<T> holds either a value or a non-OK Status. Neither
// throws; callers propagate with DS_RETURN_IF_ERROR / DS_ASSIGN_OR_RETURN.
// Thread-safety: plain values, safe to copy between threads.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace dserve {

enum class StatusCode {
  kOk,
  kInvalidArgument,  // the caller asked for something impossible
  kNotFound,         // a file, tensor or key that should exist does not
  kCorrupt,          // a file exists but its contents are malformed
  kUnimplemented,    // valid input that dserve does not support (yet)
  kIoError,          // the OS refused (open, read, mmap)
  kResourceExhausted,
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "corrupt: file.gguf: ..." ; "ok" for success.
  std::string to_string() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace dserve

#define DS_CONCAT_INNER_(a, b) a##b
#define DS_CONCAT_(a, b) DS_CONCAT_INNER_(a, b)

#define DS_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::dserve::Status ds_status_ = (expr);        \
    if (!ds_status_.ok()) return ds_status_;     \
  } while (0)

#define DS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// DS_ASSIGN_OR_RETURN(auto x, make_x());
#define DS_ASSIGN_OR_RETURN(lhs, expr) \
  DS_ASSIGN_OR_RETURN_IMPL_(DS_CONCAT_(ds_result_, __LINE__), lhs, expr)
