#include "toy/infer/grammar.h"

#include <algorithm>
#include <functional>
#include <list>
#include <map>
#include <mutex>

#include "toy/core/error.h"
#include "toy/core/text.h"

namespace toy {

// ---- parsing ---------------------------------------------------------------------------------

class GrammarParser {
 public:
  GrammarParser(std::string_view src, const GrammarVocab& vocab) : src_(src), vocab_(vocab) {}

  std::shared_ptr<const Grammar> run() {
    auto g = std::make_shared<Grammar>();
    g_ = g.get();
    skip_space(true);
    while (pos_ < src_.size()) {
      const std::string name = parse_name();
      const uint32_t id = symbol(name);
      TOY_CHECK(!defined_[id], "{}: the rule '{}' is defined twice", where(), name);
      skip_space(false);
      TOY_CHECK(src_.substr(pos_, 3) == "::=", "{}: expected '::=' after the rule name '{}'", where(), name);
      pos_ += 3;
      skip_space(true);
      g_->rules_[id] = parse_alternatives(name, false);
      defined_[id] = true;
      skip_space(true);
    }
    for (size_t r = 0; r < g_->rules_.size(); ++r)
      TOY_CHECK(defined_[r], "[grammar] the rule '{}' is used but not defined", g_->names_[r]);
    const auto root = ids_.find("root");
    TOY_CHECK(root != ids_.end(), "[grammar] there is no rule 'root'");
    g_->root_ = root->second;
    check_left_recursion();
    g_->chains_.resize(g_->rules_.size());
    for (uint32_t r = 0; r < g_->rules_.size(); ++r)
      for (uint32_t a = 0; a < g_->rules_[r].size(); ++a)
        for (uint32_t i = 0; i < g_->rules_[r][a].size(); ++i) g_->rules_[r][a][i].place = {r, a, i};
    return g;
  }

 private:
  std::string_view src_;
  const GrammarVocab& vocab_;
  size_t pos_ = 0;
  Grammar* g_ = nullptr;
  std::map<std::string, uint32_t> ids_;
  std::vector<bool> defined_;
  uint32_t chains_made_ = 0;
  static constexpr size_t kMaxElements = 1'000'000;
  size_t elements_ = 0;

  std::string where() const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < src_.size(); ++i) src_[i] == '\n' ? (++line, col = 1) : ++col;
    return fmt::format("[grammar] line {} column {}", line, col);
  }

  uint32_t symbol(const std::string& name) {
    auto [it, fresh] = ids_.emplace(name, uint32_t(g_->rules_.size()));
    if (fresh) {
      g_->rules_.emplace_back();
      g_->names_.push_back(name);
      defined_.push_back(false);
    }
    return it->second;
  }

  uint32_t fresh_rule(const std::string& base) {
    // ('#' is no name character: a rule of the text, `x_7 ::= ...`, is never this one)
    const uint32_t id = symbol(fmt::format("{}#{}", base, g_->rules_.size()));
    defined_[id] = true;
    return id;
  }

  void skip_space(bool newlines) {
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      if (c == '#') {
        while (pos_ < src_.size() && src_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }

  std::string parse_name() {
    const size_t start = pos_;
    while (pos_ < src_.size() && name_char(src_[pos_])) ++pos_;
    TOY_CHECK(pos_ > start, "{}: expected a rule name", where());
    return std::string(src_.substr(start, pos_ - start));
  }

  uint32_t hex(size_t digits) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      TOY_CHECK(pos_ < src_.size() && std::isxdigit(static_cast<unsigned char>(src_[pos_])),
                "{}: expected {} hex digits", where(), digits);
      const char c = src_[pos_++];
      v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  // One code point of a literal or class (escapes included).
  uint32_t parse_char() {
    TOY_CHECK(pos_ < src_.size(), "{}: unexpected end of the grammar", where());
    if (src_[pos_] == '\\') {
      ++pos_;
      TOY_CHECK(pos_ < src_.size(), "{}: unexpected end after '\\'", where());
      const char c = src_[pos_++];
      switch (c) {
        case 'x': return hex(2);
        case 'u': return hex(4);
        case 'U': return hex(8);
        case 't': return '\t';
        case 'r': return '\r';
        case 'n': return '\n';
        case '\\': case '"': case '[': case ']': case '-': case '^': return uint32_t(c);
        default: fail("{}: unknown escape '\\{}'", where(), printable(std::string(1, c)));
      }
    }
    // UTF-8
    const auto b0 = uint8_t(src_[pos_]);
    const int n = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    TOY_CHECK(n > 0 && pos_ + size_t(n) <= src_.size(), "{}: invalid UTF-8", where());
    uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int i = 1; i < n; ++i) cp = cp << 6 | (uint8_t(src_[pos_ + size_t(i)]) & 0x3F);
    pos_ += size_t(n);
    return cp;
  }

  static Grammar::Elem chars(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated = false) {
    Grammar::Elem e;
    e.kind = Grammar::Elem::Chars;
    e.ranges = std::move(ranges);
    e.negated = negated;
    return e;
  }
  static Grammar::Elem ref(uint32_t rule) {
    Grammar::Elem e;
    e.kind = Grammar::Elem::Rule;
    e.rule = rule;
    return e;
  }
  static Grammar::Alternative ended(Grammar::Alternative a) {
    a.push_back(Grammar::Elem{});
    return a;
  }

  std::vector<Grammar::Alternative> parse_alternatives(const std::string& name, bool nested) {
    std::vector<Grammar::Alternative> alts;
    alts.push_back(ended(parse_sequence(name, nested)));
    while (pos_ < src_.size() && src_[pos_] == '|') {
      ++pos_;
      skip_space(true);
      alts.push_back(ended(parse_sequence(name, nested)));
    }
    return alts;
  }

  Grammar::Alternative parse_sequence(const std::string& name, bool nested) {
    Grammar::Alternative seq;
    size_t last_start = 0;  // where the last symbol (what a repetition repeats) begins
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      if (c == '"') {
        ++pos_;
        last_start = seq.size();
        while (pos_ < src_.size() && src_[pos_] != '"') {
          const uint32_t cp = parse_char();
          seq.push_back(chars({{cp, cp}}));
        }
        TOY_CHECK(pos_ < src_.size(), "{}: an unterminated string", where());
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        last_start = seq.size();
        bool negated = false;
        if (pos_ < src_.size() && src_[pos_] == '^') negated = true, ++pos_;
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        while (pos_ < src_.size() && src_[pos_] != ']') {
          const uint32_t lo = parse_char();
          uint32_t hi = lo;
          if (pos_ + 1 < src_.size() && src_[pos_] == '-' && src_[pos_ + 1] != ']') {
            ++pos_;
            hi = parse_char();
          }
          TOY_CHECK(lo <= hi, "{}: a character range runs backwards", where());
          ranges.emplace_back(lo, hi);
        }
        TOY_CHECK(pos_ < src_.size(), "{}: an unterminated character class", where());
        ++pos_;
        seq.push_back(chars(std::move(ranges), negated));
      } else if (c == '<' || (c == '!' && pos_ + 1 < src_.size() && src_[pos_ + 1] == '<')) {
        last_start = seq.size();
        seq.push_back(parse_token());
      } else if (c == '.') {
        ++pos_;
        last_start = seq.size();
        seq.push_back(chars({{0, 0x10FFFF}}));
      } else if (name_char(c)) {
        last_start = seq.size();
        seq.push_back(ref(symbol(parse_name())));
      } else if (c == '(') {
        ++pos_;
        skip_space(true);
        const uint32_t sub = fresh_rule(name);
        auto alts = parse_alternatives(name, true);
        g_->rules_[sub] = std::move(alts);
        TOY_CHECK(pos_ < src_.size() && src_[pos_] == ')', "{}: expected ')'", where());
        ++pos_;
        last_start = seq.size();
        seq.push_back(ref(sub));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        TOY_CHECK(!seq.empty(), "{}: '{}' repeats nothing", where(), c);
        size_t lo = 0, hi = SIZE_MAX;
        ++pos_;
        if (c == '+') lo = 1;
        if (c == '?') hi = 1;
        if (c == '{') {
          skip_space(false);
          lo = parse_count();
          skip_space(false);
          hi = lo;
          if (pos_ < src_.size() && src_[pos_] == ',') {
            ++pos_;
            skip_space(false);
            hi = pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_])) ? parse_count() : SIZE_MAX;
            skip_space(false);
          }
          TOY_CHECK(pos_ < src_.size() && src_[pos_] == '}', "{}: expected '}}'", where());
          TOY_CHECK(lo <= hi, "{}: a repetition's minimum is above its maximum", where());
          ++pos_;
        }
        Grammar::Alternative subject(seq.begin() + long(last_start), seq.end());
        seq.resize(last_start);
        repeat(name, std::move(subject), lo, hi, seq);
      } else {
        break;
      }
      skip_space(nested);
    }
    return seq;
  }

  // <[123]>, <text>, or either after '!' (any other token).
  Grammar::Elem parse_token() {
    Grammar::Elem e;
    e.kind = Grammar::Elem::Token;
    if (src_[pos_] == '!') e.negated = true, ++pos_;
    const size_t start = pos_;
    if (src_.substr(pos_, 2) == "<[") {
      pos_ += 2;
      const size_t digits = pos_;
      int64_t id = 0;
      while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_])) && id <= INT32_MAX)
        id = id * 10 + (src_[pos_++] - '0');
      TOY_CHECK(pos_ > digits && src_.substr(pos_, 2) == "]>", "{}: expected a token id as <[123]>", where());
      pos_ += 2;
      TOY_CHECK(id < vocab_.size, "{}: the token <[{}]> is not in the vocabulary (it has {} tokens)", where(), id,
                vocab_.size);
      e.token = int32_t(id);
      return e;
    }
    const size_t close = src_.find('>', pos_ + 1);
    TOY_CHECK(close != std::string_view::npos && src_.substr(pos_, close - pos_).find('\n') == std::string_view::npos,
              "{}: an unterminated token <...>", where());
    const std::string_view text = src_.substr(start, close + 1 - start);
    e.token = vocab_.id_of ? vocab_.id_of(text) : -1;
    TOY_CHECK(e.token >= 0, "{}: {} is not one token of {}", where(), printable(std::string(text), 60),
              vocab_.id_of ? "this vocabulary" : "any vocabulary (token references need the model's)");
    pos_ = close + 1;
    return e;
  }

  size_t parse_count() {
    const size_t start = pos_;
    size_t v = 0;
    while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) {
      v = v * 10 + size_t(src_[pos_++] - '0');
      TOY_CHECK(v <= 100000, "{}: a repetition count above 100000", where());
    }
    TOY_CHECK(pos_ > start, "{}: expected a number", where());
    return v;
  }

  // subject{lo,hi} appended to seq: lo copies, then a rule for the rest.
  void repeat(const std::string& name, const Grammar::Alternative& subject, size_t lo, size_t hi,
              Grammar::Alternative& seq) {
    // Repetitions multiply: ("a"{1000}){1000} is a million elements. A grammar stays under that.
    const size_t copies = lo + (hi == SIZE_MAX ? 1 : hi - lo);
    elements_ += subject.size() * copies;
    TOY_CHECK(subject.size() * copies <= kMaxElements && elements_ <= kMaxElements,
              "{}: the grammar grows past {} elements (its repetitions multiply)", where(), kMaxElements);
    for (size_t i = 0; i < lo; ++i) seq.insert(seq.end(), subject.begin(), subject.end());
    if (hi == lo) return;
    if (hi == SIZE_MAX) {  // R ::= subject R | ε
      const uint32_t r = fresh_rule(name);
      Grammar::Alternative again = subject;
      again.push_back(ref(r));
      g_->rules_[r] = {ended(again), ended({})};
      seq.push_back(ref(r));
      return;
    }
    // R_k ::= subject R_{k+1} | ε, (hi - lo) of them nested; a chain (the innermost made first).
    uint32_t next = UINT32_MAX;
    const uint32_t chain = ++chains_made_;
    for (size_t k = 0; k < hi - lo; ++k) {
      const uint32_t r = fresh_rule(name);
      g_->chains_.resize(g_->rules_.size());
      g_->chains_[r] = {chain, uint32_t(k + 1)};
      Grammar::Alternative one = subject;
      if (next != UINT32_MAX) one.push_back(ref(next));
      g_->rules_[r] = {ended(one), ended({})};
      next = r;
    }
    seq.push_back(ref(next));
  }

  // A rule that can reach itself before matching a character loops forever: refused.
  void check_left_recursion() {
    const size_t n = g_->rules_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : g_->rules_[r]) {
          bool all = true;
          for (const auto& e : alt)
            if (e.kind == Grammar::Elem::Chars || e.kind == Grammar::Elem::Token ||
                (e.kind == Grammar::Elem::Rule && !nullable[e.rule]))
              all = false;
          if (all) nullable[r] = true, changed = true;
        }
      }
    }
    // Edges r -> s when s can come first in r (after nullable rules).
    std::vector<int> state(n, 0);  // 0 new, 1 on the path, 2 done
    std::function<void(uint32_t)> visit = [&](uint32_t r) {
      state[r] = 1;
      for (const auto& alt : g_->rules_[r])
        for (const auto& e : alt) {
          if (e.kind != Grammar::Elem::Rule) break;
          TOY_CHECK(state[e.rule] != 1, "[grammar] the rule '{}' is left-recursive (it can reach itself before any "
                    "character)", g_->names_[e.rule]);
          if (state[e.rule] == 0) visit(e.rule);
          if (!nullable[e.rule]) break;
        }
      state[r] = 2;
    };
    for (uint32_t r = 0; r < n; ++r)
      if (state[r] == 0) visit(r);
  }
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf, const GrammarVocab& vocab) {
  return GrammarParser(gbnf, vocab).run();
}

std::shared_ptr<const Grammar> Grammar::parse_cached(std::string_view gbnf, const GrammarVocab& vocab) {
  struct Entry {
    std::string text;
    const void* vocab;
    std::shared_ptr<const Grammar> grammar;
  };
  static std::mutex mu;
  static std::list<Entry> recent;  // most recent first
  {
    std::lock_guard lk(mu);
    for (auto it = recent.begin(); it != recent.end(); ++it)
      if (it->text == gbnf && it->vocab == vocab.identity) {
        recent.splice(recent.begin(), recent, it);
        return recent.front().grammar;
      }
  }
  auto g = parse(gbnf, vocab);  // (outside the lock: a long grammar does not hold up other requests)
  std::lock_guard lk(mu);
  recent.push_front({std::string(gbnf), vocab.identity, g});
  if (recent.size() > 16) recent.pop_back();
  return g;
}

bool Grammar::Elem::matches(uint32_t cp) const {
  if (kind != Chars) return false;
  bool in = false;
  for (const auto& [lo, hi] : ranges) in = in || (cp >= lo && cp <= hi);
  return in != negated;
}

bool Grammar::Elem::matches_any(uint32_t lo, uint32_t hi) const {
  if (kind != Chars) return false;
  if (!negated) {
    for (const auto& [a, b] : ranges)
      if (a <= hi && b >= lo) return true;
    return false;
  }
  // Some code point of [lo, hi] outside every range: walk the gaps.
  std::vector<std::pair<uint32_t, uint32_t>> sorted = ranges;
  std::sort(sorted.begin(), sorted.end());
  uint32_t at = lo;
  for (const auto& [a, b] : sorted) {
    if (b < at) continue;
    if (a > at) return true;
    if (b >= hi) return false;
    at = b + 1;
  }
  return at <= hi;
}

// ---- matching --------------------------------------------------------------------------------

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  for (const auto& alt : g_->rules()[g_->root()]) {
    Stack s;
    if (alt[0].kind != Grammar::Elem::End) s.push_back(&alt[0]);
    expand(s, stacks_, 0);
  }
  std::sort(stacks_.begin(), stacks_.end());
  stacks_.erase(std::unique(stacks_.begin(), stacks_.end()), stacks_.end());
}

void GrammarMatcher::expand(Stack& s, std::vector<Stack>& out, int depth) const {
  TOY_CHECK(depth < 10000, "[grammar] rules nest too deeply");
  if (s.empty() || s.back()->kind == Grammar::Elem::Chars || s.back()->kind == Grammar::Elem::Token) {
    out.push_back(s);
    return;
  }
  // (in place, each alternative pushed and popped again: s ends as it came; only the stacks
  // kept are copies)
  const Grammar::Elem* e = s.back();
  s.pop_back();
  const bool more = (e + 1)->kind != Grammar::Elem::End;
  if (more) s.push_back(e + 1);
  for (const auto& alt : g_->rules()[e->rule]) {
    const bool opens = alt[0].kind != Grammar::Elem::End;
    if (opens) s.push_back(&alt[0]);
    expand(s, out, depth + 1);
    if (opens) s.pop_back();
  }
  if (more) s.pop_back();
  s.push_back(e);
}

void GrammarMatcher::step_past_top(const Stack& s, std::vector<Stack>& out) const {
  Stack t = s;
  const Grammar::Elem* top = t.back();
  t.pop_back();
  if ((top + 1)->kind != Grammar::Elem::End) t.push_back(top + 1);
  expand(t, out, 0);
}

bool GrammarMatcher::advance(uint32_t cp, std::vector<Stack>& next) const {
  next.clear();
  for (const Stack& s : stacks_)
    if (!s.empty() && s.back()->matches(cp)) step_past_top(s, next);
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  return !next.empty();
}

namespace {
int utf8_length(uint8_t b0) { return b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0; }
}  // namespace

// The unfinished code point `partial` could still become one some stack accepts.
bool GrammarMatcher::viable(std::string_view partial) const {
  const int n = utf8_length(uint8_t(partial[0]));
  uint32_t lo = n == 2 ? (uint8_t(partial[0]) & 0x1F) : n == 3 ? (uint8_t(partial[0]) & 0x0F) : (uint8_t(partial[0]) & 0x07);
  for (size_t i = 1; i < partial.size(); ++i) lo = lo << 6 | (uint8_t(partial[i]) & 0x3F);
  const int missing = n - int(partial.size());
  uint32_t hi = lo;
  for (int i = 0; i < missing; ++i) lo <<= 6, hi = hi << 6 | 0x3F;
  // (the shortest form only: a 3-byte sequence is at least U+0800, and so on)
  lo = std::max(lo, n == 2 ? 0x80u : n == 3 ? 0x800u : 0x10000u);
  hi = std::min(hi, 0x10FFFFu);
  if (lo > hi) return false;
  // (surrogates U+D800..U+DFFF are no code points: a sequence heading only there never completes)
  auto any = [&](uint32_t a, uint32_t b) {
    if (a > b) return false;
    for (const Stack& s : stacks_)
      if (!s.empty() && s.back()->matches_any(a, b)) return true;
    return false;
  };
  return any(lo, std::min(hi, 0xD7FFu)) || any(std::max(lo, 0xE000u), hi);
}

bool GrammarMatcher::may_accept_byte(uint8_t b) const {
  if (pending_.empty()) {
    const int n = utf8_length(b);
    if (n == 0) return false;
    if (n == 1) {
      for (const Stack& s : stacks_)
        if (!s.empty() && s.back()->matches(b)) return true;
      return false;
    }
    const char lead = char(b);
    return viable(std::string_view(&lead, 1));
  }
  if ((b & 0xC0) != 0x80) return false;
  std::string partial = pending_;
  partial += char(b);
  return int(partial.size()) >= utf8_length(uint8_t(partial[0])) || viable(partial);
}

bool GrammarMatcher::accept_byte(uint8_t b) {
  if (pending_.empty()) {
    const int n = utf8_length(b);
    if (n == 0) return false;
    if (n == 1) {
      std::vector<Stack> next;
      if (!advance(b, next)) return false;
      stacks_.swap(next);
      return true;
    }
  } else if ((b & 0xC0) != 0x80) {
    return false;
  }
  pending_ += char(b);
  const int n = utf8_length(uint8_t(pending_[0]));
  if (int(pending_.size()) < n) {
    if (partial_viable()) return true;
    pending_.pop_back();
    return false;
  }
  uint32_t cp = n == 2 ? (uint8_t(pending_[0]) & 0x1F) : n == 3 ? (uint8_t(pending_[0]) & 0x0F) : (uint8_t(pending_[0]) & 0x07);
  for (size_t i = 1; i < pending_.size(); ++i) cp = cp << 6 | (uint8_t(pending_[i]) & 0x3F);
  std::vector<Stack> next;
  const uint32_t shortest = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
  if (cp < shortest || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || !advance(cp, next)) {
    pending_.pop_back();
    return false;
  }
  stacks_.swap(next);
  pending_.clear();
  return true;
}

bool GrammarMatcher::accept(std::string_view bytes) {
  GrammarMatcher saved = *this;
  for (char c : bytes)
    if (!accept_byte(uint8_t(c))) {
      *this = std::move(saved);
      return false;
    }
  return true;
}

bool GrammarMatcher::accept_token(int32_t id, std::string_view bytes, bool special) {
  std::vector<Stack> next;
  if (pending_.empty())
    for (const Stack& s : stacks_)
      if (!s.empty() && s.back()->matches_token(id)) step_past_top(s, next);
  if (!special && !bytes.empty()) {
    GrammarMatcher as_text = *this;
    // (a text path that ends inside a code point is dropped when the token path also holds: the
    // two cannot share one unfinished code point; either way the token is accepted)
    if (as_text.accept(bytes) && (next.empty() || as_text.pending_.empty())) {
      pending_ = as_text.pending_;
      next.insert(next.end(), as_text.stacks_.begin(), as_text.stacks_.end());
    }
  }
  if (next.empty()) return false;
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  stacks_.swap(next);
  return true;
}

std::vector<const Grammar::Elem*> GrammarMatcher::token_elements() const {
  std::vector<const Grammar::Elem*> out;
  if (!pending_.empty()) return out;
  for (const Stack& s : stacks_)
    if (!s.empty() && s.back()->kind == Grammar::Elem::Token) out.push_back(s.back());
  return out;
}

bool GrammarMatcher::complete() const {
  if (!pending_.empty()) return false;
  for (const Stack& s : stacks_)
    if (s.empty()) return true;
  return false;
}

bool GrammarMatcher::finished() const {
  if (!pending_.empty()) return false;
  for (const Stack& s : stacks_)
    if (!s.empty()) return false;
  return !stacks_.empty();
}

std::string GrammarMatcher::key(uint32_t horizon) const {
  // Each stack as its elements' places, 4 words each; a place in a repetition chain with more
  // than `horizon` repetitions left is written as the chain's and `horizon` (no token reaches
  // the difference). The stacks in a canonical order (by a hash of their words, then the words:
  // stacks share long bottoms, so comparing words first is slow) without repeats, so that the
  // order in which they arose does not matter. (One buffer, reused: the token mask's walk calls
  // this for every live byte of the vocabulary's trie.)
  struct Span {
    uint64_t hash;
    uint32_t first, end;  // its words
  };
  thread_local std::vector<uint32_t> words;
  thread_local std::vector<Span> spans;
  words.clear();
  spans.clear();
  for (const Stack& s : stacks_) {
    const uint32_t first = uint32_t(words.size());
    uint64_t h = 0xcbf29ce484222325ull;
    auto put = [&](uint32_t w) {
      words.push_back(w);
      h = (h ^ w) * 0x100000001b3ull;
    };
    for (const Grammar::Elem* e : s) {
      const Grammar::Place& p = e->place;
      const Grammar::Chain& c = g_->chains()[p.rule];
      const bool far = c.id != 0 && c.remaining > horizon;
      put(far ? 0x80000000u | c.id : p.rule), put(p.alt), put(p.index), put(far ? horizon : 0u);
    }
    spans.push_back({h, first, uint32_t(words.size())});
  }
  auto same = [&](const Span& x, const Span& y) {
    return x.hash == y.hash &&
           std::equal(words.begin() + x.first, words.begin() + x.end, words.begin() + y.first, words.begin() + y.end);
  };
  std::sort(spans.begin(), spans.end(), [&](const Span& x, const Span& y) {
    if (x.hash != y.hash) return x.hash < y.hash;
    return std::lexicographical_compare(words.begin() + x.first, words.begin() + x.end, words.begin() + y.first,
                                        words.begin() + y.end);
  });
  spans.erase(std::unique(spans.begin(), spans.end(), same), spans.end());
  std::string key;
  key.reserve(pending_.size() + 1 + (spans.size() + words.size()) * sizeof(uint32_t));
  key = pending_;
  key += '|';
  for (const Span& sp : spans) {
    const uint32_t n = sp.end - sp.first;  // (in words: the lengths keep the stacks apart)
    key.append(reinterpret_cast<const char*>(&n), sizeof n);
    key.append(reinterpret_cast<const char*>(words.data() + sp.first), n * sizeof(uint32_t));
  }
  return key;
}

}  // namespace toy
