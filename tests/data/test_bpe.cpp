#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/bpe.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::data;

namespace {

const std::string kDir = std::string(LOOM_DATA_FIXTURES) + "/tokenizers";

struct Case {
  std::string text;
  std::vector<int32_t> gpt2, cl100k;
};

std::vector<int32_t> ids_of(const Json& a) {
  std::vector<int32_t> v;
  for (auto& x : a.as_array()) v.push_back(int32_t(x.as_int()));
  return v;
}

const std::vector<Case>& cases() {
  static std::vector<Case> all = [] {
    std::vector<Case> out;
    std::string text = read_file(kDir + "/cases.jsonl");
    size_t pos = 0;
    while (pos < text.size()) {
      size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      if (eol > pos) {
        Json j = Json::parse(std::string_view(text).substr(pos, eol - pos), "cases.jsonl");
        out.push_back(
            {j.at("text").as_string(), ids_of(j.at("gpt2")), ids_of(j.at("cl100k_base"))});
      }
      pos = eol + 1;
    }
    return out;
  }();
  return all;
}

// Vocabularies load once for the whole binary (cl100k takes a fraction of a second).
const BpeTokenizer& gpt2_files() {
  static BpeTokenizer t = load_gpt2_tokenizer(kDir + "/gpt2");
  return t;
}
const BpeTokenizer& gpt2_tiktoken() {
  static BpeTokenizer t = load_tiktoken(kDir + "/gpt2.tiktoken");
  return t;
}
const BpeTokenizer& cl100k() {
  static BpeTokenizer t = load_tiktoken(kDir + "/cl100k_base.tiktoken");
  return t;
}

// Straight transcription of tiktoken's rule, slow and obviously right: merge the adjacent
// pair whose concatenation has the lowest rank until none is a token.
std::vector<int32_t> naive_piece(const std::map<std::string, int32_t>& ranks, std::string piece) {
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && it->second < best) best = it->second, at = i;
    }
    if (best == INT32_MAX) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + long(at) + 1);
  }
  std::vector<int32_t> ids;
  for (auto& p : parts) ids.push_back(ranks.at(p));
  return ids;
}

}  // namespace

TEST(Bpe, Gpt2TwoFileFormatMatchesReferenceOnAllCases) {
  ASSERT_GE(cases().size(), 30u);
  for (auto& c : cases()) EXPECT_EQ(gpt2_files().encode(c.text), c.gpt2) << c.text;
  EXPECT_EQ(gpt2_files().vocab_size(), 50257);
  EXPECT_EQ(gpt2_files().eot_id(), 50256);
}

TEST(Bpe, Gpt2TiktokenMatchesReferenceOnAllCases) {
  for (auto& c : cases()) EXPECT_EQ(gpt2_tiktoken().encode(c.text), c.gpt2) << c.text;
}

TEST(Bpe, Cl100kMatchesReferenceOnAllCases) {
  for (auto& c : cases()) EXPECT_EQ(cl100k().encode(c.text), c.cl100k) << c.text;
  EXPECT_EQ(cl100k().vocab_size(), 100277);
  EXPECT_EQ(cl100k().special_id("<|endofprompt|>"), 100276);
}

TEST(Bpe, DecodeIsTheExactInverse) {
  for (auto& c : cases()) {
    EXPECT_EQ(gpt2_files().decode(c.gpt2), c.text);
    EXPECT_EQ(cl100k().decode(c.cl100k), c.text);
  }
}

TEST(Bpe, SpecialTokensCanBeDisallowed) {
  auto ids = cl100k().encode("a<|endoftext|>b", /*allow_special=*/false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 100257), 0);
  EXPECT_EQ(cl100k().decode(ids), "a<|endoftext|>b");
  auto fim = cl100k().encode("<|fim_prefix|>x<|fim_suffix|>");
  EXPECT_EQ(fim.front(), 100258);
  EXPECT_EQ(fim.back(), 100260);
}

TEST(Bpe, InvalidUtf8RoundTripsAsBytes) {
  std::mt19937 rng(7);
  std::vector<std::string> texts = {"\xff",
                                    "abc\xc3(def",
                                    "\xed\xa0\x80 surrogate",
                                    "caf\xc3\xa9\xc3",
                                    "\xf0\x9f\x98 broken emoji",
                                    std::string("nul\0byte", 8)};
  for (int k = 0; k < 200; ++k) {
    std::string s(size_t(rng() % 40), '\0');
    for (auto& ch : s) ch = char(rng() & 0xFF);
    texts.push_back(s);
  }
  for (auto& t : texts) {
    for (const BpeTokenizer* tok : {&gpt2_files(), &gpt2_tiktoken(), &cl100k()}) {
      auto ids = tok->encode(t);
      EXPECT_EQ(tok->decode(ids), t);
    }
  }
}

TEST(Bpe, AgreesWithNaiveMergeRuleOnLongAndRandomPieces) {
  // Long pieces go through the heap-based merge; compare both paths with the naive rule.
  std::map<std::string, int32_t> ranks;
  const BpeTokenizer& tok = cl100k();
  for (size_t id = 0; id < tok.n_ordinary(); ++id)
    if (!tok.token_bytes(int32_t(id)).empty()) ranks[tok.token_bytes(int32_t(id))] = int32_t(id);
  std::mt19937 rng(3);
  const std::string alphabet = "abcdeghinorstu";
  for (int k = 0; k < 60; ++k) {
    std::string piece(size_t(2 + rng() % 300), 'a');
    for (auto& ch : piece) ch = alphabet[rng() % alphabet.size()];
    std::vector<int32_t> got;
    tok.encode_piece(piece, got);
    EXPECT_EQ(got, naive_piece(ranks, piece)) << piece;
  }
}

TEST(Bpe, TwoFileAndTiktokenFormatsAgreeOnRandomText) {
  std::mt19937 rng(11);
  const char* words[] = {"the", " quick", "  ",           "\n",  "123",  "'s", "caf\xc3\xa9",
                         "!!",  " ",      "\xe4\xb8\xad", "ing", "tion", "\t", "A"};
  for (int k = 0; k < 300; ++k) {
    std::string s;
    for (int w = 0; w < 20; ++w) s += words[rng() % (sizeof words / sizeof *words)];
    EXPECT_EQ(gpt2_files().encode(s), gpt2_tiktoken().encode(s)) << s;
  }
}

TEST(Bpe, EncodingFromManyThreadsGivesTheSameIds) {
  std::string text;
  for (auto& c : cases()) text += c.text + "\n";
  auto expect = gpt2_files().encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 20; ++r) got[size_t(t)] = gpt2_files().encode(text);
    });
  for (auto& th : threads) th.join();
  for (auto& g : got) EXPECT_EQ(g, expect);
}

TEST(Bpe, BadFilesGiveClearErrors) {
  loom::test::TempDir tmp("bpe_bad");
  std::string dir = tmp.path;
  write_file_atomic(dir + "/bad.tiktoken", "IQ== 0\nnot-base64! 1\n");
  try {
    load_tiktoken(dir + "/bad.tiktoken", PreTokenizer::Gpt2, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.tiktoken:2"), std::string::npos) << e.what();
  }
  write_file_atomic(dir + "/few.tiktoken", "IQ== 0\n");
  EXPECT_THROW(load_tiktoken(dir + "/few.tiktoken", PreTokenizer::Gpt2, {}), Error);
  EXPECT_THROW(load_tokenizer(dir + "/missing"), Error);
  EXPECT_THROW(gpt2_files().decode(std::vector<int32_t>{50257}), Error);
}

TEST(Bpe, CutVocabBpeIsAnErrorNamingTheFile) {
  // Cut at a line boundary the file still parses: the merges it lost must be noticed.
  loom::test::TempDir dir("bpe_cut");
  std::string fixture = std::string(LOOM_DATA_FIXTURES) + "/tokenizers/gpt2";
  write_file_atomic(dir / "encoder.json", read_file(fixture + "/encoder.json"));
  std::string bpe = read_file(fixture + "/vocab.bpe");
  size_t cut = bpe.find('\n', bpe.size() / 2) + 1;
  write_file_atomic(dir / "vocab.bpe", bpe.substr(0, cut));
  try {
    load_gpt2_tokenizer(dir.path);
    FAIL() << "a cut vocab.bpe loaded";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(dir / "vocab.bpe"), std::string::npos) << m;
    EXPECT_NE(m.find("cut short"), std::string::npos) << m;
  }
  write_file_atomic(dir / "vocab.bpe", bpe.substr(0, cut + 3));  // cut inside a line
  try {
    load_gpt2_tokenizer(dir.path);
    FAIL() << "a cut vocab.bpe loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir / "vocab.bpe"), std::string::npos) << e.what();
  }
}
