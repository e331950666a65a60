// Chat token files (loom tokenize --chat, data.source = "chat_tokens"): the files hold exactly
// the rendered ids and loss masks of the JSONL examples, the source built on them gives the JSONL
// chat source's batches (packed and one per row, train and validation, over data-parallel
// ranks), and an SFT run on them has the JSONL run's losses step for step.
#include <gtest/gtest.h>

#include "core/fs.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "data/chat_tokens.h"
#include "temp_dir.h"
#include "train/chat_source.h"
#include "train/trainer.h"

using namespace loom;

namespace {

// A tokenizer and 40 examples of varied lengths (conversations and prompt/completion lines,
// one blank line), with their token files under d/chat.
struct ChatFiles {
  std::string dir, jsonl, tok, prefix;
  explicit ChatFiles(const std::string& d) : dir(d) {
    data::save_loom_tokenizer(data::byte_chatml_tokenizer(), d + "/tok");
    tok = "loom:" + d + "/tok";
    std::string text;
    for (int i = 0; i < 40; ++i) {
      std::string w(size_t(2 + i * 5 % 11), char('a' + i % 26));
      if (i % 3 == 0)
        text += "{\"prompt\": \"say " + w + "\", \"completion\": \"" + w + "!\"}\n";
      else
        text +=
            "{\"messages\": [{\"role\": \"system\", \"content\": \"short\"}, {\"role\": "
            "\"user\", \"content\": \"echo " +
            w + "\"}, {\"role\": \"assistant\", \"content\": \"" + w + "\"}]}\n";
      if (i == 20) text += "\n";
    }
    jsonl = d + "/chat.jsonl";
    write_file_atomic(jsonl, text);
    prefix = d + "/chat";
    auto t = data::byte_chatml_tokenizer();
    data::ChatTemplate tmpl("chatml", t);
    data::write_chat_token_files({jsonl}, tmpl, t.vocab_size(), prefix);
  }
};

bool same_batch(const Batch& a, const Batch& b) {
  return a.B == b.B && a.T == b.T && a.tokens == b.tokens && a.targets == b.targets &&
         a.positions == b.positions && a.cu_seqlens == b.cu_seqlens;
}

}  // namespace

TEST(ChatTokens, FilesHoldTheRenderedIdsAndMasks) {
  ChatFiles f(loom::test::scoped_dir("chat_tokens_files"));
  auto tok = data::byte_chatml_tokenizer();
  data::ChatTemplate t("chatml", tok);
  const auto examples = data::load_chat_jsonl(f.jsonl, t);
  data::ChatTokenFile file(f.prefix);
  ASSERT_EQ(file.size(), int64_t(examples.size()));
  int64_t trained = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const data::ChatExample ex = file.example(int64_t(i));
    EXPECT_EQ(ex.ids, examples[i].ids) << "example " << i;
    EXPECT_EQ(ex.mask, examples[i].mask) << "example " << i;
    for (uint8_t m : ex.mask) trained += m;
  }
  EXPECT_GT(trained, 0);
  // Plain Megatron files: the mask is a uint8 indexed dataset of its own.
  data::IndexedDataset mask(data::chat_mask_prefix(f.prefix));
  EXPECT_EQ(mask.dtype(), data::TokenDType::UInt8);
}

TEST(ChatTokens, SourceGivesTheJsonlSourcesBatches) {
  ChatFiles f(loom::test::scoped_dir("chat_tokens_source"));
  const int vocab = data::byte_chatml_tokenizer().vocab_size();
  for (bool packed : {true, false})
    for (const char* split : {"train", "valid"})
      for (int rank = 0; rank < 2; ++rank) {
        ChatSource a(f.jsonl, f.tok, "chatml", 3, 32, packed, 7, 0.2, split, rank, 2);
        ChatSource b(f.prefix, vocab, 3, 32, packed, 7, 0.2, split, rank, 2);
        Batch x, y;
        for (int k = 0; k < 12; ++k) {  // past an epoch of the validation split
          a.next(x);
          b.next(y);
          ASSERT_TRUE(same_batch(x, y))
              << "packed " << packed << " " << split << " rank " << rank << " micro-batch " << k;
        }
        EXPECT_EQ(a.truncated(), b.truncated());
      }
}

TEST(ChatTokens, SftRunHasTheJsonlRunsLosses) {
  ChatFiles f(loom::test::scoped_dir("chat_tokens_sft"));
  auto config = [&](const std::string& out) {
    Config c = Config::parse(
        "[model]\npreset = \"tiny-llama\"\nn_layer = 2\nd_model = 32\nn_head = 4\n"
        "n_kv_head = 2\nd_ff = 64\nvocab = 260\nmax_seq = 64\n"
        "[data]\nvalid_fraction = 0.1\n"
        "[train]\nmode = \"sft\"\nmicro_batch = 2\nseq_len = 32\nsteps = 6\nquiet = true\n"
        "peak_gflops = 100\neval_interval = 3\neval_batches = 2\n"
        "[optim]\nlr = 3e-3\nwarmup_steps = 2\n",
        "test.toml");
    c.set("data.tokenizer", "\"" + f.tok + "\"", "test");
    c.set("train.out_dir", "\"" + f.dir + "/" + out + "\"", "test");
    return c;
  };
  Config a = config("jsonl"), b = config("tokens");
  a.set("data.source", "\"chat\"", "test");
  a.set("data.path", "\"" + f.jsonl + "\"", "test");
  b.set("data.source", "\"chat_tokens\"", "test");
  b.set("data.prefix", "\"" + f.prefix + "\"", "test");
  Trainer ta(a), tb(b);
  for (int i = 0; i < 6; ++i) {
    const double la = ta.train_step().loss, lb = tb.train_step().loss;
    EXPECT_EQ(la, lb) << "step " << i;
  }
  EXPECT_EQ(ta.evaluate(), tb.evaluate());
}
