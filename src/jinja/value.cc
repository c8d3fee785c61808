#include "jinja/value.h"

#include "jinja/py_str.h"

namespace dserve::jinja {
namespace {

// Printing or comparing a container that holds itself (possible through append or a
// namespace attribute) would recurse forever; Python prints "[...]", we stop with an error.
constexpr int kMaxReprDepth = 100;

void check_depth(int depth) {
  if (depth > kMaxReprDepth) throw TemplateError("value nested too deeply (recursive container?)");
}

std::string repr_at(const Value& v, int depth);

std::string str_at(const Value& v, int depth) {
  check_depth(depth);
  switch (v.kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.as_int());
    case Kind::kFloat:
      return py_repr_float(v.as_float());
    case Kind::kString:
      return v.str();
    case Kind::kList: {
      const ListObj& l = v.list_obj();
      std::string out = l.is_tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        out += repr_at(l.items[i], depth + 1);
      }
      if (l.is_tuple && l.items.size() == 1) out += ",";
      out += l.is_tuple ? ")" : "]";
      return out;
    }
    case Kind::kDict: {
      const DictObj& d = v.dict_obj();
      std::string out = "{";
      for (size_t i = 0; i < d.entries.size(); ++i) {
        if (i) out += ", ";
        out +=
            repr_at(d.entries[i].first, depth + 1) + ": " + repr_at(d.entries[i].second, depth + 1);
      }
      out += "}";
      switch (d.kind) {
        case DictKind::kDict:
          return out;
        case DictKind::kNamespace:
          return "<Namespace " + out + ">";
        case DictKind::kLoop:
          return "<LoopContext>";
      }
      return out;
    }
    case Kind::kFunction:
      return "<function " + v.function_obj().name + ">";
  }
  return "";
}

std::string repr_at(const Value& v, int depth) {
  if (v.is_string()) return py_repr_string(v.str());
  if (v.is_undefined()) return "Undefined";
  return str_at(v, depth);
}

bool equals_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.as_integral() == b.as_integral();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
      return false;  // handled above
    case Kind::kString:
      return a.str() == b.str();
    case Kind::kList: {
      const ListObj& x = a.list_obj();
      const ListObj& y = b.list_obj();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equals_at(x.items[i], y.items[i], depth + 1)) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const DictObj& x = a.dict_obj();
      const DictObj& y = b.dict_obj();
      if (x.kind != DictKind::kDict || y.kind != DictKind::kDict) return &x == &y;
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.find(k);
        if (!other || !equals_at(v, *other, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kFunction:
      return &a.function_obj() == &b.function_obj();
  }
  return false;
}

bool less_at(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.as_integral() < b.as_integral();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.list_obj().items;
    const auto& y = b.list_obj().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals_at(x[i], y[i], depth + 1)) return less_at(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined()) a.fail("");
  if (b.is_undefined()) b.fail("");
  throw TemplateError("'<' not supported between instances of '" + a.type_name() + "' and '" +
                      b.type_name() + "'");
}

}  // namespace

namespace {

// Elements of destroyed containers wait here instead of being destroyed recursively:
// the outermost destructor drains the queue, so nesting depth never reaches the stack.
thread_local std::vector<Value> t_release_queue;
thread_local bool t_releasing = false;

template <typename Fn>
void release_iteratively(Fn move_elements_out) {
  move_elements_out(&t_release_queue);
  if (t_releasing) return;
  t_releasing = true;
  while (!t_release_queue.empty()) {
    // Destroying this batch may queue more elements, into the (now empty) queue.
    std::vector<Value> batch;
    batch.swap(t_release_queue);
    batch.clear();
  }
  t_releasing = false;
}

}  // namespace

ListObj::~ListObj() {
  release_iteratively([this](std::vector<Value>* q) {
    for (Value& v : items) {
      if (v.is_list() || v.is_dict() || v.is_function()) q->push_back(std::move(v));
    }
  });
}

DictObj::~DictObj() {
  release_iteratively([this](std::vector<Value>* q) {
    for (auto& [k, v] : entries) {
      if (k.is_list() || k.is_dict()) q->push_back(std::move(k));
      if (v.is_list() || v.is_dict() || v.is_function()) q->push_back(std::move(v));
    }
  });
}

Value Value::undefined(std::string hint) {
  return Value(Undefined{std::make_shared<const std::string>(std::move(hint))});
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  BuildBudget::charge(items.size() * 16);
  auto l = std::make_shared<ListObj>();
  l->items = std::move(items);
  l->is_tuple = is_tuple;
  return Value(std::move(l));
}

Value Value::dict() { return Value(std::make_shared<DictObj>()); }

Value Value::namespace_object() {
  auto d = std::make_shared<DictObj>();
  d->kind = DictKind::kNamespace;
  return Value(std::move(d));
}

Value Value::function(std::string name, std::function<Value(CallArgs&)> fn) {
  return Value(std::make_shared<FunctionObj>(FunctionObj{std::move(name), std::move(fn)}));
}

bool Value::is_tuple() const { return is_list() && list_obj().is_tuple; }
bool Value::is_mapping() const { return is_dict() && dict_obj().kind == DictKind::kDict; }
bool Value::is_namespace() const { return is_dict() && dict_obj().kind == DictKind::kNamespace; }

double Value::as_double() const {
  if (is_float()) return as_float();
  return static_cast<double>(as_integral());
}

const std::string& Value::undefined_hint() const {
  static const std::string kEmpty;
  const auto& h = std::get<Undefined>(v_).hint;
  return h ? *h : kEmpty;
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return !list_obj().items.empty();
    case Kind::kDict:
      return dict_obj().kind != DictKind::kDict || !dict_obj().entries.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::to_str() const { return str_at(*this, 0); }
std::string Value::repr() const { return repr_at(*this, 0); }

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return is_tuple() ? "tuple" : "list";
    case Kind::kDict:
      switch (dict_obj().kind) {
        case DictKind::kDict:
          return "dict";
        case DictKind::kNamespace:
          return "Namespace";
        case DictKind::kLoop:
          return "LoopContext";
      }
      return "dict";
    case Kind::kFunction:
      return "function";
  }
  return "object";
}

void Value::fail(const std::string& what) const {
  if (is_undefined()) {
    const std::string& hint = undefined_hint();
    throw TemplateError(hint.empty() ? "undefined value" : hint);
  }
  throw TemplateError(what);
}

bool Value::equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }
bool Value::less(const Value& a, const Value& b) { return less_at(a, b, 0); }

bool Value::same(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kList:
      return &a.list_obj() == &b.list_obj();
    case Kind::kDict:
      return &a.dict_obj() == &b.dict_obj();
    case Kind::kFunction:
      return &a.function_obj() == &b.function_obj();
    case Kind::kUndefined:
    case Kind::kNone:
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kString:
      return equals(a, b);
  }
  return false;
}

std::vector<Value> Value::iterate() const {
  switch (kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      return list_obj().items;
    case Kind::kDict: {
      if (dict_obj().kind != DictKind::kDict) break;
      std::vector<Value> keys;
      keys.reserve(dict_obj().entries.size());
      for (const auto& e : dict_obj().entries) keys.push_back(e.first);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : decode_utf8(str())) {
        std::string s;
        append_utf8(&s, c);
        chars.push_back(Value::string(std::move(s)));
      }
      return chars;
    }
    case Kind::kNone:
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kFunction:
      break;
  }
  throw TemplateError("'" + type_name() + "' object is not iterable");
}

const Value* DictObj::find(std::string_view key) const {
  const auto it = string_index_.find(std::string(key));
  return it == string_index_.end() ? nullptr : &entries[it->second].second;
}

const Value* DictObj::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  for (const auto& e : entries) {
    if (Value::equals(e.first, key)) return &e.second;
  }
  return nullptr;
}

Value* DictObj::find_mutable(const Value& key) {
  if (key.is_string()) {
    const auto it = string_index_.find(key.str());
    return it == string_index_.end() ? nullptr : &entries[it->second].second;
  }
  for (auto& e : entries) {
    if (Value::equals(e.first, key)) return &e.second;
  }
  return nullptr;
}

void DictObj::clear() {
  entries.clear();
  string_index_.clear();
}

void DictObj::set(const Value& key, Value value) {
  if (Value* existing = find_mutable(key)) {
    *existing = std::move(value);
    return;
  }
  if (key.is_string()) string_index_.emplace(key.str(), entries.size());
  entries.emplace_back(key, std::move(value));
}

namespace {
thread_local MutationScope* g_mutation_scope = nullptr;
thread_local BuildBudget* g_build_budget = nullptr;
}  // namespace

BuildBudget::BuildBudget(size_t max_bytes)
    : max_bytes_(max_bytes), left_(max_bytes), previous_(g_build_budget) {
  g_build_budget = this;
}

BuildBudget::~BuildBudget() { g_build_budget = previous_; }

void BuildBudget::charge(size_t bytes) {
  BuildBudget* budget = g_build_budget;
  if (!budget) return;
  if (bytes > budget->left_) {
    throw TemplateError("template built more than " + std::to_string(budget->max_bytes_) +
                        " bytes of strings and lists");
  }
  budget->left_ -= bytes;
}

MutationScope::MutationScope() : previous_(g_mutation_scope) { g_mutation_scope = this; }

MutationScope::~MutationScope() {
  g_mutation_scope = previous_;
  // Move the contents out before they are destroyed: destroying them may release
  // other noted containers, which must not be touched while being cleared.
  std::vector<Value> graveyard;
  for (auto& weak : lists_) {
    if (auto l = weak.lock()) {
      for (Value& v : l->items) graveyard.push_back(std::move(v));
      l->items.clear();
    }
  }
  for (auto& weak : dicts_) {
    if (auto d = weak.lock()) {
      for (auto& [k, v] : d->entries) graveyard.push_back(std::move(v));
      d->clear();
    }
  }
}

void MutationScope::note(const Value& container) {
  MutationScope* scope = g_mutation_scope;
  if (!scope) return;
  if (container.is_list()) scope->lists_.push_back(std::get<Value::ListPtr>(container.v_));
  if (container.is_dict()) scope->dicts_.push_back(std::get<Value::DictPtr>(container.v_));
}

std::vector<std::optional<Value>> bind_args(const CallArgs& args,
                                            const std::vector<std::string_view>& names,
                                            std::string_view fn_name) {
  std::vector<std::optional<Value>> out(names.size());
  if (args.positional.size() > names.size()) {
    throw TemplateError(std::string(fn_name) + "() takes at most " + std::to_string(names.size()) +
                        " arguments (" + std::to_string(args.positional.size()) + " given)");
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto& [name, value] : args.keyword) {
    size_t i = 0;
    while (i < names.size() && names[i] != name) ++i;
    if (i == names.size()) {
      throw TemplateError(std::string(fn_name) + "() got an unexpected keyword argument '" + name +
                          "'");
    }
    if (out[i]) {
      throw TemplateError(std::string(fn_name) + "() got multiple values for argument '" + name +
                          "'");
    }
    out[i] = value;
  }
  return out;
}

int64_t checked_int(const Value& v, std::string_view what) {
  if (v.is_int() || v.is_bool()) return v.as_integral();
  v.fail(std::string(what) + ": '" + v.type_name() +
         "' object cannot be interpreted as an integer");
}

}  // namespace dserve::jinja
