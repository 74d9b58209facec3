// The functions a template can call by name: jinja2's globals (range, dict, namespace,
// cycler, joiner; lipsum exists but refuses to run) and the two Hugging Face adds
// (raise_exception, strftime_now). range is capped at 100,000 items as jinja2's sandbox caps it.
#include <ctime>

#include "toy/chat/builtins.h"

namespace toy::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

Value g_range(Args& a) {
  ArgReader r("range", a);
  const Value first = r.next("start");
  const Value second = r.next("stop", Value::none());
  const Value third = r.next("step", Value::none());
  r.done();
  int64_t start = 0, stop, step = 1;
  if (second.is_none()) {
    stop = to_index(first, "range()");
  } else {
    start = to_index(first, "range()");
    stop = to_index(second, "range()");
    if (!third.is_none()) step = to_index(third, "range()");
  }
  if (step == 0) failf("range() arg 3 must not be zero");
  using i128 = __int128;  // stop - start can exceed 64 bits
  const i128 n = step > 0 ? (stop > start ? (i128(stop) - start + step - 1) / step : 0)
                          : (start > stop ? (i128(start) - stop - step - 1) / -i128(step) : 0);
  if (n > kMaxRange) failf("Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
  std::vector<Value> items;
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) items.emplace_back(static_cast<int64_t>(start + i128(i) * step));
  Value v = make_list(std::move(items), Seq::Range);
  v.list().start = start;
  v.list().stop = stop;
  v.list().step = step;
  return v;
}

// dict(mapping or pairs, **kwargs), the way namespace() takes its arguments too.
void fill_dict(Dict& d, Args& a, std::string_view fn) {
  if (a.pos.size() > 1) failf("{} expected at most 1 argument, got {}", fn, a.pos.size());
  const bool has_src = !a.pos.empty();
  const Value src = has_src ? a.pos[0] : Value::none();
  if (has_src && src.is_undefined()) src.fail_undefined();  // dict() asks it for keys()
  if (src.is_dict()) {
    for (const auto& [k, v] : src.dict().entries) d.set(k, v);
  } else if (has_src) {
    for (const Value& pair : iterate(src)) {
      std::vector<Value> kv = iterate(pair);
      if (kv.size() != 2) failf("dictionary update sequence element has length {}; 2 is required", kv.size());
      d.set(kv[0], kv[1]);
    }
  }
  for (const auto& [k, v] : a.kw) d.set(Value(k), v);
}

Value g_dict(Args& a) {
  Value d = make_dict();
  fill_dict(d.dict(), a, "dict");
  return d;
}

Value g_namespace(Args& a) {
  auto ns = std::make_shared<Object>();
  ns->type = "Namespace";
  ns->assignable = true;
  fill_dict(ns->attrs, a, "namespace");
  return Value(ns);
}

Value g_cycler(Args& a) {
  ArgReader r("cycler", a);
  auto items = std::make_shared<std::vector<Value>>(r.rest());
  r.done();
  if (items->empty()) failf("at least one item has to be provided");
  auto obj = std::make_shared<Object>();
  obj->type = "Cycler";
  std::weak_ptr<Object> self = obj;
  auto pos = std::make_shared<size_t>(0);
  obj->attrs.set(Value("items"), make_list(*items));
  obj->attrs.set(Value("current"), items->front());
  obj->attrs.set(Value("next"), make_function("next", [self, items, pos](Args& args) {
    ArgReader("next", args).done();
    Value rv = (*items)[*pos];
    *pos = (*pos + 1) % items->size();
    if (auto o = self.lock()) o->attrs.set(Value("current"), (*items)[*pos]);
    return rv;
  }));
  obj->attrs.set(Value("reset"), make_function("reset", [self, items, pos](Args& args) {
    ArgReader("reset", args).done();
    *pos = 0;
    if (auto o = self.lock()) o->attrs.set(Value("current"), items->front());
    return Value::none();
  }));
  return Value(obj);
}

Value g_joiner(Args& a) {
  ArgReader r("joiner", a);
  const std::string sep = to_str(r.next("sep", Value(", ")));
  r.done();
  auto used = std::make_shared<bool>(false);
  return make_function("joiner", [sep, used](Args& args) {
    ArgReader("joiner", args).done();
    if (!*used) {
      *used = true;
      return Value("");
    }
    return Value(sep);
  });
}

Value g_raise_exception(Args& a) {
  ArgReader r("raise_exception", a);
  const Value msg = r.next("message");
  r.done();
  throw Failure(to_str(msg));
}

// Python's datetime.strftime on a naive time: %z and %Z are empty, %f is the microseconds.
std::string format_time(const std::string& fmt, const std::tm& tm, long micros) {
  std::string f;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '%' && i + 1 < fmt.size()) {
      const char c = fmt[i + 1];
      if (c == 'z' || c == 'Z') {
        ++i;
        continue;
      }
      if (c == 'f') {
        f += fmt::format("{:06d}", micros);
        ++i;
        continue;
      }
      f += fmt[i];
      f += fmt[++i];
      continue;
    }
    f += fmt[i];
  }
  if (f.empty()) return "";
  for (size_t cap = 256 + f.size() * 8; cap < (size_t{1} << 20); cap *= 4) {
    std::string buf(cap, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
    if (n > 0) return buf.substr(0, n);
  }
  return "";  // strftime gives 0 for an empty result too
}

}  // namespace

void add_globals(Dict& globals, std::optional<std::tm> now) {
  globals.set(Value("range"), make_function("range", g_range));
  // Classes in Python, so they print without an address.
  globals.set(Value("dict"), make_function("dict", g_dict, "<class 'dict'>"));
  globals.set(Value("namespace"), make_function("namespace", g_namespace, "<class 'jinja2.utils.Namespace'>"));
  globals.set(Value("cycler"), make_function("cycler", g_cycler, "<class 'jinja2.utils.Cycler'>"));
  globals.set(Value("joiner"), make_function("joiner", g_joiner, "<class 'jinja2.utils.Joiner'>"));
  globals.set(Value("lipsum"), make_function("lipsum", [](Args&) -> Value { failf("lipsum() is not supported by toy"); }));
  globals.set(Value("raise_exception"), make_function("raise_exception", g_raise_exception));
  globals.set(Value("strftime_now"), make_function("strftime_now", [now](Args& a) {
    ArgReader r("strftime_now", a);
    const std::string fmt = to_text(r.next("format"), "strftime_now format");
    r.done();
    if (now) return Value(format_time(fmt, *now, 0));
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    std::tm local;
    localtime_r(&ts.tv_sec, &local);
    return Value(format_time(fmt, local, ts.tv_nsec / 1000));
  }));
}

}  // namespace toy::jinja
