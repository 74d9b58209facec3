// Tokens -> statements, following jinja2's grammar and operator precedence (lowest first):
// `x if c else y`, or, and, not, comparisons (chained, with in / not in), + -, ~, * / // %,
// ** (left-associative, as in jinja2), unary - +, then postfix . [] () and, on the result,
// filters `|f(...)` and tests `is [not] t(...)`. Unknown tags, filters and tests are errors
// here, before anything renders, as jinja2 reports them when it compiles (an unknown filter
// or test inside an `if` fails only when reached, as jinja2 allows).
#pragma once
#include <string_view>

#include "toy/chat/ast.h"

namespace toy::jinja {

Body parse_template(std::string_view source);

}  // namespace toy::jinja
