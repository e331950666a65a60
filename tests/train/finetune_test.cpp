// Fine-tuning through the trainer: weights-only starts (train.pretrained), supervised fine-tuning
// on chat data, and LoRA (adapters only trained and checkpointed, resume bit-identical, the
// frozen base untouched), plus the errors a user can run into.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "core/fs.h"
#include "data/bpe.h"
#include "temp_dir.h"
#include "train/trainer.h"

using namespace loom;

namespace {

// A fresh directory removed when the test ends, pass or fail.
std::string test_dir(const std::string& name) {
  return loom::test::scoped_dir("finetune_" + name);
}

// A byte tokenizer with ChatML's markers, and a chat file: "reverse" a short string.
std::string chat_data(const std::string& dir) {
  data::save_loom_tokenizer(data::byte_chatml_tokenizer(), dir + "/tok");
  std::string text;
  for (int i = 0; i < 64; ++i) {
    std::string w;
    for (int k = 0; k < 3 + i % 4; ++k) w += char('a' + (i * 7 + k * 3) % 26);
    text += "{\"messages\": [{\"role\": \"user\", \"content\": \"reverse " + w +
            "\"}, {\"role\": \"assistant\", \"content\": \"" + std::string(w.rbegin(), w.rend()) +
            "\"}]}\n";
  }
  write_file_atomic(dir + "/chat.jsonl", text);
  return dir + "/chat.jsonl";
}

Config chat_config(const std::string& dir, const std::string& out, int steps) {
  Config c = Config::parse(
      "[model]\npreset = \"tiny-llama\"\nn_layer = 2\nd_model = 32\nn_head = 4\nn_kv_head = 2\n"
      "d_ff = 64\nvocab = 260\nmax_seq = 64\n"
      "[data]\nsource = \"chat\"\nvalid_fraction = 0.1\n"
      "[train]\nmicro_batch = 2\nseq_len = 32\nquiet = true\npeak_gflops = 100\nkeep_last = 2\n"
      "[optim]\nlr = 3e-3\nwarmup_steps = 2\n",
      "test.toml");
  c.set("data.path", "\"" + chat_data(dir) + "\"", "test");
  c.set("data.tokenizer", "\"loom:" + dir + "/tok\"", "test");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.out_dir", "\"" + out + "\"", "test");
  return c;
}

std::vector<float> copy(const ParamSet& P) {
  return std::vector<float>(P.data(), P.data() + P.total());
}

bool same(const std::vector<float>& a, const ParamSet& P) {
  return a.size() == size_t(P.total()) && std::memcmp(a.data(), P.data(), a.size() * 4) == 0;
}

}  // namespace

// Full SFT from a pretrained checkpoint: it starts from those weights at step 0, and the loss on
// assistant tokens falls.
TEST(Finetune, SftStartsFromPretrainedWeightsAndLearns) {
  const std::string d = test_dir("sft");
  std::vector<float> base;
  {
    Trainer pre(chat_config(d, d + "/base", 4));
    pre.run();
    base = copy(pre.model().params());
  }
  Config c = chat_config(d, d + "/sft", 40);
  c.set("train.pretrained", "\"" + d + "/base/checkpoints\"", "test");
  Trainer sft(c);
  EXPECT_EQ(sft.step(), 0);
  EXPECT_TRUE(same(base, sft.model().params()));
  double first = 0, last = 0;
  for (int i = 0; i < 40; ++i) {
    const double l = sft.train_step().loss;
    if (i < 5) first += l / 5;
    if (i >= 35) last += l / 5;
  }
  EXPECT_LT(last, 0.7 * first);
}

// LoRA: only adapters change and are checkpointed; the base equals the pretrained weights all
// along; a resumed run is bit-identical to a straight one.
TEST(Finetune, LoraTrainsAdaptersOnlyAndResumesBitIdentically) {
  const std::string d = test_dir("lora");
  {
    Trainer pre(chat_config(d, d + "/base", 4));
    pre.run();
  }
  auto lora_config = [&](const std::string& out) {
    Config c = chat_config(d, out, 8);
    c.set("train.pretrained", "\"" + d + "/base/checkpoints\"", "test");
    c.set("lora.rank", "4", "test");
    c.set("lora.alpha", "8", "test");
    c.set("lora.targets", "\"attn.qkv, mlp.fc\"", "test");
    return c;
  };
  Trainer straight(lora_config(d + "/a"));
  const std::vector<float> base = copy(straight.model().params());
  ASSERT_NE(straight.lora(), nullptr);
  EXPECT_EQ(straight.lora()->target_names().size(), 4u);
  straight.run();
  EXPECT_TRUE(same(base, straight.model().params()));  // the base never moves
  const std::vector<float> adapters = copy(straight.lora()->params());
  bool moved = false;
  for (const ParamInfo& p : straight.lora()->params().infos())
    if (p.name.find("lora_B") != std::string::npos)
      for (int64_t i = 0; i < p.numel; ++i) moved |= adapters[size_t(p.offset + i)] != 0.f;
  EXPECT_TRUE(moved);

  Config split = lora_config(d + "/b");
  split.set("train.checkpoint_interval", "4", "test");
  {
    Trainer t(split);
    for (int i = 0; i < 4; ++i) t.train_step();
    t.save_checkpoint();
  }
  Trainer resumed(split);
  EXPECT_EQ(resumed.step(), 4);
  resumed.run();
  EXPECT_TRUE(same(adapters, resumed.lora()->params()));
  // The checkpoint holds the adapters and their optimizer state, not the base.
  ckpt::Checkpoint c(d + "/b/checkpoints");
  EXPECT_TRUE(c.state().extra.contains("lora"));
}

// LoRA dropout through the trainer: it changes training (B's gradient sees dropped inputs),
// a resumed run is bit-identical to a straight one (the masks are keyed by the micro-batch's
// place in the run, not drawn from a stream that a restart would reset), and evaluation drops
// nothing (the same adapters evaluate as in a run without dropout, bit for bit).
TEST(Finetune, LoraDropoutResumesBitIdenticallyAndEvaluatesWithoutIt) {
  const std::string d = test_dir("lora_dropout");
  {
    Trainer pre(chat_config(d, d + "/base", 4));
    pre.run();
  }
  auto lora_config = [&](const std::string& out, const char* dropout) {
    Config c = chat_config(d, out, 8);
    c.set("train.pretrained", "\"" + d + "/base/checkpoints\"", "test");
    c.set("train.eval_interval", "100", "test");
    c.set("lora.rank", "4", "test");
    c.set("lora.alpha", "8", "test");
    c.set("lora.dropout", dropout, "test");
    return c;
  };
  Trainer straight(lora_config(d + "/a", "0.2")), plain(lora_config(d + "/p", "0"));
  int differ = 0;
  for (int i = 0; i < 8; ++i) differ += straight.train_step().loss != plain.train_step().loss;
  EXPECT_GE(differ, 6);  // step 0 is equal (B = 0: the adapters add nothing yet)
  const std::vector<float> adapters = copy(straight.lora()->params());
  // Evaluation: the dropout run's adapters in the plain run evaluate to the same loss.
  ParamSet& P = plain.lora()->params();
  std::copy(adapters.begin(), adapters.end(), P.data());
  EXPECT_EQ(straight.evaluate(), plain.evaluate());
  EXPECT_FALSE(straight.lora()->dropout_active());

  Config split = lora_config(d + "/b", "0.2");
  {
    Trainer t(split);
    for (int i = 0; i < 4; ++i) t.train_step();
    t.save_checkpoint();
  }
  Trainer resumed(split);
  EXPECT_EQ(resumed.step(), 4);
  for (int i = 4; i < 8; ++i) resumed.train_step();
  EXPECT_TRUE(same(adapters, resumed.lora()->params()));
}

TEST(Finetune, ClearErrors) {
  const std::string d = test_dir("errors");
  Config c = chat_config(d, d + "/x", 2);
  c.set("lora.rank", "4", "test");
  EXPECT_THROW(Trainer t(c), Error);  // LoRA without train.pretrained
  Config m = chat_config(d, d + "/y", 2);
  m.set("train.pretrained", "\"" + d + "/nowhere\"", "test");
  EXPECT_THROW(Trainer t(m), Error);
  for (const char* p : {"1.0", "-0.1"}) {  // lora.dropout must lie in [0, 1)
    Config dr = chat_config(d, d + "/z", 2);
    dr.set("train.pretrained", "\"" + d + "/nowhere\"", "test");
    dr.set("lora.rank", "4", "test");
    dr.set("lora.dropout", p, "test");
    try {
      Trainer t(dr);
      ADD_FAILURE() << "lora.dropout = " << p << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("lora.dropout"), std::string::npos) << e.what();
    }
  }
  Config tpl = chat_config(d, d + "/w", 2);
  tpl.set("data.chat_template", "\"llama3\"", "test");  // markers missing from the tokenizer
  EXPECT_THROW(Trainer t(tpl), Error);
}

// Packed SFT with a conversation longer than the model's context (about 210 tokens against
// model.max_seq 128, in micro-batches of 4 x 64 = 256 tokens): it is cut at 128 tokens and
// counted, and the run trains through it.
TEST(Finetune, PackedSftCutsAConversationLongerThanTheContext) {
  const std::string d = test_dir("long_chat");
  Config c = chat_config(d, d + "/run", 6);
  std::string text;
  for (int i = 0; i < 20; ++i)
    text += "{\"messages\": [{\"role\": \"user\", \"content\": \"hi " + std::to_string(i) +
            "\"}, {\"role\": \"assistant\", \"content\": \"ok\"}]}\n";
  text += "{\"messages\": [{\"role\": \"user\", \"content\": \"" + std::string(170, 'x') +
          "\"}, {\"role\": \"assistant\", \"content\": \"long\"}]}\n";
  write_file_atomic(d + "/long.jsonl", text);
  c.set("data.path", "\"" + d + "/long.jsonl\"", "test");
  c.set("data.valid_fraction", "0", "test");
  c.set("model.max_seq", "128", "test");
  c.set("train.micro_batch", "4", "test");
  c.set("train.seq_len", "64", "test");
  Trainer t(c);
  for (int s = 0; s < 6; ++s) EXPECT_TRUE(std::isfinite(t.train_step().loss)) << "step " << s;
  t.save_checkpoint();
  t.finish_checkpoints();
  const ckpt::Checkpoint saved(d + "/run/checkpoints");
  EXPECT_GE(saved.state().data.at("truncated").as_int(), 1);
}

// train.freeze equals a learning rate of 0 for those parameters: they never move, and every
// other parameter ends bit-identical to a run that trains everything but puts the frozen ones
// back after each step (without clipping, whose global norm would see their gradients).
TEST(Finetune, FrozenParametersActAsLearningRateZero) {
  const std::string d = test_dir("freeze");
  auto config = [&](const std::string& out, bool freeze) {
    Config c = chat_config(d, out, 5);
    c.set("train.clip_grad", "0", "test");
    if (freeze) c.set("train.freeze", "\"embed., blocks.0.attn\"", "test");
    return c;
  };
  Trainer frozen(config(d + "/f", true)), reference(config(d + "/r", false));
  ParamSet &F = frozen.model().params(), &R = reference.model().params();
  const std::vector<float> start = copy(R);
  for (int s = 0; s < 5; ++s) {
    frozen.train_step();
    reference.train_step();
    for (const ParamInfo& p : F.infos())
      if (!p.trainable)
        std::copy(start.begin() + p.offset, start.begin() + p.offset + p.numel,
                  R.data() + p.offset);
  }
  int frozen_count = 0;
  for (const ParamInfo& p : F.infos()) {
    frozen_count += !p.trainable;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      if (!p.trainable) {
        ASSERT_EQ(F.data()[i], start[size_t(i)]) << p.name;
      }
      ASSERT_EQ(F.data()[i], R.data()[i]) << p.name;
    }
  }
  EXPECT_EQ(frozen_count, 3);  // embed.wte and blocks.0.attn.{qkv,proj}.weight
  Config bad = config(d + "/b", false);
  bad.set("train.freeze", "\"embedding.\"", "test");
  EXPECT_THROW(Trainer t(bad), Error);
  Config gpu = config(d + "/g", false);
  gpu.set("train.device", "\"cuda\"", "test");
  EXPECT_THROW(Trainer t(gpu), Error);
}
