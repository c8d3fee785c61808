// Value: what a Jinja expression evaluates to, with Python's semantics.
//
// Chat templates are written against Python objects (str, int, float, bool, None,
// list, tuple, dict) plus Jinja's Undefined and Namespace; printing, comparing,
// truth-testing and repr() must behave exactly as in CPython for the rendered text to
// be byte-identical to transformers' `apply_chat_template`. Strings are UTF-8 and
// immutable; lists and dicts are shared and mutable (a namespace attribute or
// `list.append` changes the object every holder sees), as in Python.
//
// Errors during rendering are thrown as TemplateError and caught at the Template
// boundary (template.h), which returns them as a Status; nothing here escapes the
// module as an exception.
//
// Thread-safety: a Value is confined to the render call that made it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace dserve::jinja {

// A render-time error: a Jinja exception, a Python TypeError, a limit hit.
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value;
class MutationScope;
struct ListObj;
struct DictObj;
struct FunctionObj;

// Arguments of a call: positional, then keyword (in call order).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Jinja's default Undefined: prints as "", is falsy, iterates as empty; any other use
// raises an error whose text is `hint` ("'x' is undefined").
struct Undefined {
  std::shared_ptr<const std::string> hint;
};
struct NoneType {};

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

// Bounds what one render builds (RenderLimits::max_built_bytes): while a BuildBudget is
// alive on this thread, every string and list a template makes is charged its size (a
// list 16 bytes an item), and the one that goes past the budget is a TemplateError.
// Steps alone do not bound a render's work: a loop of a few thousand steps could build a
// 64 MiB string, or a list of a hundred thousand items, at each.
class BuildBudget {
 public:
  explicit BuildBudget(size_t max_bytes);
  ~BuildBudget();
  BuildBudget(const BuildBudget&) = delete;
  BuildBudget& operator=(const BuildBudget&) = delete;
  // Charges the budget alive on this thread, if any.
  static void charge(size_t bytes);

 private:
  size_t max_bytes_;
  size_t left_;
  BuildBudget* previous_;
};

class Value {
 public:
  Value() : v_(Undefined{}) {}
  static Value undefined(std::string hint);
  static Value none() { return Value(NoneType{}); }
  static Value boolean(bool b) { return Value(b); }
  static Value integer(int64_t i) { return Value(i); }
  static Value floating(double d) { return Value(d); }
  static Value string(std::string s) {
    BuildBudget::charge(s.size());
    return Value(std::make_shared<const std::string>(std::move(s)));
  }
  static Value list(std::vector<Value> items = {}, bool is_tuple = false);
  static Value dict();
  static Value namespace_object();
  static Value function(std::string name, std::function<Value(CallArgs&)> fn);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // int, float or bool: Python's numbers.Number.
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }  // list or tuple
  bool is_tuple() const;
  bool is_dict() const { return kind() == Kind::kDict; }  // dict, namespace or loop
  bool is_mapping() const;                                // a plain dict
  bool is_namespace() const;
  bool is_function() const { return kind() == Kind::kFunction; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // int or bool as int64 (bool is an int in Python).
  int64_t as_integral() const { return is_bool() ? as_bool() : as_int(); }
  // Any number as double.
  double as_double() const;
  const std::string& str() const { return *std::get<StrPtr>(v_); }
  ListObj& list_obj() const { return *std::get<ListPtr>(v_); }
  DictObj& dict_obj() const { return *std::get<DictPtr>(v_); }
  FunctionObj& function_obj() const { return *std::get<FuncPtr>(v_); }
  const std::string& undefined_hint() const;

  // Python truth value (Undefined is false).
  bool truthy() const;
  // str(value) as Jinja prints it ({{ value }}); Undefined prints as "".
  std::string to_str() const;
  // repr(value), used inside list and dict reprs.
  std::string repr() const;
  // Python's type name, for error messages ("str", "NoneType", "dict").
  std::string type_name() const;
  // Throws the undefined error (for an Undefined) or `what`.
  [[noreturn]] void fail(const std::string& what) const;

  // ==, with Python's rules (1 == 1.0 == True, [1] != (1,), dicts by content).
  static bool equals(const Value& a, const Value& b);
  // <: numbers, strings, lists; anything else is a TypeError.
  static bool less(const Value& a, const Value& b);
  // Identity (`is sameas`): same object for containers, equal value for scalars.
  static bool same(const Value& a, const Value& b);

  // The items a `for` loop visits: list/tuple items, dict keys, string characters;
  // Undefined gives none. Anything else is a TypeError.
  std::vector<Value> iterate() const;

 private:
  friend class MutationScope;
  using StrPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<ListObj>;
  using DictPtr = std::shared_ptr<DictObj>;
  using FuncPtr = std::shared_ptr<FunctionObj>;
  template <typename T>
  explicit Value(T v) : v_(std::move(v)) {}
  std::variant<Undefined, NoneType, bool, int64_t, double, StrPtr, ListPtr, DictPtr, FuncPtr> v_;
};

// Containers release their elements iteratively (see value.cc), so destroying a list
// nested a million deep cannot overflow the stack.
struct ListObj {
  ListObj() = default;
  ListObj(const ListObj&) = delete;
  ListObj& operator=(const ListObj&) = delete;
  ~ListObj();
  std::vector<Value> items;
  bool is_tuple = false;
};

enum class DictKind { kDict, kNamespace, kLoop };

// An insertion-ordered dict (Python 3.7+ order), with a hash index for string keys.
struct DictObj {
  DictObj() = default;
  DictObj(const DictObj&) = delete;
  DictObj& operator=(const DictObj&) = delete;
  ~DictObj();
  DictKind kind = DictKind::kDict;
  std::vector<std::pair<Value, Value>> entries;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(const Value& key, Value value);
  void set(std::string_view key, Value value) {
    set(Value::string(std::string(key)), std::move(value));
  }
  void clear();

 private:
  Value* find_mutable(const Value& key);
  std::unordered_map<std::string, size_t> string_index_;
};

struct FunctionObj {
  std::string name;
  std::function<Value(CallArgs&)> fn;
};

// Lists and dicts are reference-counted, so a template that makes a container hold
// itself (`l.append(l)`, `{% set ns.me = ns %}`) would leak it. While a MutationScope
// is alive on this thread, every container a template mutates is noted; when the
// scope ends (the render is over) those still alive are emptied, breaking any cycle.
class MutationScope {
 public:
  MutationScope();
  ~MutationScope();
  MutationScope(const MutationScope&) = delete;
  MutationScope& operator=(const MutationScope&) = delete;
  // Called before mutating `container` (a list or dict).
  static void note(const Value& container);

 private:
  std::vector<std::weak_ptr<ListObj>> lists_;
  std::vector<std::weak_ptr<DictObj>> dicts_;
  MutationScope* previous_;
};

// Binds call arguments to parameter names as Python does: positional first, then
// keywords by name; a missing one is nullopt. Too many arguments or an unknown
// keyword is a TypeError naming `fn_name`.
std::vector<std::optional<Value>> bind_args(const CallArgs& args,
                                            const std::vector<std::string_view>& names,
                                            std::string_view fn_name);

// Python int/float helpers that raise TemplateError on overflow or bad operands.
int64_t checked_int(const Value& v, std::string_view what);

}  // namespace dserve::jinja
