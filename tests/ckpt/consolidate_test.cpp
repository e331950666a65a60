// Consolidation of synthetic per-rank checkpoints: slices placed into whole tensors in the
// one-process format, the newest step every rank committed, and clear errors for missing ranks,
// missing steps, uncovered elements, pieces that do not fit a rank's tensor-parallel shard and
// expert tensor parallelism (with nothing written). tests/parallel/trainer_dp_test.cpp places
// real tensor-parallel runs.
#include "ckpt/consolidate.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <string>

#include "ckpt/checkpoint.h"
#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "model/decoder.h"
#include "test_util.h"

namespace loom::ckpt {
namespace {

using testing::ScratchDir;

const char* kConfig =
    "[model]\npreset = \"tiny\"\nn_layer = 1\nd_model = 32\nn_head = 2\nmax_seq = 16\n";

// The value every element takes in these runs: distinct per tensor, element and state kind.
float value_of(const std::string& name, int64_t i) {
  return float(std::hash<std::string>{}(name) % 1000) + 0.001f * float(i);
}

// The one-process tensors (names and shapes) these checkpoints are of.
std::map<std::string, Shape> model_shapes() {
  Decoder model(model_config_from(Config::parse(kConfig, "test")), cpu_backend());
  std::map<std::string, Shape> out;
  for (const auto& [name, t] : model.params().tensors()) out[name] = t.shape();
  return out;
}

std::string fingerprint() {
  return model_config_from(Config::parse(kConfig, "test")).fingerprint();
}

Tensor filled(const std::string& name, int64_t begin, int64_t end) {
  Tensor t = Tensor::zeros({end - begin});
  for (int64_t i = begin; i < end; ++i) t.data<float>()[i - begin] = value_of(name, i);
  return t;
}

// Writes rank `rank` of a `ranks`-way ZeRO-1 run at `step`: each tensor split in halves (rank r
// the r-th part of every flattened parameter and its moments), as DataParallel's slices are.
// `skip` names a tensor this rank leaves out.
void write_zero1_rank(const std::string& root, int rank, int ranks, int64_t step,
                      const std::string& skip = "", const std::string& layout = "",
                      const std::string& config = kConfig) {
  TensorList model, optim;
  for (const auto& [name, shape] : model_shapes()) {
    const int64_t n = numel_of(shape), per = (n + ranks - 1) / ranks;
    const int64_t a = std::min(n, rank * per), b = std::min(n, a + per);
    if (a == b) continue;
    auto add = [&](TensorList& list, const std::string& stored) {
      if (stored != skip) list.push_back({stored, filled(stored, a, b), {{n}, {a}, 0}});
    };
    add(model, name);
    add(optim, "exp_avg." + name);
    add(optim, "exp_avg_sq." + name);
  }
  TrainerState st;
  st.step = step;
  st.config_text = config;
  st.data = Json::object();
  st.data["kind"] = "byte_text";
  st.data["sample"] = step * 8;
  st.extra["model_fingerprint"] = fingerprint();
  st.extra["optimizer_steps"] = step;
  st.extra["precision"] = "fp32";
  st.extra["layout"] = layout.empty() ? cat("tp=1 sp=0 cp=1 dp=", ranks, " pp=1 zero=1") : layout;
  st.extra["rank"] = rank;
  save_checkpoint(root + "/checkpoints/" + rank_dir_name(rank), st, model, optim);
}

void write_zero1_run(const std::string& root, int ranks, int64_t step) {
  for (int r = 0; r < ranks; ++r) write_zero1_rank(root, r, ranks, step);
}

std::string error_of(const ConsolidateOptions& o) {
  try {
    consolidate(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Consolidate, PlacesZero1SlicesIntoTheOneProcessFormat) {
  ScratchDir d;
  write_zero1_run(d.path(), 3, 4);
  ConsolidateResult r = consolidate({d.path(), d / "one"});
  EXPECT_EQ(r.step, 4);
  EXPECT_EQ(r.ranks, 3);
  EXPECT_EQ(r.replica_mismatches, 0);

  Checkpoint c(d / "one");  // through `latest`, as export and generate open it
  EXPECT_EQ(c.state().step, 4);
  EXPECT_EQ(c.state().data.at("sample").as_int(), 32);
  EXPECT_EQ(c.state().extra.at("optimizer_steps").as_int(), 4);
  EXPECT_FALSE(c.state().extra.contains("layout"));
  EXPECT_FALSE(c.state().extra.contains("rank"));
  // A one-process model restores from it with its fingerprint; every element in place.
  Decoder model(model_config_from(Config::parse(kConfig, "test")), cpu_backend());
  EXPECT_EQ(c.state().fingerprint, shape_fingerprint(model.params().tensors()));
  c.restore_model(model.params().tensors(), c.state().fingerprint);
  TensorMap optim;
  for (const auto& [name, t] : model.params().tensors())
    for (const char* kind : {"exp_avg.", "exp_avg_sq."})
      optim[kind + name] = Tensor::zeros(t.shape());
  c.restore_optim(optim);  // exactly AdamW's fp32 state names and shapes: no master weights
  auto expect_values = [](const TensorMap& tensors) {
    for (const auto& [name, t] : tensors)
      for (int64_t i = 0; i < t.numel(); ++i)
        ASSERT_EQ(t.data<float>()[i], value_of(name, i)) << name << "[" << i << "]";
  };
  expect_values(model.params().tensors());
  expect_values(optim);
}

TEST(Consolidate, TakesTheNewestStepEveryRankCommitted) {
  ScratchDir d;
  write_zero1_run(d.path(), 2, 2);
  write_zero1_rank(d.path(), 0, 2, 4);  // rank 1 died before committing step 4
  EXPECT_EQ(consolidate({d.path() + "/checkpoints", d / "one"}).step, 2);
  std::string e = error_of({d.path(), d / "two", 4});
  EXPECT_NE(e.find("step 4 is missing from rank(s) 1 of 2"), std::string::npos) << e;
  EXPECT_FALSE(file_exists(d / "two"));
}

TEST(Consolidate, NamesMissingRanks) {
  ScratchDir d;
  write_zero1_run(d.path(), 3, 2);
  remove_all(d.path() + "/checkpoints/" + rank_dir_name(2));
  std::string e = error_of({d.path(), d / "one"});
  EXPECT_NE(e.find("missing from rank(s) 2 of 3"), std::string::npos) << e;
  EXPECT_FALSE(file_exists(d / "one"));
}

TEST(Consolidate, UncoveredElementsAreErrorsAndNothingIsWritten) {
  ScratchDir d;
  write_zero1_rank(d.path(), 0, 2, 2);
  write_zero1_rank(d.path(), 1, 2, 2, "exp_avg.blocks.0.mlp.fc.weight");
  std::string e = error_of({d.path(), d / "one"});
  EXPECT_NE(e.find("tensor 'exp_avg.blocks.0.mlp.fc.weight': elements [2048, 4096) of 4096 are "
                   "on no rank (pieces from rank(s) 0)"),
            std::string::npos)
      << e;
  EXPECT_FALSE(file_exists(d / "one"));
}

// Under tp = 2 each rank's QKV weight is half the rows: pieces of the whole tensor's size are not
// this rank's shard.
TEST(Consolidate, PiecesThatAreNotTheRanksTensorParallelShardAreErrors) {
  ScratchDir d;
  for (int r = 0; r < 2; ++r)
    write_zero1_rank(d.path(), r, 2, 2, "", "tp=2 sp=0 cp=1 dp=1 pp=1 zero=1");
  std::string e = error_of({d.path(), d / "one"});
  EXPECT_NE(e.find("tensor 'blocks.0.attn.qkv.weight' is a piece of 3072 elements, the rank's "
                   "parameter has 1536 (3072 in the whole tensor)"),
            std::string::npos)
      << e;
  EXPECT_FALSE(file_exists(d / "one"));
}

TEST(Consolidate, RefusesExpertTensorParallelRuns) {
  ScratchDir d;
  const std::string config = std::string(kConfig) + "[parallel]\ntp = 2\netp = 2\n";
  for (int r = 0; r < 2; ++r)
    write_zero1_rank(d.path(), r, 2, 2, "", "tp=2 sp=0 cp=1 dp=1 pp=1 zero=1", config);
  std::string e = error_of({d.path(), d / "one"});
  EXPECT_NE(e.find("expert tensor parallelism (parallel.etp = 2)"), std::string::npos) << e;
  EXPECT_FALSE(file_exists(d / "one"));
}

TEST(Consolidate, OneProcessCheckpointsAreNotConsolidated) {
  ScratchDir d;
  save_checkpoint(d / "checkpoints", TrainerState{}, TensorMap{}, TensorMap{});
  std::string e = error_of({d.path(), d / "one"});
  EXPECT_NE(e.find("one-process checkpoint already"), std::string::npos) << e;
}

TEST(Consolidate, ReplicasThatDifferKeepTheLowestRanksCopy) {
  ScratchDir d;
  // ZeRO-0: every rank holds whole tensors (replica id = its rank); rank 1's wte differs.
  for (int r = 0; r < 2; ++r) {
    TensorList model, optim;
    for (const auto& [name, shape] : model_shapes()) {
      Tensor w = filled(name, 0, numel_of(shape)).reshape(shape);
      if (r == 1 && name == "embed.wte") w.data<float>()[5] += 1.0f;
      model.push_back({name, w, {{}, {}, r}});
      for (const char* kind : {"exp_avg.", "exp_avg_sq."})
        optim.push_back({kind + name, filled(kind + name, 0, numel_of(shape)), {{}, {}, r}});
    }
    TrainerState st;
    st.step = 1;
    st.config_text = kConfig;
    st.extra["model_fingerprint"] = fingerprint();
    st.extra["optimizer_steps"] = 1;
    st.extra["precision"] = "fp32";
    st.extra["layout"] = "tp=1 sp=0 cp=1 dp=2 pp=1 zero=0";
    st.extra["rank"] = r;
    save_checkpoint(d.path() + "/checkpoints/" + rank_dir_name(r), st, model, optim);
  }
  ConsolidateResult r = consolidate({d.path(), d / "one"});
  EXPECT_EQ(r.replica_mismatches, 1);
  Checkpoint c(d / "one");
  EXPECT_EQ(c.model().view("embed.wte").data<float>()[5], value_of("embed.wte", 5));
}

TEST(Consolidate, ParsesRecordedLayouts) {
  DistributedLayout l = DistributedLayout::parse(
      "tp=1 sp=0 cp=2 dp=4 pp=3 zero=3 ep=2 vp=1 "
      "stages=1,1,1");
  EXPECT_EQ(l.cp, 2);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.pp, 3);
  EXPECT_EQ(l.ep, 2);
  EXPECT_EQ(l.zero, 3);
  EXPECT_EQ(l.world(), 24);
  EXPECT_THROW(DistributedLayout::parse("tp=x"), Error);
  EXPECT_THROW(DistributedLayout::parse("dp=3 ep=2"), Error);
}

}  // namespace
}  // namespace loom::ckpt
