// Pre-tokenizers of byte-level BPE vocabularies, as llama.cpp chooses them from
// tokenizer.ggml.pre: a list of regular expressions applied in turn, each splitting every
// piece the previous one left (text between matches stays a piece of its own), so the pieces
// always concatenate to the text exactly. Merges then apply inside a piece only.
//   gpt-2      GPT-2's pattern (also phi-2, ...)
//   llama-bpe  Llama 3's (also llama3, llama-v3): contractions, letters with one leading
//              non-letter, digits in groups of up to three; whole pieces that are tokens are
//              taken as they are (ignore_merges), and a BOS is added by default
//   qwen2      like Llama 3's, but one digit per piece
//   smollm     one digit per piece, then GPT-2's pattern
//   default    what llama.cpp uses for a vocabulary that names none
// Private to src/toy/tokenizer/.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace toy::tokenizer_detail {

class PreTokenizer {
 public:
  // The pre-tokenizer a vocabulary names (aliases map to their canonical name); throws
  // toy::Error listing the supported names for any other.
  static const PreTokenizer& get(std::string_view name);
  static std::vector<std::string> names();  // the canonical names

  const std::string& name() const { return name_; }
  bool ignore_merges() const { return ignore_merges_; }
  bool adds_bos() const { return adds_bos_; }
  // Calls `piece` for each piece of `text` in order.
  void split(std::string_view text, const std::function<void(std::string_view)>& piece) const;

  struct Regex;  // a compiled pattern (PCRE2)
  PreTokenizer(std::string name, const std::vector<std::string>& patterns, bool ignore_merges, bool adds_bos);
  ~PreTokenizer();

 private:
  std::string name_;
  std::vector<std::unique_ptr<Regex>> regexes_;
  bool ignore_merges_, adds_bos_;
};

}  // namespace toy::tokenizer_detail
