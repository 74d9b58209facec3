#include "toy/infer/gbnf.h"

#include <map>
#include <set>

#include "toy/core/error.h"

namespace toy {

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') out += '\\', out += char(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) out += fmt::format("\\x{:02X}", c);
    else out += char(c);
  }
  return out + "\"";
}

namespace {

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = uint8_t(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
    uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = cp << 6 | (uint8_t(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

// One code point as written inside a GBNF class or literal (escapes read alike in both).
std::string escaped(uint32_t cp) {
  if (cp < 0x20 || cp == '\\' || cp == ']' || cp == '^' || cp == '-' || cp == '"' || cp == '[')
    return fmt::format("\\x{:02X}", cp);
  if (cp < 0x80) return std::string(1, char(cp));
  return cp <= 0xFFFF ? fmt::format("\\u{:04X}", cp) : fmt::format("\\U{:08X}", cp);
}

}  // namespace

std::string gbnf_text_without(const std::string& name, const std::vector<std::string>& markers,
                              const GbnfTextAlphabet& alphabet) {
  // The markers' trie, with failure links and "a marker ends here" (directly or by a suffix).
  struct Node {
    std::map<uint32_t, size_t> next;
    size_t fail = 0;
    bool ends = false;
  };
  std::vector<Node> nodes(1);
  std::set<uint32_t> chars;
  for (const std::string& m : markers) {
    const std::vector<uint32_t> cps = code_points(m);
    TOY_CHECK(!cps.empty(), "[grammar] a text without an empty marker is no text");
    size_t at = 0;
    for (uint32_t c : cps) {
      chars.insert(c);
      auto it = nodes[at].next.find(c);
      if (it == nodes[at].next.end()) {
        nodes[at].next[c] = nodes.size();
        at = nodes.size();
        nodes.emplace_back();
      } else {
        at = it->second;
      }
    }
    nodes[at].ends = true;
  }
  std::vector<size_t> order = {0};  // breadth first: a node's failure is set before its children's
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t u = order[i];
    for (const auto& [c, v] : nodes[u].next) {
      if (u != 0) {
        size_t f = nodes[u].fail;
        while (f != 0 && !nodes[f].next.count(c)) f = nodes[f].fail;
        auto it = nodes[f].next.find(c);
        nodes[v].fail = it != nodes[f].next.end() ? it->second : 0;
      }
      nodes[v].ends = nodes[v].ends || nodes[nodes[v].fail].ends;
      order.push_back(v);
    }
  }
  auto step = [&](size_t s, uint32_t c) {
    while (s != 0 && !nodes[s].next.count(c)) s = nodes[s].fail;
    auto it = nodes[s].next.find(c);
    return it == nodes[s].next.end() ? size_t(0) : it->second;
  };
  std::string other = "[^" + alphabet.excluded;
  for (uint32_t c : chars) other += escaped(c);
  other += "]";
  std::string out;
  for (size_t s = 0; s < nodes.size(); ++s) {
    if (nodes[s].ends) continue;
    out += fmt::format("{}-{} ::= ( {} {}-0", name, s, other, name);
    if (!alphabet.escape.empty()) out += fmt::format(" | {} {}-0", alphabet.escape, name);
    for (uint32_t c : chars) {
      if (!alphabet.allows(c)) continue;
      const size_t to = step(s, c);
      if (nodes[to].ends) continue;  // a whole marker: not allowed
      out += fmt::format(" | \"{}\" {}-{}", escaped(c), name, to);
    }
    out += " )?\n";
  }
  out += fmt::format("{} ::= {}-0\n", name, name);
  return out;
}

std::string gbnf_char_starting_no(const std::vector<std::string>& markers, const GbnfTextAlphabet& alphabet) {
  std::set<uint32_t> first;
  for (const std::string& m : markers)
    if (!m.empty()) first.insert(code_points(m)[0]);
  std::string out = "[^" + alphabet.excluded;
  for (uint32_t c : first) out += escaped(c);
  return out + "]";
}

}  // namespace toy
