// jinja2's sequence filters. Those that return generators in jinja2 (map, select, reject,
// selectattr, rejectattr, unique, items, reverse, batch, slice) return iterators here too:
// always truthy, no length, used up once iterated, so `x|select(...)` in an `if` behaves as
// in Python.
#include <algorithm>

#include "toy/chat/builtins.h"
#include "toy/chat/filter_table.h"
#include "toy/chat/pystr.h"

namespace toy::jinja {
namespace {

Value iterator(std::vector<Value> items) { return make_list(std::move(items), Seq::Iterator); }
Value lower_if_str(const Value& v) { return v.is_string() ? Value(py::lower(v.str())) : v; }

// make_attrgetter: "a.b.0" looked up item by item (digits as list indexes); a `fallback`
// replaces an undefined step.
struct AttrGetter {
  std::vector<Value> parts;
  Value fallback;
  bool ignore_case = false;

  AttrGetter(const Value& attribute, bool ignore_case_, Value fallback_ = Value::none())
      : fallback(std::move(fallback_)), ignore_case(ignore_case_) {
    if (attribute.is_none() || attribute.is_undefined()) return;
    if (!attribute.is_string()) {
      parts.push_back(attribute);
      return;
    }
    for (const std::string& p : py::split(attribute.str(), std::string("."), -1)) {
      const bool digits = !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
      parts.push_back(digits ? Value(static_cast<int64_t>(std::stoll(p))) : Value(p));
    }
  }

  Value operator()(Value item) const {
    for (const Value& p : parts) {
      item = get_item(item, p);
      if (!fallback.is_none() && item.is_undefined()) item = fallback;
    }
    return ignore_case ? lower_if_str(item) : item;
  }
};

// make_multi_attrgetter: "a,b" gives a list of keys (sort).
Value multi_key(const Value& attribute, const Value& item, bool ignore_case) {
  std::vector<Value> keys;
  if (attribute.is_string()) {
    for (const std::string& a : py::split(attribute.str(), std::string(","), -1))
      keys.push_back(AttrGetter(Value(a), ignore_case)(item));
  } else {
    keys.push_back(AttrGetter(attribute, ignore_case)(item));
  }
  return make_list(std::move(keys));
}

// ---- sequences ----

Value f_length(const Value& v, Args& a) {
  ArgReader("length", a).done();
  return Value(length(v));
}

Value f_list(const Value& v, Args& a) {
  ArgReader("list", a).done();
  return make_list(iterate(v));
}

Value f_first(const Value& v, Args& a) {
  ArgReader("first", a).done();
  if (v.is_list() && v.list().seq == Seq::Iterator) {  // next(): takes one item only
    auto& items = v.list().items;
    if (items.empty()) return Value::undefined("No first item, sequence was empty.");
    Value x = items.front();
    items.erase(items.begin());
    return x;
  }
  std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(const Value& v, Args& a) {
  ArgReader("last", a).done();
  if (v.is_list() && v.list().seq == Seq::Iterator) failf("'generator' object is not reversible");
  if (v.is_object() || v.is_number() || v.is_none() || v.is_function())
    failf("'{}' object is not reversible", type_name(v));
  std::vector<Value> items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_reverse(const Value& v, Args& a) {
  ArgReader("reverse", a).done();
  if (v.is_string()) {
    std::vector<char32_t> cps = py::decode(v.str());
    std::reverse(cps.begin(), cps.end());
    return Value(py::encode(cps), v.markup());
  }
  if (!v.is_list() && !v.is_dict() && !v.is_undefined()) failf("argument must be iterable");
  std::vector<Value> items = iterate(v);
  std::reverse(items.begin(), items.end());
  return iterator(std::move(items));
}

Value f_join(const Value& v, Args& a) {
  ArgReader r("join", a);
  const std::string sep = to_str(r.next("d", Value("")));
  const Value attribute = r.next("attribute", Value::none());
  r.done();
  AttrGetter get(attribute, false);
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attribute.is_none() ? x : get(x));
  }
  return Value(out);
}

Value f_default(const Value& v, Args& a) {
  ArgReader r("default", a);
  const Value dflt = r.next("default_value", Value(""));
  const bool boolean = truthy(r.next("boolean", Value(false)));
  r.done();
  return v.is_undefined() || (boolean && !truthy(v)) ? dflt : v;
}

Value f_items(const Value& v, Args& a) {
  ArgReader("items", a).done();
  if (v.is_undefined()) return iterator({});
  if (!v.is_dict()) failf("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict().entries) out.push_back(make_list({k, x}, Seq::Tuple));
  return iterator(std::move(out));
}

Value f_dictsort(const Value& v, Args& a) {
  ArgReader r("dictsort", a);
  const bool case_sensitive = truthy(r.next("case_sensitive", Value(false)));
  const std::string by = to_str(r.next("by", Value("key")));
  const bool reverse = truthy(r.next("reverse", Value(false)));
  r.done();
  if (by != "key" && by != "value") failf("You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) failf("'{}' object has no attribute 'items'", type_name(v));
  std::vector<Value> items;
  for (const auto& [k, x] : v.dict().entries) items.push_back(make_list({k, x}, Seq::Tuple));
  const size_t pos = by == "key" ? 0 : 1;
  auto key = [&](const Value& item) {
    const Value& x = item.list().items[pos];
    return case_sensitive ? x : lower_if_str(x);
  };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Value& x, const Value& y) { return reverse ? less(key(y), key(x)) : less(key(x), key(y)); });
  return make_list(std::move(items));
}

Value f_sort(const Value& v, Args& a) {
  ArgReader r("sort", a);
  const bool reverse = truthy(r.next("reverse", Value(false)));
  const bool case_sensitive = truthy(r.next("case_sensitive", Value(false)));
  const Value attribute = r.next("attribute", Value::none());
  r.done();
  std::vector<Value> items = iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& x : items) keyed.emplace_back(multi_key(attribute, x, !case_sensitive), std::move(x));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? less(y.first, x.first) : less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return make_list(std::move(out));
}

Value f_unique(const Value& v, Args& a) {
  ArgReader r("unique", a);
  const bool case_sensitive = truthy(r.next("case_sensitive", Value(false)));
  const Value attribute = r.next("attribute", Value::none());
  r.done();
  AttrGetter get(attribute, !case_sensitive);
  std::vector<Value> seen, out;
  for (const Value& x : iterate(v)) {
    Value k = get(x);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); })) {
      seen.push_back(k);
      out.push_back(x);
    }
  }
  return iterator(std::move(out));
}

Value min_or_max(const Value& v, Args& a, bool max) {
  ArgReader r(max ? "max" : "min", a);
  const bool case_sensitive = truthy(r.next("case_sensitive", Value(false)));
  const Value attribute = r.next("attribute", Value::none());
  r.done();
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  AttrGetter get(attribute, !case_sensitive);
  size_t best = 0;
  Value best_key = get(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = get(items[i]);
    if (max ? less(best_key, k) : less(k, best_key)) best = i, best_key = k;
  }
  return items[best];
}

Value f_min(const Value& v, Args& a) { return min_or_max(v, a, false); }
Value f_max(const Value& v, Args& a) { return min_or_max(v, a, true); }

Value f_sum(const Value& v, Args& a) {
  ArgReader r("sum", a);
  const Value attribute = r.next("attribute", Value::none());
  Value total = r.next("start", Value(0));
  r.done();
  if (total.is_string()) failf("sum() can't sum strings [use ''.join(seq) instead]");
  AttrGetter get(attribute, false);
  for (const Value& x : iterate(v)) total = binary_op("+", total, attribute.is_none() ? x : get(x));
  return total;
}

Value f_batch(const Value& v, Args& a) {
  ArgReader r("batch", a);
  const int64_t n = to_index(r.next("linecount"), "linecount");
  const Value fill = r.next("fill_with", Value::none());
  r.done();
  if (n <= 0) failf("batch size must be positive");
  std::vector<Value> out, row;
  for (const Value& x : iterate(v)) {
    if (static_cast<int64_t>(row.size()) == n) out.push_back(make_list(std::exchange(row, {})));
    row.push_back(x);
  }
  if (!row.empty()) {
    if (!fill.is_none())
      while (static_cast<int64_t>(row.size()) < n) row.push_back(fill);
    out.push_back(make_list(std::move(row)));
  }
  return iterator(std::move(out));
}

Value f_slice(const Value& v, Args& a) {
  ArgReader r("slice", a);
  const int64_t slices = to_index(r.next("slices"), "slices");
  const Value fill = r.next("fill_with", Value::none());
  r.done();
  if (slices <= 0) failf("integer division or modulo by zero");
  std::vector<Value> seq = iterate(v), out;
  const int64_t n = static_cast<int64_t>(seq.size()), per = n / slices, extra = n % slices;
  int64_t offset = 0;
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t start = offset + s * per;
    if (s < extra) ++offset;
    const int64_t end = offset + (s + 1) * per;
    std::vector<Value> part(seq.begin() + start, seq.begin() + end);
    if (!fill.is_none() && s >= extra) part.push_back(fill);
    out.push_back(make_list(std::move(part)));
  }
  return iterator(std::move(out));
}

Value f_groupby(const Value& v, Args& a) {
  ArgReader r("groupby", a);
  const Value attribute = r.next("attribute");
  const Value dflt = r.next("default", Value::none());
  const bool case_sensitive = truthy(r.next("case_sensitive", Value(false)));
  r.done();
  AttrGetter key(attribute, !case_sensitive, dflt), real_key(attribute, false, dflt);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& x : iterate(v)) keyed.emplace_back(key(x), x);
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& x, const auto& y) { return less(x.first, y.first); });
  std::vector<Value> out;
  for (size_t i = 0; i < keyed.size();) {
    size_t j = i;
    std::vector<Value> group;
    while (j < keyed.size() && equal(keyed[j].first, keyed[i].first)) group.push_back(keyed[j++].second);
    Value grouper = real_key(group.front());
    Value t = make_list({grouper, make_list(std::move(group))}, Seq::Tuple);
    t.list().fields = {"grouper", "list"};
    out.push_back(t);
    i = j;
  }
  return make_list(std::move(out));
}

Value f_map(const Value& v, Args& a) {
  std::vector<Value> out;
  std::vector<Value> items = iterate(v);
  if (a.pos.empty()) {
    ArgReader r("map", a);
    const Value attribute = r.next("attribute");
    const Value dflt = r.next("default", Value::none());
    r.done();
    AttrGetter get(attribute, false, dflt);
    for (const Value& x : items) out.push_back(get(x));
    return iterator(std::move(out));
  }
  const std::string name = to_text(a.pos[0], "map filter name");
  if (!filter_exists(name)) failf("No filter named '{}'.", name);
  for (const Value& x : items) {
    Args inner{std::vector<Value>(a.pos.begin() + 1, a.pos.end()), a.kw};
    out.push_back(apply_filter(name, x, inner));
  }
  return iterator(std::move(out));
}

// select / reject / selectattr / rejectattr
Value select_impl(const Value& v, Args& a, bool keep, bool by_attr) {
  std::vector<Value> out;
  if (!truthy(v)) return iterator({});
  size_t off = 0;
  std::optional<AttrGetter> get;
  if (by_attr) {
    if (a.pos.empty()) failf("Missing parameter for attribute name");
    get.emplace(a.pos[0], false);
    off = 1;
  }
  std::optional<std::string> test;
  if (a.pos.size() > off) {
    test = to_text(a.pos[off], "test name");
    if (!test_exists(*test)) failf("No test named '{}'.", *test);
  }
  for (const Value& x : iterate(v)) {
    Value subject = get ? (*get)(x) : x;
    bool ok;
    if (test) {
      Args inner{std::vector<Value>(a.pos.begin() + off + 1, a.pos.end()), a.kw};
      ok = apply_test(*test, subject, inner);
    } else {
      ok = truthy(subject);
    }
    if (ok == keep) out.push_back(x);
  }
  return iterator(std::move(out));
}

Value f_select(const Value& v, Args& a) { return select_impl(v, a, true, false); }
Value f_reject(const Value& v, Args& a) { return select_impl(v, a, false, false); }
Value f_selectattr(const Value& v, Args& a) { return select_impl(v, a, true, true); }
Value f_rejectattr(const Value& v, Args& a) { return select_impl(v, a, false, true); }

// getattr only: a dict's keys are not its attributes.
Value f_attr(const Value& v, Args& a) {
  ArgReader r("attr", a);
  const std::string name = to_text(r.next("name"), "attribute name");
  r.done();
  if (v.is_undefined()) v.fail_undefined();
  if (v.is_object() && v.object().attrs.find(std::string_view(name))) return get_attr(v, name);
  if (method(v, name)) return get_attr(v, name);
  return Value::undefined(fmt::format("'{} object' has no attribute '{}'", type_name(v), name));
}

}  // namespace

void add_sequence_filters(FilterTable& t) {
  t["attr"] = f_attr;
  t["batch"] = f_batch;
  t["count"] = f_length;
  t["d"] = f_default;
  t["default"] = f_default;
  t["dictsort"] = f_dictsort;
  t["first"] = f_first;
  t["groupby"] = f_groupby;
  t["items"] = f_items;
  t["join"] = f_join;
  t["last"] = f_last;
  t["length"] = f_length;
  t["list"] = f_list;
  t["map"] = f_map;
  t["max"] = f_max;
  t["min"] = f_min;
  t["reject"] = f_reject;
  t["rejectattr"] = f_rejectattr;
  t["reverse"] = f_reverse;
  t["select"] = f_select;
  t["selectattr"] = f_selectattr;
  t["slice"] = f_slice;
  t["sort"] = f_sort;
  t["sum"] = f_sum;
  t["unique"] = f_unique;
}

}  // namespace toy::jinja
