// The filter registry shared by filters.cpp (strings, numbers, tojson), filters_seq.cpp
// (sequences) and builtins.h's filter_exists/apply_filter.
#pragma once
#include <functional>
#include <map>
#include <string>

#include "toy/chat/value.h"

namespace toy::jinja {

using FilterFn = Value (*)(const Value& v, Args& a);
using FilterTable = std::map<std::string, FilterFn, std::less<>>;

void add_text_filters(FilterTable& t);      // filters.cpp
void add_sequence_filters(FilterTable& t);  // filters_seq.cpp

}  // namespace toy::jinja
