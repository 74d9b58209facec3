// Arithmetic as Python does it: int stays int (64-bit here: overflow is an error, not a wrong
// number), / is always float, // and % floor toward negative infinity, ** of ints is an int
// unless the exponent is negative. + joins strings and lists, * repeats them. Any undefined
// operand raises, as jinja2's Undefined does.
#include <cmath>

#include "toy/chat/builtins.h"
#include "toy/chat/pystr.h"

namespace toy::jinja {
namespace {

// Results larger than this are refused rather than filling memory ('x' * 10**12, or a string
// doubled in a loop): a chat template's strings are small.
constexpr int64_t kMaxRepeatBytes = int64_t{1} << 26;

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  failf("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
}

int64_t checked(bool overflow, int64_t r) {
  if (overflow) failf("integer overflow (toy's templates use 64-bit integers)");
  return r;
}

Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (n > 0 && static_cast<int64_t>(seq.str().size()) > kMaxRepeatBytes / n) failf("repeated string too long");
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out), seq.markup());
  }
  const List& l = seq.list();
  if (n > 0 && static_cast<int64_t>(l.items.size()) > kMaxRepeatBytes / 64 / n) failf("repeated list too long");
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), l.items.begin(), l.items.end());
  return make_list(std::move(out), l.seq);
}

bool plain_seq(const Value& v) { return v.is_list() && (v.list().seq == Seq::List || v.list().seq == Seq::Tuple); }

Value add(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.number() + b.number());
    int64_t r;
    const bool overflow = __builtin_add_overflow(a.integer(), b.integer(), &r);
    return Value(checked(overflow, r));
  }
  if (a.is_string() && b.is_string()) {
    // Markup + str escapes the str (markupsafe); str + str is plain.
    if (a.markup() || b.markup()) {
      std::string l = a.markup() ? a.str() : py::html_escape(a.str());
      std::string r = b.markup() ? b.str() : py::html_escape(b.str());
      return Value(l + r, true);
    }
    if (static_cast<int64_t>(a.str().size() + b.str().size()) > kMaxRepeatBytes) failf("string too long");
    return Value(a.str() + b.str());
  }
  if (a.is_string()) failf("can only concatenate str (not \"{}\") to str", type_name(b));
  if (plain_seq(a) && plain_seq(b) && a.list().seq == b.list().seq) {
    std::vector<Value> out = a.list().items;
    out.insert(out.end(), b.list().items.begin(), b.list().items.end());
    return make_list(std::move(out), a.list().seq);
  }
  if (plain_seq(a)) failf("can only concatenate {} (not \"{}\") to {}", type_name(a), type_name(b), type_name(a));
  unsupported("+", a, b);
}

Value multiply(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.number() * b.number());
    int64_t r;
    const bool overflow = __builtin_mul_overflow(a.integer(), b.integer(), &r);
    return Value(checked(overflow, r));
  }
  const bool a_int = a.is_int() || a.is_bool(), b_int = b.is_int() || b.is_bool();
  if ((a.is_string() || plain_seq(a)) && b_int) return repeat(a, b.integer());
  if ((b.is_string() || plain_seq(b)) && a_int) return repeat(b, a.integer());
  if (a.is_string() || b.is_string() || plain_seq(a) || plain_seq(b))
    failf("can't multiply sequence by non-int of type '{}'", type_name(a.is_string() || plain_seq(a) ? b : a));
  unsupported("*", a, b);
}

// CPython's float floor division and modulo (the sign of the result follows the divisor).
void float_divmod(double x, double y, double& div, double& mod) {
  mod = std::fmod(x, y);
  div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  if (div != 0) {
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    div = floordiv;
  } else {
    div = std::copysign(0.0, x / y);
  }
}

Value divide(std::string_view op, const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) unsupported(op, a, b);
  const bool ints = !a.is_float() && !b.is_float();
  if (ints ? b.integer() == 0 : b.number() == 0.0) {
    if (op == "/") failf("{}", ints ? "division by zero" : "float division by zero");
    if (op == "//") failf("{}", ints ? "integer division or modulo by zero" : "float floor division by zero");
    failf("{}", ints ? "integer modulo by zero" : "float modulo");
  }
  if (op == "/") return Value(a.number() / b.number());
  if (ints) {
    const int64_t x = a.integer(), y = b.integer();
    if (x == INT64_MIN && y == -1) failf("integer overflow (toy's templates use 64-bit integers)");
    int64_t q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      q -= 1;
      r += y;
    }
    return op == "//" ? Value(q) : Value(r);
  }
  double div, mod;
  float_divmod(a.number(), b.number(), div, mod);
  return op == "//" ? Value(div) : Value(mod);
}

Value power(const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) unsupported("** or pow()", a, b);
  if (!a.is_float() && !b.is_float() && b.integer() >= 0) {
    int64_t base = a.integer(), e = b.integer(), r = 1;
    while (e > 0) {
      if ((e & 1) && __builtin_mul_overflow(r, base, &r)) checked(true, 0);
      e >>= 1;
      if (e > 0 && __builtin_mul_overflow(base, base, &base)) checked(true, 0);
    }
    return Value(r);
  }
  if (a.number() == 0.0 && b.number() < 0) failf("0.0 cannot be raised to a negative power");
  const double r = std::pow(a.number(), b.number());
  if (std::isnan(r) && !std::isnan(a.number()) && !std::isnan(b.number()))
    failf("toy's templates have no complex numbers (a negative number to a fractional power)");
  return Value(r);
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (op == "+") return add(a, b);
  if (op == "-") {
    if (!a.is_number() || !b.is_number()) unsupported("-", a, b);
    if (a.is_float() || b.is_float()) return Value(a.number() - b.number());
    int64_t r;
    const bool overflow = __builtin_sub_overflow(a.integer(), b.integer(), &r);
    return Value(checked(overflow, r));
  }
  if (op == "*") return multiply(a, b);
  if (op == "%" && a.is_string()) {
    if (a.markup()) failf("toy does not support % formatting of Markup strings");
    return Value(percent_format(a.str(), b));
  }
  if (op == "/" || op == "//" || op == "%") return divide(op, a, b);
  if (op == "**") return power(a, b);
  failf("unknown operator '{}'", op);
}

Value negate(const Value& v, bool minus) {
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_number()) failf("bad operand type for unary {}: '{}'", minus ? '-' : '+', type_name(v));
  if (v.is_float()) return Value(minus ? -v.number() : v.number());
  if (minus && v.integer() == INT64_MIN) failf("integer overflow (toy's templates use 64-bit integers)");
  return Value(minus ? -v.integer() : v.integer());
}

}  // namespace toy::jinja
