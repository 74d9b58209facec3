// A chat model's vocabulary in miniature, for the chat tests: byte-level BPE of a fixed size
// trained on `corpus` (control tokens <|endoftext|> as BOS, <|im_start|>, <|im_end|> as EOS),
// its <|ctrl_N|> tokens renamed in order to `markers` with token type `type` (1 normal — ASCII
// markers only —, 3 control, 4 user-defined, as Qwen3's <think>), add_bos_token set when asked.
// One file per process: ctest runs a file's tests side by side.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gguf_edit.h"
#include "toy/io/gguf.h"
#include "toy/tokenizer/tokenizer.h"

namespace toy::test {

inline std::unique_ptr<Tokenizer> chat_vocab(const std::string& corpus, const std::vector<std::string>& markers,
                                             int type, const std::string& name,
                                             std::optional<bool> add_bos = std::nullopt) {
  const std::string path =
      (std::filesystem::path(testing::TempDir()) / ("chat_vocab_" + name + "_" + std::to_string(getpid()) + ".gguf"))
          .string();
  {
    const auto trained = Tokenizer::train_fixed_size(corpus, "qwen2", 400);
    gguf::Writer w;
    trained->save(w);
    w.write(path);
  }
  edit_gguf(path, [&](GgufContents& c) {
    gguf::Value* tokens = c.find("tokenizer.ggml.tokens");
    gguf::Value* types = c.find("tokenizer.ggml.token_type");
    std::vector<std::string> names;
    for (const std::string& m : markers)
      if (type != 1 || std::all_of(m.begin(), m.end(), [](char ch) { return ch > 0x20 && ch < 0x7F; })) names.push_back(m);
    size_t next = 0;
    for (size_t i = 0; i < tokens->as.size() && next < names.size(); ++i)
      if (tokens->as[i].starts_with("<|ctrl_")) {
        tokens->as[i] = names[next++];
        types->ai[i] = type;
      }
    ASSERT_EQ(next, names.size()) << "too few tokens to rename";
    if (add_bos) {
      bool found = false;
      for (auto& [k, v] : c.kv)
        if (k == "tokenizer.ggml.add_bos_token") v = gguf::Value::boolean(*add_bos), found = true;
      if (!found) c.kv.emplace_back("tokenizer.ggml.add_bos_token", gguf::Value::boolean(*add_bos));
    }
  });
  gguf::Reader r(path);
  return Tokenizer::load(r);
}

// The id of the special token of that text; -1 when the vocabulary has none.
inline int32_t special_id(const Tokenizer& tok, const std::string& text) {
  for (int32_t id : tok.special_ids())
    if (tok.token_bytes(id) == text) return id;
  return -1;
}

}  // namespace toy::test
