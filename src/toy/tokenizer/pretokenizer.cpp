#include "toy/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "toy/core/error.h"
#include "toy/core/text.h"

namespace toy::tokenizer_detail {

namespace {

// The patterns, as llama.cpp's llama-vocab.cpp states them for each pre-tokenizer type.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt2NoTrail = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen3.5's: Qwen2's with combining marks (\p{M}) kept inside letter runs.
constexpr const char* kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Spec {
  const char* name;
  std::vector<const char*> aliases;
  std::vector<std::string> patterns;
  bool ignore_merges, adds_bos;
};

const std::vector<Spec>& specs() {
  static const std::vector<Spec> s = {
      {"gpt-2", {"phi-2", "mpt", "olmo", "jais"}, {kGpt2}, false, false},
      {"llama-bpe", {"llama3", "llama-v3", "falcon3", "dbrx", "smaug-bpe", "lfm2"}, {kLlama3}, true, true},
      {"qwen2", {"deepseek-r1-qwen", "stablelm2"}, {kQwen2}, false, false},
      {"qwen35", {}, {kQwen35}, false, false},
      {"smollm", {"starcoder", "refact", "command-r", "codeshell", "exaone"}, {R"(\p{N})", kGpt2NoTrail}, false, false},
      {"default", {}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2NoTrail, R"(\p{N}+)", "[0-9][0-9][0-9]"}, false, false},
  };
  return s;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  explicit Regex(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE at = 0;
    // UTF for code points, UCP so \s and \p{..} are Unicode's, MATCH_INVALID_UTF so invalid
    // bytes are unmatchable (they stay pieces of their own) instead of failing the match.
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("[tokenizer:bpe] cannot compile the pre-split regex at offset {}: {}", at, reinterpret_cast<const char*>(msg));
    }
    // JIT is a speed-up only; without it (unsupported CPU, SELinux) the interpreter runs.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }
  ~Regex() { pcre2_code_free(code); }

  // Splits `text` into matches and the gaps between them.
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const {
    // Match data is per call: the compiled pattern is shared, so encode stays thread-safe.
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
        pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
    TOY_CHECK(md, "[tokenizer:bpe] out of memory creating regex match data");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos < text.size()) {
      const int rc = pcre2_match(code, subject, text.size(), pos, 0, md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) {
        piece(text.substr(pos));
        return;
      }
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        fail("[tokenizer:bpe] pre-split failed at byte {}: {}", pos, reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const size_t start = ov[0];
      // Every alternative consumes at least one character; the max() is a guard, not a case.
      const size_t end = std::max<size_t>(ov[1], start + 1);
      if (start > pos) piece(text.substr(pos, start - pos));  // the gap before the match
      piece(text.substr(start, end - start));
      pos = end;
    }
  }
};

PreTokenizer::PreTokenizer(std::string name, const std::vector<std::string>& patterns, bool ignore_merges,
                           bool adds_bos)
    : name_(std::move(name)), ignore_merges_(ignore_merges), adds_bos_(adds_bos) {
  for (const std::string& p : patterns) regexes_.push_back(std::make_unique<Regex>(p));
}

PreTokenizer::~PreTokenizer() = default;

const PreTokenizer& PreTokenizer::get(std::string_view name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<PreTokenizer>, std::less<>> built;
  for (const Spec& s : specs()) {
    const bool match = name == s.name || std::find(s.aliases.begin(), s.aliases.end(), name) != s.aliases.end();
    if (!match) continue;
    std::lock_guard<std::mutex> lock(mu);
    auto it = built.find(s.name);
    if (it == built.end())
      it = built.emplace(s.name, std::make_unique<PreTokenizer>(s.name, s.patterns, s.ignore_merges, s.adds_bos)).first;
    return *it->second;
  }
  std::string known;
  for (const std::string& n : names()) known += (known.empty() ? "" : ", ") + n;
  fail("[tokenizer:bpe] pre-tokenizer '{}' is not supported (toy implements {})", printable(name), known);
}

std::vector<std::string> PreTokenizer::names() {
  std::vector<std::string> out;
  for (const Spec& s : specs()) out.emplace_back(s.name);
  return out;
}

void PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& piece) const {
  if (regexes_.size() == 1) {
    regexes_[0]->split(text, piece);
    return;
  }
  // Each pattern splits every piece the previous one left.
  std::vector<std::string_view> pieces{text}, next;
  for (const auto& re : regexes_) {
    next.clear();
    for (std::string_view p : pieces) re->split(p, [&](std::string_view q) { next.push_back(q); });
    std::swap(pieces, next);
  }
  for (std::string_view p : pieces) piece(p);
}

}  // namespace toy::tokenizer_detail
