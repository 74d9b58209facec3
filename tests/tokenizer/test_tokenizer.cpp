// Tokenizers: byte, char and byte-level BPE. Round trips (arbitrary UTF-8 and invalid bytes),
// BPE training (determinism, tie-break, compression), GGUF save/load, GPT-2's own vocabulary
// against llama.cpp's test vectors, the streaming UTF-8 decoder, and the error paths.
#include <gtest/gtest.h>

#include "requirements.h"

#include <cstdlib>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include "toy/core/error.h"
#include "toy/io/gguf.h"
#include "toy/tokenizer/internal.h"
#include "toy/tokenizer/pretokenizer.h"
#include "toy/tokenizer/tokenizer.h"

namespace {

using toy::Tokenizer;
namespace gguf = toy::gguf;

using toy::test::shared_path;


std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A file from ../shared/data (not part of the repo): skipped locally when missing, a failure
// under CI=true.
#define REQUIRE_SHARED(path) TOY_REQUIRE_FILE(path)

const std::string& shakespeare() {
  static const std::string text = read_file(shared_path("tinyshakespeare.txt"));
  return text;
}

// A temporary file path, removed when it goes out of scope.
struct TempFile {
  std::string path;
  TempFile() {
    static int n = 0;
    path = (std::filesystem::temp_directory_path() /
            ("toy_tokenizer_test_" + std::to_string(getpid()) + "_" + std::to_string(n++) + ".gguf"))
               .string();
  }
  ~TempFile() { std::remove(path.c_str()); }
};

std::unique_ptr<Tokenizer> save_and_load(const Tokenizer& t) {
  TempFile f;
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("toy"));
  t.save(w);
  w.write(f.path);
  gguf::Reader r(f.path);
  return Tokenizer::load(r);
}

std::string random_bytes(uint32_t seed, size_t n) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = char(rng() & 0xFF);
  return s;
}

// Valid UTF-8 mixing ASCII (words, spaces, newlines) with 2-, 3- and 4-byte characters.
std::string random_utf8(uint32_t seed, size_t n_chars) {
  std::mt19937 rng(seed);
  std::string s;
  for (size_t i = 0; i < n_chars; ++i) {
    uint32_t cp;
    switch (rng() % 5) {
      case 0: cp = " \n\t'"[rng() % 4]; break;
      case 1: cp = 0x80 + rng() % (0x800 - 0x80); break;
      case 2: do cp = 0x800 + rng() % (0x10000 - 0x800); while (cp >= 0xD800 && cp <= 0xDFFF); break;
      case 3: cp = 0x10000 + rng() % (0x110000 - 0x10000); break;
      default: cp = 'a' + rng() % 26; break;
    }
    toy::tokenizer_detail::utf8_append(s, cp);
  }
  return s;
}

// Expects `fn` to throw toy::Error whose message contains every string of `parts`.
template <class F>
void expect_error(F&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected toy::Error";
  } catch (const toy::Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

std::vector<std::string> split_pieces(std::string_view text) {
  std::vector<std::string> out;
  toy::tokenizer_detail::gpt2_split(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

// Trained once: several tests share it.
const Tokenizer& shakespeare_bpe() {
  static const std::unique_ptr<Tokenizer> t = Tokenizer::train("bpe:500", shakespeare());
  return *t;
}

std::string shakespeare_sample() { return shakespeare().substr(10000, 20000); }

}  // namespace

// ---- specs -------------------------------------------------------------------------------------

TEST(TokenizerSpec, BadSpecsThrow) {
  for (const char* spec : {"bpe:x", "bpe:0", "bpe:", "bpe:-5", "bpe:12x", "bpe: 3", "word", "", "BPE:10"})
    expect_error([&] { Tokenizer::train(spec, "some text"); }, {"[tokenizer]", std::string("'") + spec + "'"});
}

// ---- byte --------------------------------------------------------------------------------------

TEST(ByteTokenizer, IdsAreByteValuesPlusEos) {
  auto t = Tokenizer::train("byte", "ignored");
  EXPECT_EQ(t->kind(), "byte");
  EXPECT_EQ(t->vocab_size(), 257);
  EXPECT_EQ(t->eos_id(), 256);
  EXPECT_EQ(t->encode("A\xff\n"), (std::vector<int32_t>{65, 255, 10}));
  EXPECT_EQ(t->token_bytes(256), "<|endoftext|>");
  EXPECT_EQ(t->token_bytes(0), std::string(1, '\0'));
}

TEST(ByteTokenizer, RoundTripsRandomBytesAndUtf8) {
  auto t = Tokenizer::train("byte", "");
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    const std::string b = random_bytes(seed, 3000), u = random_utf8(seed, 1000);
    EXPECT_EQ(t->decode(t->encode(b)), b);
    EXPECT_EQ(t->decode(t->encode(u)), u);
    EXPECT_EQ(t->encode(b).size(), b.size());
  }
}

TEST(ByteTokenizer, DecodeOfOutOfRangeIdThrows) {
  auto t = Tokenizer::train("byte", "");
  expect_error([&] { t->decode(std::vector<int32_t>{1, 257}); }, {"[tokenizer:byte]", "257", "position 1"});
  expect_error([&] { t->decode(std::vector<int32_t>{-1}); }, {"-1", "out of range"});
  expect_error([&] { t->token_bytes(1000); }, {"1000", "vocabulary of 257"});
}

// ---- char --------------------------------------------------------------------------------------

TEST(CharTokenizer, ShakespeareHas65SortedCharacters) {
  REQUIRE_SHARED(shared_path("tinyshakespeare.txt"));
  auto t = Tokenizer::train("char", shakespeare());
  EXPECT_EQ(t->kind(), "char");
  EXPECT_EQ(t->vocab_size(), 65);
  EXPECT_EQ(t->eos_id(), -1);
  EXPECT_EQ(t->token_bytes(0), "\n");
  for (int32_t id = 1; id < t->vocab_size(); ++id) EXPECT_LT(t->token_bytes(id - 1), t->token_bytes(id));
  const std::string s = shakespeare_sample();
  EXPECT_EQ(t->decode(t->encode(s)), s);
  EXPECT_EQ(t->encode(s).size(), s.size());  // all ASCII
}

TEST(CharTokenizer, RoundTripsArbitraryUtf8) {
  const std::string corpus = random_utf8(7, 5000);
  auto t = Tokenizer::train("char", corpus);
  EXPECT_EQ(t->decode(t->encode(corpus)), corpus);
  // Ids follow code points: a multi-byte character sorts after every ASCII one.
  const std::string mixed = "h\xc3\xa9llo \xe2\x98\x83 \xf0\x9f\x98\x80";  // "héllo ☃ 😀"
  auto m = Tokenizer::train("char", mixed);
  EXPECT_EQ(m->vocab_size(), 7);  // ' ', h, l, o, é, ☃, 😀
  EXPECT_EQ(m->token_bytes(0), " ");
  EXPECT_EQ(m->token_bytes(4), "\xc3\xa9");
  EXPECT_EQ(m->token_bytes(6), "\xf0\x9f\x98\x80");
  EXPECT_EQ(m->encode("\xf0\x9f\x98\x80h"), (std::vector<int32_t>{6, 1}));
  EXPECT_EQ(m->decode(m->encode(mixed)), mixed);
}

TEST(CharTokenizer, UnknownCharacterThrowsNamingItAndItsBytePosition) {
  auto t = Tokenizer::train("char", "abc");
  expect_error([&] { t->encode("ab\xe2\x82\xac" "c"); }, {"[tokenizer:char]", "\xe2\x82\xac", "U+20AC", "byte 2"});
  expect_error([&] { t->encode("abcd"); }, {"'d'", "U+0064", "byte 3"});
  expect_error([&] { t->encode("a\x01"); }, {"U+0001", "byte 1"});
  expect_error([&] { t->encode("a\xff"); }, {"0xff", "byte 1"});
}

TEST(CharTokenizer, InvalidBytesAreSymbolsOfTheirOwn) {
  // 0xFF never starts UTF-8; 0xC3 at the end is a cut-short sequence; 0xC0 0xAF is an overlong '/'.
  const std::string corpus = "a\xff" "b\xc0\xaf" "a\xc3";
  auto t = Tokenizer::train("char", corpus);
  EXPECT_EQ(t->vocab_size(), 6);  // a, b, then the raw bytes 0xAF, 0xC0, 0xC3, 0xFF
  EXPECT_EQ(t->token_bytes(0), "a");
  EXPECT_EQ(t->token_bytes(2), "\xaf");
  EXPECT_EQ(t->token_bytes(5), "\xff");
  EXPECT_EQ(t->decode(t->encode(corpus)), corpus);
  EXPECT_EQ(t->encode("\xc3" "a"), (std::vector<int32_t>{4, 0}));
}

TEST(CharTokenizer, EmptyCorpusThrows) {
  expect_error([] { Tokenizer::train("char", ""); }, {"[tokenizer:char]", "empty corpus"});
}

// ---- BPE pre-split ---------------------------------------------------------------------------

TEST(BpePreSplit, FollowsGpt2Regex) {
  EXPECT_EQ(split_pieces("Hello world's end"), (std::vector<std::string>{"Hello", " world", "'s", " end"}));
  // \s+(?!\S) leaves the last space to the word after it.
  EXPECT_EQ(split_pieces("a   b"), (std::vector<std::string>{"a", "  ", " b"}));
  EXPECT_EQ(split_pieces("x 42!? \n\n"), (std::vector<std::string>{"x", " 42", "!?", " \n\n"}));
  EXPECT_EQ(split_pieces("caf\xc3\xa9 \xd0\xbc\xd0\xb8\xd1\x80"),
            (std::vector<std::string>{"caf\xc3\xa9", " \xd0\xbc\xd0\xb8\xd1\x80"}));  // "café мир"
}

TEST(BpePreSplit, KeepsEveryByteOfInvalidUtf8) {
  const std::string s = "ab\xff\xfe cd\xe2\x82";
  std::string joined;
  for (const std::string& p : split_pieces(s)) joined += p;
  EXPECT_EQ(joined, s);
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    const std::string r = random_bytes(seed, 5000);
    joined.clear();
    for (const std::string& p : split_pieces(r)) joined += p;
    EXPECT_EQ(joined, r);
  }
}

// ---- BPE ---------------------------------------------------------------------------------------

TEST(BpeTokenizer, CompressesShakespeare) {
  REQUIRE_SHARED(shared_path("tinyshakespeare.txt"));
  const Tokenizer& t = shakespeare_bpe();
  EXPECT_EQ(t.kind(), "bpe");
  EXPECT_EQ(t.vocab_size(), 256 + 500 + 1);
  EXPECT_EQ(t.eos_id(), 756);
  EXPECT_EQ(t.token_bytes(756), "<|endoftext|>");
  const std::string s = shakespeare_sample();
  const std::vector<int32_t> ids = t.encode(s);
  EXPECT_EQ(t.decode(ids), s);
  EXPECT_LT(ids.size() * 2, s.size()) << ids.size() << " tokens for " << s.size() << " bytes";
  // Merges never cross a pre-split boundary: no token has a letter followed by a space.
  for (int32_t id = 0; id < t.eos_id(); ++id) {
    const std::string b = t.token_bytes(id);
    for (size_t i = 0; i + 1 < b.size(); ++i) EXPECT_FALSE(std::isalpha(uint8_t(b[i])) && b[i + 1] == ' ') << b;
  }
}

TEST(BpeTokenizer, RoundTripsRandomBytesAndUtf8) {
  REQUIRE_SHARED(shared_path("tinyshakespeare.txt"));
  const Tokenizer& t = shakespeare_bpe();
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    const std::string b = random_bytes(seed, 4000), u = random_utf8(seed, 1500);
    EXPECT_EQ(t.decode(t.encode(b)), b);
    EXPECT_EQ(t.decode(t.encode(u)), u);
  }
  // A tokenizer trained on random bytes and UTF-8 must round-trip them too.
  const std::string corpus = random_bytes(11, 20000) + random_utf8(11, 5000);
  auto r = Tokenizer::train("bpe:300", corpus);
  EXPECT_EQ(r->decode(r->encode(corpus)), corpus);
  const std::string other = random_bytes(12, 5000);
  EXPECT_EQ(r->decode(r->encode(other)), other);
}

TEST(BpeTokenizer, TrainingIsDeterministic) {
  REQUIRE_SHARED(shared_path("tinyshakespeare.txt"));
  const std::string corpus = shakespeare().substr(0, 200000);
  auto a = Tokenizer::train("bpe:300", corpus);
  auto b = Tokenizer::train("bpe:300", corpus);
  ASSERT_EQ(a->vocab_size(), b->vocab_size());
  for (int32_t id = 0; id < a->vocab_size(); ++id) EXPECT_EQ(a->token_bytes(id), b->token_bytes(id)) << id;
  const std::string s = shakespeare_sample();
  EXPECT_EQ(a->encode(s), b->encode(s));
}

TEST(BpeTokenizer, TiesGoToTheSmallestPair) {
  // Pieces "ab" and " cd": every pair occurs once. (' ', 'c') = (32, 99) is the smallest,
  // then ('a', 'b') = (97, 98) beats (" c" = 256, 'd').
  auto t = Tokenizer::train("bpe:2", "ab cd");
  EXPECT_EQ(t->token_bytes(256), " c");
  EXPECT_EQ(t->token_bytes(257), "ab");
  EXPECT_EQ(t->encode("ab cd"), (std::vector<int32_t>{257, 256, 'd'}));
}

TEST(BpeTokenizer, StopsEarlyWhenNoPairIsLeft) {
  auto t = Tokenizer::train("bpe:1000", "aaaa");
  EXPECT_EQ(t->vocab_size(), 256 + 2 + 1);  // "aa", "aaaa", <|endoftext|>
  EXPECT_EQ(t->encode("aaaa"), (std::vector<int32_t>{257}));
  EXPECT_EQ(t->encode("aaaaaaa"), (std::vector<int32_t>{257, 256, 'a'}));  // leftmost first
  auto empty = Tokenizer::train("bpe:10", "");
  EXPECT_EQ(empty->vocab_size(), 257);
}

TEST(BpeTokenizer, EncodesLongPieces) {
  // One piece of 200k letters: merging must not be quadratic (nor blow the regex's stack).
  auto t = Tokenizer::train("bpe:20", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
  const std::string s(200000, 'a');
  const std::vector<int32_t> ids = t->encode(s);
  EXPECT_EQ(t->decode(ids), s);
  EXPECT_LT(ids.size(), s.size() / 8);
  const std::string spaces = std::string(100000, ' ') + "x";
  EXPECT_EQ(t->decode(t->encode(spaces)), spaces);
}

TEST(BpeTokenizer, DecodeOfOutOfRangeIdThrows) {
  auto t = Tokenizer::train("bpe:5", "hello hello");
  expect_error([&] { t->decode(std::vector<int32_t>{104, 262}); }, {"[tokenizer:bpe]", "262", "position 1"});
}

// ---- GGUF --------------------------------------------------------------------------------------

TEST(TokenizerGguf, ByteIsStoredAsAGpt2VocabularyWithoutMerges) {
  auto t = Tokenizer::train("byte", "");
  TempFile f;
  gguf::Writer w;
  t->save(w);
  w.write(f.path);
  gguf::Reader r(f.path);
  EXPECT_EQ(r.get_str("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(r.get_str("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ(r.get_str("toy.tokenizer.kind"), "byte");
  const gguf::Value* tokens = r.find("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens);
  ASSERT_EQ(tokens->as.size(), 257u);
  EXPECT_EQ(tokens->as['a'], "a");
  EXPECT_EQ(tokens->as[' '], "\xc4\xa0");  // 'Ġ' (U+0120)
  EXPECT_EQ(tokens->as['\n'], "\xc4\x8a");  // 'Ċ' (U+010A)
  EXPECT_EQ(tokens->as[256], "<|endoftext|>");
  const gguf::Value* types = r.find("tokenizer.ggml.token_type");
  ASSERT_TRUE(types);
  EXPECT_EQ(types->elem, gguf::Type::I32);
  EXPECT_EQ(types->ai[0], 1);
  EXPECT_EQ(types->ai[256], 3);
  const gguf::Value* merges = r.find("tokenizer.ggml.merges");
  ASSERT_TRUE(merges);
  EXPECT_EQ(merges->elem, gguf::Type::STRING);
  EXPECT_TRUE(merges->as.empty());
  EXPECT_EQ(r.get_u32("tokenizer.ggml.bos_token_id"), 256u);
  EXPECT_EQ(r.get_u32("tokenizer.ggml.eos_token_id"), 256u);

  auto back = Tokenizer::load(r);
  EXPECT_EQ(back->kind(), "byte");
  const std::string s = random_bytes(3, 1000);
  EXPECT_EQ(back->encode(s), t->encode(s));
}

TEST(TokenizerGguf, CharSavesAndLoadsBack) {
  const std::string corpus = random_utf8(5, 2000) + "\xff\xc0";
  auto t = Tokenizer::train("char", corpus);
  auto back = save_and_load(*t);
  EXPECT_EQ(back->kind(), "char");
  ASSERT_EQ(back->vocab_size(), t->vocab_size());
  for (int32_t id = 0; id < t->vocab_size(); ++id) EXPECT_EQ(back->token_bytes(id), t->token_bytes(id));
  EXPECT_EQ(back->encode(corpus), t->encode(corpus));
  EXPECT_EQ(back->eos_id(), -1);
}

TEST(TokenizerGguf, BpeSavesAndLoadsBackWithIdenticalEncodings) {
  REQUIRE_SHARED(shared_path("tinyshakespeare.txt"));
  const Tokenizer& t = shakespeare_bpe();
  TempFile f;
  gguf::Writer w;
  t.save(w);
  w.write(f.path);
  gguf::Reader r(f.path);
  EXPECT_EQ(r.get_str("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(r.get_str("toy.tokenizer.kind"), "bpe");
  const gguf::Value* merges = r.find("tokenizer.ggml.merges");
  ASSERT_TRUE(merges);
  EXPECT_EQ(merges->as.size(), 500u);
  EXPECT_EQ(r.get_u32("tokenizer.ggml.eos_token_id"), 756u);

  auto back = Tokenizer::load(r);
  EXPECT_EQ(back->kind(), "bpe");
  EXPECT_EQ(back->vocab_size(), t.vocab_size());
  EXPECT_EQ(back->eos_id(), t.eos_id());
  for (const std::string& s : {shakespeare_sample(), random_bytes(9, 3000), random_utf8(9, 1000)})
    EXPECT_EQ(back->encode(s), t.encode(s));
}

// A BPE vocabulary always says whether it adds a BOS: readers' defaults differ (a file that
// left the key out when it matched toy's pre-tokenizer default got a BOS in llama.cpp and none
// in toy). Both values, for a pre-tokenizer that adds one by default and one that does not.
TEST(TokenizerGguf, BpeFilesAlwaysSayWhetherTheyAddABos) {
  const std::string corpus = "the cat sat on the mat and the dog sat on the log\n";
  for (const char* pre : {"llama-bpe", "gpt-2"})
    for (const bool add_bos : {true, false}) {
      SCOPED_TRACE(std::string(pre) + (add_bos ? " +bos" : " -bos"));
      const auto t = Tokenizer::train_fixed_size(corpus, pre, 300);
      TempFile f;
      {
        gguf::Writer w;
        t->save(w);
        w.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(add_bos));
        w.write(f.path);
      }
      const auto back = Tokenizer::load(gguf::Reader(f.path));
      TempFile g;
      gguf::Writer w;
      back->save(w);
      w.write(g.path);
      gguf::Reader r(g.path);
      const gguf::Value* v = r.find("tokenizer.ggml.add_bos_token");
      ASSERT_NE(v, nullptr) << "the key is always written";
      EXPECT_EQ(v->u != 0, add_bos);
    }
}

TEST(TokenizerGguf, FileWithoutTokenizerThrows) {
  TempFile f;
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("toy"));
  w.write(f.path);
  gguf::Reader r(f.path);
  expect_error([&] { Tokenizer::load(r); }, {"[tokenizer]", "carries no tokenizer"});
}

TEST(TokenizerGguf, MalformedMetadataThrows) {
  auto load_with = [](auto&& fill) {
    TempFile f;
    gguf::Writer w;
    fill(w);
    w.write(f.path);
    gguf::Reader r(f.path);
    return Tokenizer::load(r);
  };
  // A byte vocabulary that is not 257 tokens.
  expect_error([&] {
    load_with([](gguf::Writer& w) {
      Tokenizer::train("byte", "")->save(w);
      w.set("tokenizer.ggml.tokens", gguf::Value::str_array({"a", "b"}));
    });
  }, {"[tokenizer:byte]", "257 tokens"});
  // A merge whose parts are not tokens.
  expect_error([&] {
    load_with([](gguf::Writer& w) {
      Tokenizer::train("bpe:3", "hello")->save(w);
      w.set("tokenizer.ggml.merges", gguf::Value::str_array({"h zz"}));
    });
  }, {"[tokenizer:bpe]", "merge 0", "'zz' is not a token"});
  // A pre-tokenizer toy does not implement.
  expect_error([&] {
    load_with([](gguf::Writer& w) {
      Tokenizer::train("bpe:3", "hello")->save(w);
      w.set("tokenizer.ggml.pre", gguf::Value::str("tekken"));
    });
  }, {"pre-tokenizer 'tekken' is not supported", "llama-bpe"});
  // token_type of the wrong length; an eos id out of range.
  expect_error([&] {
    load_with([](gguf::Writer& w) {
      Tokenizer::train("char", "abc")->save(w);
      w.set("tokenizer.ggml.token_type", gguf::Value::i32_array({1}));
    });
  }, {"token_type", "1 entries"});
  expect_error([&] {
    load_with([](gguf::Writer& w) {
      Tokenizer::train("bpe:3", "hello")->save(w);
      w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(99999));
    });
  }, {"eos_token_id", "99999", "out of range"});
  // An unknown tokenizer model.
  expect_error([&] {
    load_with([](gguf::Writer& w) { w.set("tokenizer.ggml.model", gguf::Value::str("bert")); });
  }, {"tokenizer model 'bert' is not supported"});
}

// ---- foreign vocabularies (llama.cpp's vocab-only GGUFs) -----------------------------------------

namespace {

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<VocabCase> read_vocab_cases(const std::string& gguf_path) {
  const std::string inp = read_file(gguf_path + ".inp"), out = read_file(gguf_path + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  for (size_t pos = 0, next; (next = inp.find(sep, pos)) != std::string::npos; pos = next + sep.size())
    cases.push_back({inp.substr(pos, next - pos), {}});
  std::istringstream lines(out);
  std::string line;
  for (VocabCase& c : cases) {
    if (!std::getline(lines, line)) break;
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
  }
  return cases;
}

}  // namespace

TEST(Gpt2Vocabulary, MatchesTheReferenceTestVectors) {
  const std::string path = shared_path("vocab/ggml-vocab-gpt-2.gguf");
  REQUIRE_SHARED(path);
  gguf::Reader r(path);
  auto t = Tokenizer::load(r);
  EXPECT_EQ(t->kind(), "bpe");
  EXPECT_EQ(t->vocab_size(), 50257);
  EXPECT_EQ(t->eos_id(), 50256);
  EXPECT_EQ(t->token_bytes(50256), "<|endoftext|>");
  EXPECT_EQ(t->token_bytes(220), " ");
  const std::vector<VocabCase> cases = read_vocab_cases(path);
  ASSERT_GT(cases.size(), 30u);
  for (const VocabCase& c : cases) {
    EXPECT_EQ(t->encode(c.text), c.ids) << "text: '" << c.text << "'";
    EXPECT_EQ(t->decode(c.ids), c.text);
  }
}

TEST(Gpt2Vocabulary, SavesAndLoadsBack) {
  const std::string path = shared_path("vocab/ggml-vocab-gpt-2.gguf");
  REQUIRE_SHARED(path);
  gguf::Reader r(path);
  auto t = Tokenizer::load(r);
  auto back = save_and_load(*t);
  EXPECT_EQ(back->vocab_size(), t->vocab_size());
  EXPECT_EQ(back->eos_id(), t->eos_id());
  for (const VocabCase& c : read_vocab_cases(path)) EXPECT_EQ(back->encode(c.text), c.ids);
  const std::string b = random_bytes(4, 3000);
  EXPECT_EQ(back->decode(back->encode(b)), b);
}

TEST(LlamaSpmVocabulary, EncodesEveryTestVectorExactly) {
  // Llama 2's SentencePiece vocabulary and the ids Hugging Face's tokenizer gives (llama.cpp's
  // test vectors): space prefix, "▁" for spaces, score-ordered merges, byte fallback.
  const std::string path = shared_path("vocab/ggml-vocab-llama-spm.gguf");
  REQUIRE_SHARED(path);
  gguf::Reader r(path);
  auto t = Tokenizer::load(r);
  EXPECT_EQ(t->kind(), "spm");
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_TRUE(t->adds_bos());
  for (const VocabCase& c : read_vocab_cases(path)) {
    EXPECT_EQ(t->encode(c.text), c.ids) << c.text;
    EXPECT_EQ(t->decode(t->encode(c.text)), c.text) << c.text;
  }
  // Saved and loaded back, it is the same tokenizer.
  const std::string copy = (std::filesystem::temp_directory_path() / "toy_spm_copy.gguf").string();
  {
    gguf::Writer w;
    t->save(w);
    w.write(copy);
  }
  auto back = Tokenizer::load(gguf::Reader(copy));
  for (const VocabCase& c : read_vocab_cases(path)) EXPECT_EQ(back->encode(c.text), c.ids) << c.text;
  std::remove(copy.c_str());
}

// ---- streaming -----------------------------------------------------------------------------------

TEST(Utf8StreamDecoder, HoldsACharacterSplitAcrossTokens) {
  auto t = Tokenizer::train("byte", "");
  toy::Utf8StreamDecoder d(*t);
  EXPECT_EQ(d.push('a'), "a");
  EXPECT_EQ(d.push(0xE2), "");  // "€" = E2 82 AC
  EXPECT_EQ(d.push(0x82), "");
  EXPECT_EQ(d.push(0xAC), "\xe2\x82\xac");
  EXPECT_EQ(d.push(0xF0), "");  // "😀" = F0 9F 98 80
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.push(0x98), "");
  EXPECT_EQ(d.push(0x80), "\xf0\x9f\x98\x80");
  EXPECT_EQ(d.flush(), "");
}

TEST(Utf8StreamDecoder, PassesInvalidBytesAndFlushesAnIncompleteTail) {
  auto t = Tokenizer::train("byte", "");
  toy::Utf8StreamDecoder d(*t);
  EXPECT_EQ(d.push(0xFF), "\xff");  // can never become valid: not held
  EXPECT_EQ(d.push(0xE2), "");
  EXPECT_EQ(d.push('a'), "\xe2" "a");  // the held byte turned out invalid
  EXPECT_EQ(d.push(0xC3), "");
  EXPECT_EQ(d.flush(), "\xc3");
  EXPECT_EQ(d.flush(), "");
  EXPECT_THROW(d.push(999), toy::Error);
}

TEST(Utf8StreamDecoder, StreamsGpt2TokensOfEmoji) {
  const std::string path = shared_path("vocab/ggml-vocab-gpt-2.gguf");
  REQUIRE_SHARED(path);
  gguf::Reader r(path);
  auto t = Tokenizer::load(r);
  const std::string text = "Hi \xf0\x9f\x98\x80\xf0\x9f\xa6\x99 \xe2\x82\xac 5 caf\xc3\xa9";  // "Hi 😀🦙 € 5 café"
  const std::vector<int32_t> ids = t->encode(text);
  toy::Utf8StreamDecoder d(*t);
  std::string all;
  bool split_seen = false;
  for (int32_t id : ids) {
    const std::string piece = d.push(id);
    if (piece.empty()) split_seen = true;  // a token ended inside a character
    // Every piece handed out is complete UTF-8.
    for (size_t i = 0; i < piece.size();) {
      const auto st = toy::tokenizer_detail::utf8_step(piece, i);
      ASSERT_EQ(st.status, toy::tokenizer_detail::Utf8Status::ok) << "piece '" << piece << "'";
      i += st.len;
    }
    all += piece;
  }
  all += d.flush();
  EXPECT_TRUE(split_seen);
  EXPECT_EQ(all, text);
}

// ---- speed (run by hand) ---------------------------------------------------------------------------

// Trains bpe:2000 on ~10 MB (tinyshakespeare repeated). Disabled: a measurement, not a
// check. Run: toy_tokenizer_tests --gtest_also_run_disabled_tests --gtest_filter='*TrainTen*'
TEST(BpeTokenizer, DISABLED_TrainTenMegabytes) {
  REQUIRE_SHARED(shared_path("tinyshakespeare.txt"));
  std::string corpus;
  while (corpus.size() < 10'000'000) corpus += shakespeare();
  corpus.resize(10'000'000);
  const auto t0 = std::chrono::steady_clock::now();
  auto t = Tokenizer::train("bpe:2000", corpus);
  const auto t1 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = t->encode(corpus);
  const auto t2 = std::chrono::steady_clock::now();
  const double train_s = std::chrono::duration<double>(t1 - t0).count();
  const double encode_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("bpe:2000 on %zu bytes: train %.2f s, encode %.2f s (%.1f MB/s), %zu tokens (%.2f bytes/token)\n",
              corpus.size(), train_s, encode_s, corpus.size() / encode_s / 1e6, ids.size(),
              double(corpus.size()) / double(ids.size()));
  EXPECT_EQ(t->vocab_size(), 256 + 2000 + 1);
}

// toy's pre-tokenizers split text exactly as the published patterns do: the regular
// expressions of GPT-2's, Llama 3's, Qwen2's and SmolLM2's tokenizer.json files, run by
// Python's `regex` module (tests/fixtures/make_pretok_fixture.py, Debian python3-regex) over
// texts with contractions in both cases, digit runs, whitespace runs, CR/LF, NBSP and other
// Unicode spaces, combining marks, CJK, Cyrillic, emoji sequences and code.
TEST(PreTokenizer, SplitsAsThePublishedRegularExpressions) {
  std::ifstream in(std::string(TOY_FIXTURE_DIR) + "/pretok_splits.json", std::ios::binary);
  ASSERT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str());
  const auto texts = j["texts"].get<std::vector<std::string>>();
  int checked = 0;
  for (const auto& [name, splits] : j["splits"].items()) {
    const auto& pre = toy::tokenizer_detail::PreTokenizer::get(name);
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<std::string> ours;
      pre.split(texts[i], [&](std::string_view p) { ours.emplace_back(p); });
      EXPECT_EQ(ours, splits[i].get<std::vector<std::string>>()) << name << " on \"" << texts[i] << "\"";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * int(texts.size()));
}
