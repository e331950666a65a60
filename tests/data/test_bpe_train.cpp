#include <gtest/gtest.h>

#include <random>
#include <string>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/bpe_train.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::data;

namespace {

// A small corpus with a skewed word distribution, written as JSONL and as plain text.
struct Corpus {
  loom::test::TempDir tmp{"bpe_train"};  // shared by the tests, removed at exit
  std::string dir, jsonl, txt;
  Corpus() {
    dir = tmp.path;
    const char* words[] = {"the",    "token", "tokens", "data",
                           "loader", "model", "train",  "caf\xc3\xa9",
                           "12",     "345",   "!",      "\xe4\xb8\xad\xe6\x96\x87",
                           "of",     "and",   "we're",  "GPU"};
    std::mt19937 rng(5);
    std::string js, tx;
    for (int doc = 0; doc < 300; ++doc) {
      std::string text;
      int n = 5 + int(rng() % 30);
      for (int w = 0; w < n; ++w) {
        size_t k = std::min<size_t>(rng() % 16, rng() % 16);  // skewed towards early words
        if (w) text += ' ';
        text += words[k];
      }
      if (doc % 17 == 0) text += "<|endoftext|>";
      std::string line;
      json_escape(line, text);
      js += "{\"id\": " + std::to_string(doc) + ", \"text\": " + line + "}\n";
      tx += text + "\n";
    }
    jsonl = dir + "/corpus.jsonl";
    txt = dir + "/corpus.txt";
    write_file_atomic(jsonl, js);
    write_file_atomic(txt, tx);
  }
};

const Corpus& corpus() {
  static Corpus c;
  return c;
}

BpeTrainOptions options(int threads, int32_t vocab = 300) {
  BpeTrainOptions o;
  o.vocab_size = vocab;
  o.threads = threads;
  o.progress = false;
  return o;
}

}  // namespace

TEST(BpeTrain, LearnsFrequentWordsAndRoundTrips) {
  BpeTokenizer tok = train_bpe({corpus().jsonl}, options(2));
  EXPECT_EQ(tok.vocab_size(), 300);
  EXPECT_EQ(tok.eot_id(), 299);
  EXPECT_EQ(tok.encode(" the").size(), 1u);  // the most frequent word became one token
  EXPECT_EQ(tok.encode("the<|endoftext|>").back(), 299);
  std::mt19937 rng(9);
  for (int k = 0; k < 100; ++k) {
    std::string s(size_t(rng() % 64), '\0');
    for (auto& ch : s) ch = char(rng() % 3 ? 'a' + rng() % 26 : rng() & 0xFF);
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
  }
}

TEST(BpeTrain, DeterministicAcrossThreadCountsAndInputFormats) {
  std::string one = tiktoken_text(train_bpe({corpus().jsonl}, options(1)));
  std::string two = tiktoken_text(train_bpe({corpus().jsonl}, options(2)));
  EXPECT_EQ(one, two);
  // The plain-text file holds the same texts, one per line; the extra newlines are pieces of
  // their own, so only the vocabulary size is compared exactly.
  BpeTokenizer from_txt = train_bpe({corpus().txt}, options(2));
  EXPECT_EQ(from_txt.vocab_size(), 300);
  // A larger vocabulary extends the smaller one (merges are learnt in the same order).
  std::string bigger = tiktoken_text(train_bpe({corpus().jsonl}, options(1, 310)));
  EXPECT_EQ(bigger.compare(0, one.size(), one), 0);
}

TEST(BpeTrain, SavedVocabularyLoadsAndEncodesTheSame) {
  BpeTokenizer tok = train_bpe({corpus().jsonl}, options(2));
  std::string dir = corpus().dir + "/vocab";
  save_loom_tokenizer(tok, dir);
  auto loaded = load_tokenizer("loom:" + dir);
  auto detected = load_tokenizer(dir);
  std::string text = "the tokens of the model, caf\xc3\xa9 12345!<|endoftext|>\xff";
  EXPECT_EQ(loaded->encode(text), tok.encode(text));
  EXPECT_EQ(detected->encode(text), tok.encode(text));
  EXPECT_EQ(loaded->vocab_size(), tok.vocab_size());
}

TEST(BpeTrain, RunsOutOfPairsGracefullyAndRejectsBadInput) {
  PieceCounts tiny = {{"ab", 3}, {"abc", 1}};
  BpeTokenizer tok = train_bpe(tiny, options(1, 1000));
  EXPECT_EQ(tok.vocab_size(), 256 + 2 + 1);  // "ab", "abc", then <|endoftext|>
  EXPECT_EQ(tok.encode("abc").size(), 1u);
  EXPECT_THROW(train_bpe(tiny, options(1, 100)), Error);

  std::string bad = corpus().dir + "/bad.jsonl";
  write_file_atomic(bad, "{\"text\": \"ok\"}\n{\"txt\": \"no field\"}\n");
  try {
    train_bpe({bad}, options(2));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing field 'text'"), std::string::npos);
  }
}
