// Fine-tuning under data parallelism through the trainer: a LoRA run on N MPI ranks (ZeRO 0, 1
// and 2) gives the one-process losses, gradient norms and adapters for the same global batch,
// with the base frozen and optimizer state for the adapters only, and under tensor parallelism
// (adapters split like their layers), with and without LoRA dropout; a DPO run (full, and LoRA)
// gives the one-process DPO loss, rewards and accuracy (pairs whole on one rank, the loss a
// mean over the global batch's pairs), under DP and under TP (+SP).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ckpt/checkpoint.h"
#include "ckpt/consolidate.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/rng.h"
#include "data/bpe.h"
#include "model/lora.h"
#include "mpi_main.h"
#include "parallel/data_parallel.h"
#include "parity_util.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

using namespace loom;
using loom::testing_parallel::job_tag;
using loom::testing_parallel::rel_diff;
using loom::testing_parallel::W;

namespace {

const testing_parallel::TrainerRuns runs{"ftdp", "a fine-tuned fox "};

Config config(const std::string& dir, int steps, int grad_accum) {
  Config c = testing_parallel::tiny_run_config(dir, runs.line_start, 2, "1e-2", steps, grad_accum);
  c.set("model.preset", "\"tiny\"", "test");
  return c;
}

// A pretrained base: a few steps of pre-training in one process, on every rank alike (the same
// seed and data give the same weights), in this rank's own directory.
std::string make_base() {
  const std::string d = runs.dir("base");
  auto self = comm::make_self_communicator();
  Trainer t(config(d, 3, 1), self.get());
  t.run();
  return d + "/run/checkpoints";
}

// dropout: lora.dropout (masks keyed by the micro-batch's place in the one-process run, so the
// ranks draw what one process draws).
Config lora_config(const std::string& dir, const std::string& base, int steps, int grad_accum,
                   double dropout = 0) {
  Config c = config(dir, steps, grad_accum);
  c.set("train.pretrained", "\"" + base + "\"", "test");
  c.set("lora.rank", "4", "test");
  c.set("lora.alpha", "8", "test");
  c.set("optim.lr", "1e-2", "test");
  if (dropout > 0) c.set("lora.dropout", std::to_string(dropout), "test");
  return c;
}

std::vector<float> copy(const ParamSet& P) {
  return std::vector<float>(P.data(), P.data() + P.total());
}

// Step i of a layout (b) against one process's (a): the loss within 1e-5, the gradient norm
// within 1e-4 (relative).
void expect_step_like(const StepResult& a, const StepResult& b, int i) {
  EXPECT_LT(rel_diff(b.loss, a.loss), 1e-5) << "step " << i << ": " << b.loss << " vs " << a.loss;
  EXPECT_LT(rel_diff(b.grad_norm, a.grad_norm), 1e-4)
      << "grad norm, step " << i << ": " << b.grad_norm << " vs " << a.grad_norm;
}

void expect_steps_like(Trainer& ref, Trainer& t, int steps) {
  for (int i = 0; i < steps; ++i) {
    const StepResult a = ref.train_step(), b = t.train_step();
    expect_step_like(a, b, i);
  }
}

// Every rank's adapters, whole (all-gathered after a sharded step), against one process's.
// Relative to the largest weight: Adam divides by sqrt(v), so a gradient element near zero
// whose sum is rounded differently moves by up to ~lr, not by its own (tiny) size.
void expect_same_adapters(const ParamSet& pa, const ParamSet& pb) {
  ASSERT_EQ(pa.total(), pb.total());
  double worst = 0, largest = 0;
  for (int64_t i = 0; i < pa.total(); ++i) {
    worst = std::max(worst, double(std::abs(pa.data()[i] - pb.data()[i])));
    largest = std::max(largest, double(std::abs(pa.data()[i])));
  }
  EXPECT_LT(worst, 1e-4 * largest) << "adapter weights differ from one process's";
}

void check_lora_parity(int zero, double dropout = 0) {
  const int D = W().size(), A = 2, steps = 8;
  const std::string base = make_base();
  auto self = comm::make_self_communicator();
  Trainer ref(lora_config(runs.dir("lora_ref"), base, steps, A * D, dropout), self.get());
  Config c = lora_config(runs.dir("lora_z" + std::to_string(zero)), base, steps, A, dropout);
  c.set("parallel.zero", std::to_string(zero), "test");
  Trainer t(c);
  ASSERT_TRUE(t.distributed());
  ASSERT_NE(t.lora(), nullptr);
  const std::vector<float> base_weights = copy(t.model().params());
  expect_steps_like(ref, t, steps);
  // Every rank's adapters (all-gathered after the sharded step under ZeRO 1/2) are one
  // process's; the base is untouched.
  const ParamSet& pb = t.lora()->params();
  expect_same_adapters(ref.lora()->params(), pb);
  // The adapters were trained: B started at zero and moved (every step's batch differs, so the
  // losses alone are too noisy to show it in 8 steps).
  double b_largest = 0;
  for (const ParamInfo& p : pb.infos())
    if (p.name.find("lora_B") != std::string::npos)
      for (int64_t i = 0; i < p.numel; ++i)
        b_largest = std::max(b_largest, double(std::abs(pb.data()[p.offset + i])));
  EXPECT_GT(b_largest, 1e-3);
  if (zero < 3) {
    EXPECT_EQ(0, std::memcmp(base_weights.data(), t.model().params().data(),
                             base_weights.size() * sizeof(float)))
        << "the frozen base changed";
  } else {
    // ZeRO-3: the base's blocks were released after use (their pages zero, given back), what
    // stays gathered (embeddings, final norm, head) is one process's base bit for bit, and the
    // adapters' engine runs at ZeRO-2.
    ASSERT_NE(t.base_shards(), nullptr);
    EXPECT_EQ(t.data_parallel()->zero(), 2);
    const ParamSet& base = ref.model().params();
    const ParamSet& mine = t.model().params();
    ASSERT_EQ(base.total(), mine.total());
    std::vector<char> resident(size_t(mine.total()), 0);
    for (auto [lo, hi] : t.base_shards()->resident_ranges())
      for (int64_t i = lo; i < hi; ++i) resident[size_t(i)] = 1;
    int64_t kept = 0, wrong = 0, released_nonzero = 0;
    for (const ParamInfo& p : mine.infos())
      for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
        if (resident[size_t(i)]) {
          ++kept;
          wrong += std::memcmp(base.data() + i, mine.data() + i, sizeof(float)) != 0;
        } else {
          released_nonzero += mine.data()[i] != 0.f;
        }
      }
    EXPECT_GT(kept, 0);
    EXPECT_LT(kept, mine.total() / 2);
    EXPECT_EQ(wrong, 0) << "the gathered part of the frozen base differs from one process's";
    EXPECT_EQ(released_nonzero, 0) << "block weights left in place after use";
    EXPECT_LE(t.base_shards()->max_gathered_units(), 2);
  }
  // Optimizer state (exp_avg, exp_avg_sq) for the adapters only: this rank's share of them.
  const int64_t adapters = pb.total();
  const int64_t mine = zero == 0 ? adapters : (adapters + D - 1) / D;
  int64_t state = 0;
  for (const auto& s : t.data_parallel()->state_slices()) state += s.tensor.numel();
  EXPECT_EQ(state, 2 * mine);
  EXPECT_LT(adapters, t.model().params().total() / 4);
}

// Full fine-tuning from train.pretrained under bf16: every ZeRO level starts from the pretrained
// weights (ZeRO-0's optimizer master once kept the seeded draw and wrote it over them).
TEST(TrainerFinetuneDp, PretrainedBf16StartsFromItsWeightsAtEveryZeroLevel) {
  const int D = W().size(), A = 2, steps = 3;
  const std::string base = make_base();
  auto pretrained = [&](const std::string& dir, int grad_accum) {
    Config c = config(dir, steps, grad_accum);
    c.set("train.pretrained", "\"" + base + "\"", "test");
    c.set("precision.policy", "\"bf16\"", "test");
    return c;
  };
  auto self = comm::make_self_communicator();
  std::vector<double> one;
  {
    Trainer ref(pretrained(runs.dir("pre_ref"), A * D), self.get());
    for (int i = 0; i < steps; ++i) one.push_back(ref.train_step().loss);
  }
  for (int zero : {0, 1, 3}) {
    Config c = pretrained(runs.dir("pre_z" + std::to_string(zero)), A);
    c.set("parallel.zero", std::to_string(zero), "test");
    Trainer t(c);
    ASSERT_TRUE(t.distributed());
    for (int i = 0; i < steps; ++i) {
      const double loss = t.train_step().loss;
      EXPECT_LT(rel_diff(loss, one[size_t(i)]), 1e-2)
          << "ZeRO-" << zero << " step " << i << ": " << loss << " vs " << one[size_t(i)];
    }
  }
}

TEST(TrainerFinetuneDp, LoraZero0MatchesOneProcess) {
  check_lora_parity(0);
}
TEST(TrainerFinetuneDp, LoraZero1MatchesOneProcess) {
  check_lora_parity(1);
}
// ZeRO-3: the frozen base sharded over the ranks and gathered block by block
// (parallel::FrozenShards), the adapters' gradients and optimizer state sharded.
TEST(TrainerFinetuneDp, LoraZero3MatchesOneProcess) {
  check_lora_parity(3);
}
TEST(TrainerFinetuneDp, LoraDropoutZero1MatchesOneProcess) {
  check_lora_parity(1, 0.2);
}
TEST(TrainerFinetuneDp, LoraZero2MatchesOneProcess) {
  check_lora_parity(2);
}

// A LoRA run resumes from its per-rank checkpoints (adapter slices and their optimizer state)
// bit-identically.
TEST(TrainerFinetuneDp, LoraZero1ResumesBitIdentically) {
  const std::string base = make_base();
  auto cfg = [&](const std::string& name) {
    Config c = lora_config(runs.dir(name), base, 6, 1);
    c.set("parallel.zero", "1", "test");
    return c;
  };
  const Config split = cfg("lora_resume");
  testing_parallel::expect_resume_bit_identical(cfg("lora_straight"), split, split, "LoRA: ");
}

// train.init_from a one-process LoRA checkpoint (adapters and their optimizer state): the DP
// ranks continue with one process's losses (the same global batch).
TEST(TrainerFinetuneDp, LoraInitFromOneProcessContinuesItsLosses) {
  const int D = W().size(), A = 2, half = 3, steps = 6;
  const std::string base = make_base();
  auto self = comm::make_self_communicator();
  const std::string one_dir = runs.dir("lora_one");
  std::vector<double> one_losses;
  {
    Trainer one(lora_config(one_dir, base, steps, A * D), self.get());
    for (int i = 0; i < steps; ++i) {
      one_losses.push_back(one.train_step().loss);
      if (i + 1 == half) one.save_checkpoint();
    }
    one.finish_checkpoints();
  }
  Config c = lora_config(runs.dir("lora_init_from"), base, steps, A);
  c.set("parallel.zero", "1", "test");
  c.set("train.init_from",
        "\"" + one_dir + "/run/checkpoints/step_" +
            std::string(8 - std::to_string(half).size(), '0') + std::to_string(half) + "\"",
        "test");
  Trainer t(c);
  ASSERT_EQ(t.step(), half);
  for (int i = half; i < steps; ++i) {
    const double loss = t.train_step().loss;
    EXPECT_LT(rel_diff(loss, one_losses[size_t(i)]), 1e-5) << "step " << i;
  }
}

// LoRA under tensor parallelism (with and without sequence parallelism): the adapters split like
// their layers (B by rows on column-parallel layers, A by columns on row-parallel ones) give one
// process's losses and gradient norms, and every rank's shard holds one process's values.
//
// Then `loom ckpt consolidate` places the ranks' adapter shards into one process's adapters:
// every local element lands, bit for bit, where it stands for.
void check_lora_tp(bool sp, double dropout = 0, int zero = 0) {
  const int A = 2, steps = 6;
  const std::string base = make_base();
  // The run's directory, shared by the ranks (consolidation reads every rank's part there).
  const std::string shared = testing::TempDir() + "/loom_ftdp_lora_tp_" + job_tag();
  if (W().rank() == 0) remove_all(shared);
  W().barrier();
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      W().barrier();
      if (W().rank() == 0) remove_all(path);
    }
  } cleanup{shared};
  auto self = comm::make_self_communicator();
  Trainer ref(lora_config(runs.dir("lora_tp_ref"), base, steps, A * W().size() / 2, dropout),
              self.get());
  Config c = lora_config(runs.dir("lora_tp"), base, steps, A, dropout);
  c.set("train.out_dir", "\"" + shared + "/run\"", "test");
  c.set("parallel.tp", "2", "test");
  c.set("parallel.sp", sp ? "true" : "false", "test");
  c.set("parallel.zero", std::to_string(zero), "test");
  Trainer t(c);
  ASSERT_TRUE(t.distributed());
  ASSERT_EQ(t.groups()->tp().size(), 2);
  EXPECT_EQ(t.base_shards() != nullptr, zero == 3);
  expect_steps_like(ref, t, steps);
  // Each local adapter element against the one-process element it stands for.
  const ParamSet &pa = ref.lora()->params(), &pb = t.lora()->params();
  int sharded = 0;
  double worst = 0, largest = 0;
  for (const ParamInfo& p : pb.infos()) {
    const ParamInfo& q = pa.info(p.name);
    sharded += p.sharded();
    const int64_t row_len = local_row_length(p);
    for (int64_t i = 0; i < p.numel; ++i) {
      const int64_t row = i / row_len, col = i % row_len;
      const int64_t g = p.sharded() ? global_row_first(p, row) + col : i;
      const float va = pa.data()[q.offset + g], vb = pb.data()[p.offset + i];
      worst = std::max(worst, double(std::abs(va - vb)));
      largest = std::max(largest, double(std::abs(va)));
    }
  }
  EXPECT_GT(sharded, 0);
  EXPECT_LT(worst, 1e-4 * largest) << "adapter shards differ from one process's adapters";

  t.save_checkpoint();
  t.finish_checkpoints();
  int64_t ok = 1;
  if (W().rank() == 0) {
    try {
      ckpt::ConsolidateResult r = ckpt::consolidate({shared + "/run", shared + "/one"});
      EXPECT_EQ(r.replica_mismatches, 0);
    } catch (const Error& e) {
      ADD_FAILURE() << "consolidate: " << e.what();
      ok = 0;
    }
  }
  if (W().all_reduce_scalar(-ok, comm::ReduceOp::Max) == 0) return;  // rank 0 failed
  const ckpt::Checkpoint one(shared + "/one");
  EXPECT_TRUE(one.state().extra.contains("lora"));
  int64_t differ = 0;
  for (const ParamInfo& p : pb.infos()) {
    ASSERT_TRUE(one.model().contains(p.name)) << p.name;
    const Tensor w = one.model().view(p.name);
    ASSERT_EQ(w.numel(), global_numel(p)) << p.name;
    const int64_t row_len = local_row_length(p);
    for (int64_t i = 0; i < p.numel; ++i) {
      const int64_t g = global_row_first(p, i / row_len) + i % row_len;
      differ += std::memcmp(w.data<float>() + g, pb.data() + p.offset + i, sizeof(float)) != 0;
    }
  }
  EXPECT_EQ(differ, 0) << "consolidated adapter elements differ from the ranks' shards";
}

TEST(TrainerFinetuneDp, LoraTensorParallelMatchesOneProcess) {
  check_lora_tp(false);
}
TEST(TrainerFinetuneDp, LoraTensorAndSequenceParallelMatchesOneProcess) {
  check_lora_tp(true);
}
// With dropout: a row-parallel layer's shard draws the mask of its global input columns.
TEST(TrainerFinetuneDp, LoraDropoutTensorParallelMatchesOneProcess) {
  check_lora_tp(false, 0.2);
}
// ZeRO-3 with TP (x DP=2 on 4 ranks): each TP shard of the base sharded over its DP group.
TEST(TrainerFinetuneDp, LoraTensorParallelZero3MatchesOneProcess) {
  check_lora_tp(false, 0, 3);
}

// LoRA under pipeline parallelism (x DP=2 on 4 ranks), with dropout: each stage adapts the
// layers it holds, the schedule's micro-batches key the masks; one process's losses, gradient
// norms and adapters (each rank's, by name).
void check_lora_pp(int zero) {
  const int D = W().size() / 2, A = 2, steps = 6;
  const std::string base = make_base();
  auto self = comm::make_self_communicator();
  Trainer ref(lora_config(runs.dir("lora_pp_ref"), base, steps, A * D, 0.2), self.get());
  Config c = lora_config(runs.dir("lora_pp"), base, steps, A, 0.2);
  c.set("parallel.pp", "2", "test");
  c.set("parallel.pp_schedule", "\"1f1b\"", "test");
  c.set("parallel.zero", std::to_string(zero), "test");
  Trainer t(c);
  ASSERT_NE(t.pipeline(), nullptr);
  EXPECT_EQ(t.base_shards() != nullptr, zero == 3);
  expect_steps_like(ref, t, steps);
  const ParamSet &pa = ref.lora()->params(), &pb = t.lora()->params();
  EXPECT_LT(pb.total(), pa.total());  // this stage's layers only
  double worst = 0, largest = 0;
  for (const ParamInfo& p : pb.infos()) {
    const ParamInfo& q = pa.info(p.name);
    ASSERT_EQ(q.numel, p.numel) << p.name;
    for (int64_t i = 0; i < p.numel; ++i) {
      worst = std::max(worst, double(std::abs(pa.data()[q.offset + i] - pb.data()[p.offset + i])));
      largest = std::max(largest, double(std::abs(pa.data()[q.offset + i])));
    }
  }
  EXPECT_LT(worst, 1e-4 * largest) << "adapters differ from one process's";
  if (zero == 3) {  // every block of the stage's base released after its last use
    const ParamSet& mine = t.model().params();
    std::vector<char> resident(size_t(mine.total()), 0);
    for (auto [lo, hi] : t.base_shards()->resident_ranges())
      for (int64_t i = lo; i < hi; ++i) resident[size_t(i)] = 1;
    int64_t left = 0, blocks = 0;
    for (const ParamInfo& p : mine.infos())
      for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
        if (!resident[size_t(i)]) {
          ++blocks;
          left += mine.data()[i] != 0.f;
        }
    EXPECT_GT(blocks, 0);
    EXPECT_EQ(left, 0) << "block weights of the stage left gathered after the step";
  }
}

TEST(TrainerFinetuneDp, LoraPipelineParallelMatchesOneProcess) {
  check_lora_pp(0);
}
// ZeRO-3 under the pipeline: the stage's base blocks gathered and released around every use,
// in the schedule's order (x DP=2 on 4 ranks).
TEST(TrainerFinetuneDp, LoraPipelineParallelZero3MatchesOneProcess) {
  check_lora_pp(3);
}

// A LoRA pipeline run resumes from its per-rank checkpoints (each stage's adapters, dropout on)
// bit-identically, and `loom ckpt consolidate` gathers the stages' adapters into one process's.
TEST(TrainerFinetuneDp, LoraPipelineResumesBitIdenticallyAndConsolidates) {
  const std::string base = make_base();
  const std::string shared = testing::TempDir() + "/loom_ftdp_lora_pp_" + job_tag();
  if (W().rank() == 0) remove_all(shared);
  W().barrier();
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      W().barrier();
      if (W().rank() == 0) remove_all(path);
    }
  } cleanup{shared};
  auto cfg = [&](const std::string& name, const std::string& out) {
    Config c = lora_config(runs.dir(name), base, 6, 2, 0.2);
    c.set("parallel.pp", "2", "test");
    if (!out.empty()) c.set("train.out_dir", "\"" + out + "\"", "test");
    return c;
  };
  const Config split = cfg("lora_pp_split", shared + "/run");
  testing_parallel::expect_resume_bit_identical(cfg("lora_pp_straight", ""), split, split,
                                                "LoRA PP: ");
  int64_t ok = 1;
  if (W().rank() == 0) {
    try {
      ckpt::ConsolidateResult r = ckpt::consolidate({shared + "/run", shared + "/one"});
      EXPECT_EQ(r.replica_mismatches, 0);
      const ckpt::Checkpoint one(shared + "/one");
      EXPECT_TRUE(one.state().extra.contains("lora"));
      // Every layer's adapters are there (both stages'), for merge / export / serve.
      for (const char* name : {"blocks.0.attn.qkv.lora_A", "blocks.1.mlp.proj.lora_B"})
        EXPECT_TRUE(one.model().contains(name)) << name;
    } catch (const Error& e) {
      ADD_FAILURE() << "consolidate: " << e.what();
      ok = 0;
    }
  }
  W().all_reduce_scalar(-ok, comm::ReduceOp::Max);  // every rank waits for rank 0
}

// What LoRA cannot run under yet is refused by name, on every rank alike.
TEST(TrainerFinetuneDp, LoraRefusesExpertParallelism) {
  const std::string base = make_base();
  auto refused = [](const Config& c, const std::string& words) {
    try {
      Trainer t(c);
      ADD_FAILURE() << "accepted; expected an error with: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  Config ep = lora_config(runs.dir("lora_bad_ep"), base, 2, 1);
  ep.set("model.preset", "\"tiny-moe\"", "test");
  ep.set("parallel.ep", "2", "test");
  refused(ep, "LoRA under expert parallelism");
}

// LoRA under context parallelism (x DP=2 on 4 ranks), with dropout: each rank runs its chunks
// of every sequence, the adapters' gradients are reduced over DP x CP, and a token's dropout
// mask is drawn by its row in the whole micro-batch (CpShard::global_rows).
TEST(TrainerFinetuneDp, LoraContextParallelMatchesOneProcess) {
  const int D = W().size() / 2, A = 2, steps = 6;
  const std::string base = make_base();
  auto self = comm::make_self_communicator();
  Trainer ref(lora_config(runs.dir("lora_cp_ref"), base, steps, A * D, 0.2), self.get());
  Config c = lora_config(runs.dir("lora_cp"), base, steps, A, 0.2);
  c.set("parallel.cp", "2", "test");
  c.set("parallel.zero", "1", "test");
  Trainer t(c);
  ASSERT_EQ(t.groups()->cp().size(), 2);
  expect_steps_like(ref, t, steps);
  expect_same_adapters(ref.lora()->params(), t.lora()->params());
}

// Byte tokenizer with ChatML markers and preference pairs (chosen: the reversed word; rejected:
// "zzzz"), written by every rank into its own directory.
std::string dpo_data(const std::string& d) {
  data::save_loom_tokenizer(data::byte_chatml_tokenizer(), d + "/tok");
  std::string text;
  for (int i = 0; i < 64; ++i) {
    std::string w;
    for (int k = 0; k < 4; ++k) w += char('a' + int(uniform_at(5, uint64_t(i), uint64_t(k)) * 6));
    text += "{\"prompt\": \"rev " + w + "\", \"chosen\": \"" + std::string(w.rbegin(), w.rend()) +
            "\", \"rejected\": \"zzzz\"}\n";
  }
  write_file_atomic(d + "/pairs.jsonl", text);
  return d;
}

Config dpo_config(const std::string& data, const std::string& out, int steps, int grad_accum) {
  Config c = Config::parse(
      "[model]\npreset = \"tiny-llama\"\nn_layer = 2\nd_model = 32\nn_head = 4\nn_kv_head = 2\n"
      "d_ff = 64\nvocab = 260\nmax_seq = 48\ninit_std = 0.1\n"
      "[data]\nsource = \"preference\"\nvalid_fraction = 0.2\n"
      "[train]\nmode = \"dpo\"\nmicro_batch = 2\nseq_len = 48\nquiet = true\npeak_gflops = 100\n"
      "[optim]\nlr = 3e-3\nwarmup_steps = 2\nweight_decay = 0.0\n[dpo]\nbeta = 0.5\n"
      "[parallel]\nbucket_mb = 0.01\n",
      "test.toml");
  c.set("data.path", "\"" + data + "/pairs.jsonl\"", "test");
  c.set("data.tokenizer", "\"loom:" + data + "/tok\"", "test");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.grad_accum", std::to_string(grad_accum), "test");
  c.set("train.out_dir", "\"" + out + "\"", "test");
  return c;
}

double extra(const StepResult& r, const std::string& key) {
  for (const auto& [k, v] : r.extra)
    if (k == key) return v;
  ADD_FAILURE() << "no " << key << " in the step's figures";
  return NAN;
}

// What DPO cannot run under yet is refused by name, on every rank alike: expert parallelism,
// and pipeline with context parallelism at once (4 ranks).
TEST(TrainerFinetuneDp, DpoRefusesExpertAndPipelineWithContextParallelism) {
  const std::string data = dpo_data(runs.dir("dpo_bad_data"));
  auto refused = [](const Config& c, const std::string& words) {
    try {
      Trainer t(c);
      ADD_FAILURE() << "accepted; expected an error with: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  Config ep = dpo_config(data, runs.dir("dpo_bad_ep") + "/run", 2, 1);
  ep.set("model.preset", "\"tiny-llama-moe\"", "test");
  ep.set("parallel.ep", "2", "test");
  refused(ep, "DPO under expert parallelism");
  if (W().size() % 4 == 0) {
    Config ppcp = dpo_config(data, runs.dir("dpo_bad_ppcp") + "/run", 2, 2);
    ppcp.set("parallel.pp", "2", "test");
    ppcp.set("parallel.cp", "2", "test");
    refused(ppcp, "DPO under pipeline and context parallelism at once");
  }
}

// `lora_base`: empty for full DPO, else a checkpoint that LoRA adapts. tp > 1: tensor
// parallelism (with sequence parallelism when sp), DP over the remaining ranks.
void check_dpo_parity(int zero, const std::string& lora_base, int tp = 1, bool sp = false,
                      double lora_dropout = 0, int cp = 1, int pp = 1) {
  const int model_ranks = tp * cp * pp;
  if (W().size() % model_ranks != 0) GTEST_SKIP() << "needs a multiple of " << model_ranks;
  const int D = W().size() / model_ranks, A = 2, steps = 6;
  const std::string data = dpo_data(runs.dir("dpo_data"));
  auto adapt = [&](Config c) {
    if (!lora_base.empty()) {
      c.set("train.pretrained", "\"" + lora_base + "\"", "test");
      c.set("lora.rank", "4", "test");
      c.set("optim.lr", "1e-2", "test");
      if (lora_dropout > 0) c.set("lora.dropout", std::to_string(lora_dropout), "test");
    }
    c.set("train.eval_interval", "100", "test");  // held-out pairs for evaluate()
    return c;
  };
  auto self = comm::make_self_communicator();
  Trainer ref(adapt(dpo_config(data, runs.dir("dpo_ref") + "/run", steps, A * D)), self.get());
  Config c = adapt(dpo_config(data, runs.dir("dpo_dp") + "/run", steps, A));
  c.set("parallel.zero", std::to_string(zero), "test");
  c.set("parallel.tp", std::to_string(tp), "test");
  c.set("parallel.sp", sp ? "true" : "false", "test");
  c.set("parallel.cp", std::to_string(cp), "test");
  c.set("parallel.pp", std::to_string(pp), "test");
  if (pp > 1) c.set("parallel.pp_schedule", "\"1f1b\"", "test");
  Trainer t(c);
  ASSERT_TRUE(t.distributed());
  ASSERT_EQ(t.groups()->tp().size(), tp);
  ASSERT_EQ(t.groups()->cp().size(), cp);
  ASSERT_EQ(t.pipeline() != nullptr, pp > 1);
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    const StepResult a = ref.train_step(), b = t.train_step();
    losses.push_back(b.loss);
    expect_step_like(a, b, i);
    for (const char* k : {"rewards_chosen", "rewards_rejected", "reward_accuracy"})
      EXPECT_NEAR(extra(b, k), extra(a, k), 1e-5 + 1e-4 * std::abs(extra(a, k)))
          << k << ", step " << i;
  }
  EXPECT_LT(losses.back(), losses.front());
  // Evaluation (no dropout): the held-out pairs' DPO loss, reward accuracy and margin.
  const double ea = ref.evaluate(), eb = t.evaluate();
  EXPECT_LT(rel_diff(eb, ea), 1e-5) << "evaluation: " << eb << " vs " << ea;
  ASSERT_EQ(t.last_eval_extra().size(), ref.last_eval_extra().size());
  for (size_t i = 0; i < ref.last_eval_extra().size(); ++i)
    EXPECT_NEAR(t.last_eval_extra()[i].second, ref.last_eval_extra()[i].second,
                1e-5 + 1e-4 * std::abs(ref.last_eval_extra()[i].second))
        << ref.last_eval_extra()[i].first;
}

TEST(TrainerFinetuneDp, DpoZero1MatchesOneProcess) {
  check_dpo_parity(1, "");
}

// The base of a LoRA DPO run: a few full DPO steps in one process (any weights of this model
// would do).
std::string dpo_base() {
  const std::string data = dpo_data(runs.dir("dpo_base_data"));
  const std::string base = runs.dir("dpo_base");
  {
    auto self = comm::make_self_communicator();
    Trainer t(dpo_config(data, base + "/run", 2, 1), self.get());
    t.run();
  }
  return base + "/run/checkpoints";
}

TEST(TrainerFinetuneDp, DpoWithLoraZero0MatchesOneProcess) {
  check_dpo_parity(0, dpo_base());
}

// ZeRO-3: the policy sharded by the engine, the reference (full DPO: a second model, sharded
// the same way; LoRA: the base) by parallel::FrozenShards.
TEST(TrainerFinetuneDp, DpoZero3MatchesOneProcess) {
  check_dpo_parity(3, "");
}
TEST(TrainerFinetuneDp, DpoWithLoraZero3MatchesOneProcess) {
  check_dpo_parity(3, dpo_base());
}
// With TP (x DP=2 on 4 ranks): each TP shard of policy and reference sharded over its DP group.
TEST(TrainerFinetuneDp, DpoTensorParallelZero3MatchesOneProcess) {
  check_dpo_parity(3, "", 2);
}

// Full DPO at ZeRO-3 from a weights-only checkpoint (as `loom ckpt import` writes): the sharded
// reference is those weights (policy = reference: the first loss is log 2), and a resumed run
// reads its pieces from that checkpoint again (it continues the straight run bit for bit).
TEST(TrainerFinetuneDp, DpoZero3ReferenceIsInitFromWeightsAfterResume) {
  const std::string data = dpo_data(runs.dir("dpo_z3_data"));
  const std::string weights = runs.dir("dpo_z3_weights") + "/ckpt";
  {
    auto self = comm::make_self_communicator();
    const std::string base = runs.dir("dpo_z3_base");
    Trainer t(dpo_config(data, base + "/run", 2, 1), self.get());
    t.run();
    ckpt::Checkpoint c(base + "/run/checkpoints");
    ckpt::TrainerState st;
    st.config_text = c.state().config_text;
    ckpt::save_checkpoint(weights, st, c.model().load_all(), ckpt::TensorMap{});
  }
  auto cfg = [&](const std::string& name) {
    Config c = dpo_config(data, runs.dir(name) + "/run", 6, 1);
    c.set("parallel.zero", "3", "test");
    c.set("train.init_from", "\"" + weights + "\"", "test");
    return c;
  };
  {
    Trainer t(cfg("dpo_z3_first"));
    EXPECT_NEAR(t.train_step().loss, std::log(2.0), 1e-6);
  }
  const Config split = cfg("dpo_z3_split");
  testing_parallel::expect_resume_bit_identical(cfg("dpo_z3_straight"), split, split, "DPO: ");
}

// DPO under tensor parallelism: the reference model is split like the policy, the sequence
// log-probabilities come from the vocabulary-parallel cross-entropy (every TP rank holds each
// token's whole value), and the per-token DPO weights reach the same backward. On 4 ranks also
// x DP=2.
TEST(TrainerFinetuneDp, DpoTensorParallelMatchesOneProcess) {
  check_dpo_parity(1, "", 2);
}
TEST(TrainerFinetuneDp, DpoTensorAndSequenceParallelMatchesOneProcess) {
  check_dpo_parity(0, "", 2, true);
}
TEST(TrainerFinetuneDp, DpoWithLoraTensorAndSequenceParallelMatchesOneProcess) {
  check_dpo_parity(1, dpo_base(), 2, true, 0.1);
}

// DPO under pipeline parallelism: the reference's and the policy's forward-only passes through
// the stages, the DPO terms on the last stage, then the training schedule with its per-token
// weights. Full DPO at ZeRO-1 and LoRA DPO with dropout; x DP=2 on 4 ranks.
TEST(TrainerFinetuneDp, DpoPipelineParallelMatchesOneProcess) {
  check_dpo_parity(1, "", 1, false, 0, 1, 2);
}
TEST(TrainerFinetuneDp, DpoWithLoraPipelineParallelMatchesOneProcess) {
  check_dpo_parity(0, dpo_base(), 1, false, 0.1, 1, 2);
}
// ZeRO-3 under the pipeline: policy and reference stages both sharded over their DP group.
TEST(TrainerFinetuneDp, DpoPipelineParallelZero3MatchesOneProcess) {
  check_dpo_parity(3, "", 1, false, 0, 1, 2);
}

// DPO under context parallelism: each CP rank runs its chunks of every pair, the sequence
// log-probabilities are summed over the CP group, and the gradients over DP x CP. Full DPO at
// ZeRO-1, LoRA DPO (with dropout, masks by micro-batch rows) at ZeRO-0; x DP=2 on 4 ranks.
TEST(TrainerFinetuneDp, DpoContextParallelMatchesOneProcess) {
  check_dpo_parity(1, "", 1, false, 0, 2);
}
TEST(TrainerFinetuneDp, DpoWithLoraContextParallelMatchesOneProcess) {
  check_dpo_parity(0, dpo_base(), 1, false, 0.1, 2);
}

}  // namespace

LOOM_MPI_TEST_MAIN()
