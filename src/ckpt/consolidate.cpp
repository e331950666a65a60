#include "ckpt/consolidate.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/model_loader.h"
#include "ckpt/reshard.h"
#include "comm/process_groups.h"
#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "precision/policy.h"

namespace loom::ckpt {

namespace fs = std::filesystem;

namespace {

std::string join(const std::string& a, const std::string& b) {
  return (fs::path(a) / b).string();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) s += cat(i ? ", " : "", ranks[i]);
  if (ranks.size() > 16) s += cat(" and ", ranks.size() - 16, " more");
  return s;
}

// The directory holding rank_NNNNN/: the run's checkpoints/ or the path itself.
std::string ranks_root(const std::string& input) {
  const std::string nested = join(input, "checkpoints");
  const std::string root = fs::is_directory(join(nested, rank_dir_name(0))) ? nested : input;
  if (fs::is_directory(join(root, rank_dir_name(0)))) return root;
  LOOM_CHECK(!fs::exists(join(root, "latest")) && !fs::exists(join(nested, "latest")), input,
             ": this is a one-process checkpoint already (no rank_NNNNN directories); use it "
             "directly");
  fail(input, ": no distributed checkpoint here (expected ", rank_dir_name(0), " under ", input,
       " or ", nested, ")");
}

std::string step_dir(const std::string& root, int rank, int64_t step) {
  return join(join(root, rank_dir_name(rank)), step_dir_name(step));
}

std::string layout_of(const TrainerState& st, const std::string& where) {
  LOOM_CHECK(st.extra.contains("layout"), where,
             ": state.json has no extra \"layout\": not a distributed checkpoint");
  return st.extra.at("layout").as_string();
}

// Ranks of [0, world) without a committed directory for `step`.
std::vector<int> ranks_missing(const std::string& root, int world, int64_t step) {
  std::vector<int> missing;
  for (int r = 0; r < world; ++r)
    if (!fs::is_directory(step_dir(root, r, step))) missing.push_back(r);
  return missing;
}

// The requested step, or the newest step of rank 0 that every rank of its layout committed.
int64_t choose_step(const std::string& root, int64_t requested) {
  const auto steps = list_checkpoint_steps(join(root, rank_dir_name(0)));
  LOOM_CHECK(!steps.empty(), join(root, rank_dir_name(0)), ": no committed checkpoint");
  std::vector<int64_t> candidates;
  if (requested >= 0) {
    LOOM_CHECK(std::find(steps.begin(), steps.end(), requested) != steps.end(), root,
               ": rank 0 has no checkpoint of step ", requested, " (it has steps ", steps.front(),
               "..", steps.back(), ")");
    candidates = {requested};
  } else {
    candidates.assign(steps.rbegin(), steps.rend());
  }
  std::string first_problem;
  for (int64_t s : candidates) {
    const std::string where = step_dir(root, 0, s);
    Checkpoint c0(where);
    const int world = DistributedLayout::parse(layout_of(c0.state(), where)).world();
    auto missing = ranks_missing(root, world, s);
    if (missing.empty()) return s;
    const std::string problem = cat("step ", s, " is missing from rank(s) ", rank_list(missing),
                                    " of ", world, " under ", root);
    if (first_problem.empty()) first_problem = problem;
    if (requested < 0) log_warn("consolidate: ", problem, "; trying an older step");
  }
  fail(requested >= 0 ? first_problem
                      : cat("no step was committed by every rank: ", first_problem));
}

// Where the stored tensors go: the one-process model's parameters and AdamW's state.
struct Destination {
  Tensor tensor;
  std::string param;  // the parameter it belongs to
};

struct Piece {
  int rank;
  int64_t offset, length;  // flat range within the destination
  const float* data;
};

// Every piece of one destination tensor, then placed with coverage and replica checks.
struct Placement {
  std::map<std::string, Destination> dst;
  std::map<std::string, std::vector<Piece>> pieces;
  std::vector<std::string> problems;
  int64_t mismatches = 0;

  void problem(std::string p) {
    if (problems.size() < 20) problems.push_back(std::move(p));
  }
};

// The destination name of a stored optimizer tensor, "" when the one-process optimizer keeps no
// such state (the fp32 master weights of a ZeRO-3 run whose policy has none: they equal the
// model's weights, placed from model.safetensors).
std::string optim_destination(const std::string& name, bool has_master) {
  return name.rfind("master.", 0) == 0 && !has_master ? std::string() : name;
}

// The local elements [begin, begin + n) of parameter `p` (data holds them) as pieces of the
// global tensor: one per run of consecutive global elements (model/params.h, global_row_first).
void add_mapped(std::vector<Piece>& out, int rank, const ParamInfo& p, int64_t begin, int64_t n,
                const float* data) {
  for_each_global_run(p, begin, n, [&](int64_t local, int64_t global, int64_t len) {
    const float* src = data + (local - begin);
    Piece* last = out.empty() ? nullptr : &out.back();
    if (last && last->rank == rank && last->data + last->length == src &&
        last->offset + last->length == global)
      last->length += len;
    else
      out.push_back({rank, global, len, src});
  });
}

// `local`: the rank's parameters as its model built them (their local shapes and where they
// sit in the global tensors).
void add_pieces(Placement& pl, const SafetensorsReader& file, int rank, const ParamSet& local,
                bool optim, bool has_master) {
  for (const auto& e : file.entries()) {
    const std::string name = optim ? optim_destination(e.name, has_master) : e.name;
    if (name.empty()) continue;
    auto it = pl.dst.find(name);
    if (it == pl.dst.end()) {
      pl.problem(cat(file.path(), ": tensor '", e.name, "' is not in the model"));
      continue;
    }
    if (e.dtype != DType::F32) {
      pl.problem(
          cat(file.path(), ": tensor '", e.name, "' is ", dtype_name(e.dtype), ", expected F32"));
      continue;
    }
    if (!local.has(it->second.param)) {
      pl.problem(cat(file.path(), ": tensor '", e.name, "' is not in this rank's model"));
      continue;
    }
    const ParamInfo& info = local.info(it->second.param);
    // The stored piece as a flat range of the rank's local parameter (ZeRO >= 1: a slice).
    const int64_t n = numel_of(e.shape);
    int64_t whole = n, offset = 0;
    if (e.shard.sharded() && !flat_range(e.shard, e.shape, &whole, &offset)) {
      pl.problem(cat(file.path(), ": tensor '", e.name, "' ", shape_str(e.shape), " at offset ",
                     shape_str(e.shard.global_offset), " of global shape ",
                     shape_str(e.shard.global_shape),
                     " is not a contiguous range of the flattened tensor"));
      continue;
    }
    const int64_t want = it->second.tensor.numel();
    if (whole != info.numel || global_numel(info) != want) {
      pl.problem(cat(file.path(), ": tensor '", e.name, "' is a piece of ", whole,
                     " elements, the rank's parameter has ", info.numel, " (", global_numel(info),
                     " in the whole tensor), the model's has ", want));
      continue;
    }
    if (offset < 0 || offset + n > whole) {
      pl.problem(cat(file.path(), ": tensor '", e.name, "' at offset ", offset, " with ", n,
                     " elements overruns its ", whole));
      continue;
    }
    add_mapped(pl.pieces[name], rank, info, offset, n, file.view(e.name).data<float>());
  }
}

// Copies one destination's pieces in (offset, rank) order: a gap is an error; elements held
// twice (replicas) keep the first copy, and differing copies are counted.
void place(Placement& pl, const std::string& name, std::vector<Piece>& pieces) {
  float* out = pl.dst.at(name).tensor.data<float>();
  const int64_t n = pl.dst.at(name).tensor.numel();
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.rank < b.rank;
  });
  int64_t covered = 0, differing = 0;
  for (const Piece& p : pieces) {
    if (p.offset > covered) break;
    const int64_t end = p.offset + p.length, seen = std::min(end, covered);
    if (seen > p.offset &&
        std::memcmp(out + p.offset, p.data, sizeof(float) * (seen - p.offset)) != 0) {
      for (int64_t i = p.offset; i < seen; ++i)
        differing += std::memcmp(out + i, p.data + (i - p.offset), sizeof(float)) != 0;
    }
    if (end > covered) {
      std::memcpy(out + covered, p.data + (covered - p.offset), sizeof(float) * (end - covered));
      covered = end;
    }
  }
  if (covered < n) {
    std::vector<int> holders;
    for (const Piece& p : pieces) holders.push_back(p.rank);
    std::sort(holders.begin(), holders.end());
    holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
    pl.problem(cat("tensor '", name, "': elements [", covered, ", ", n, ") of ", n,
                   " are on no rank", holders.empty() ? "" : " (pieces from rank(s) ",
                   rank_list(holders), holders.empty() ? "" : ")"));
  }
  if (differing > 0) {
    log_warn("consolidate: tensor '", name, "': ", differing,
             " elements differ between replicas; the lowest rank's copy was taken");
    pl.mismatches += differing;
  }
}

// Every rank's checkpoint must be of the same model, precision, layout and step as rank 0's.
void check_same_run(const Checkpoint& c0, const Checkpoint& c, int rank) {
  auto text = [](const Checkpoint& k, const char* key) {
    return k.state().extra.contains(key) ? k.state().extra.at(key).dump() : std::string("-");
  };
  LOOM_CHECK(c.state().step == c0.state().step, c.dir(), ": step ", c.state().step, ", rank 0 has ",
             c0.state().step);
  // Ranks may differ in per-host paths (data, output); rank 0's config is the one recorded.
  if (c.state().config_text != c0.state().config_text)
    log_warn("consolidate: ", c.dir(),
             ": the run's config text differs from rank 0's; keeping "
             "rank 0's");
  for (const char* key : {"model_fingerprint", "precision", "layout", "optimizer_steps"})
    LOOM_CHECK(text(c, key) == text(c0, key), c.dir(), ": extra \"", key, "\" is ", text(c, key),
               ", rank 0 has ", text(c0, key));
  if (c.state().extra.contains("rank"))
    LOOM_CHECK(c.state().extra.at("rank").as_int() == rank, c.dir(), ": written by rank ",
               c.state().extra.at("rank").as_int(), ", found under ", rank_dir_name(rank));
}

// Rank 0's state without the distributed keys: what a one-process run records.
TrainerState one_process_state(const TrainerState& s0, const std::string& layout, int ranks) {
  TrainerState st = s0;
  st.fingerprint.clear();  // recomputed from the whole tensors on save
  st.extra = Json::object();
  for (const auto& [key, value] : s0.extra.as_object())
    if (key != "layout" && key != "rank") st.extra[key] = value;
  st.extra["consolidated_from"] = layout;  // the distributed layout (DistributedLayout::parse)
  st.extra["consolidated_ranks"] = static_cast<int64_t>(ranks);
  return st;
}

// A communicator that only names a group's size and rank: enough to build a rank's model for
// its parameters' layout (no collective runs while consolidating).
class LayoutOnlyCommunicator : public comm::Communicator {
 public:
  LayoutOnlyCommunicator(int size, int rank) : size_(size), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int world_rank_of(int r) const override { return r; }
  std::string name() const override { return "layout-only"; }
  comm::Work all_reduce_async(void*, int64_t, DType, comm::ReduceOp) override { refuse(); }
  comm::Work reduce_scatter_async(const void*, void*, const std::vector<int64_t>&, DType,
                                  comm::ReduceOp) override {
    refuse();
  }
  comm::Work all_gather_async(void*, const std::vector<int64_t>&, DType) override { refuse(); }
  comm::Work reduce_scatter_bf16_async(const uint16_t*, float*,
                                       const std::vector<int64_t>&) override {
    refuse();
  }
  comm::Work broadcast_async(void*, int64_t, DType, int) override { refuse(); }
  comm::Work send_async(const void*, int64_t, DType, int, int) override { refuse(); }
  comm::Work recv_async(void*, int64_t, DType, int, int) override { refuse(); }
  comm::Work all_to_all_async(const void*, void*, int64_t, DType) override { refuse(); }
  void barrier() override { refuse(); }
  void all_reduce_f64(double*, int64_t, comm::ReduceOp) override { refuse(); }
  std::unique_ptr<Communicator> split(int, int, const std::string&) override { refuse(); }

 private:
  [[noreturn]] static void refuse() {
    fail("consolidate: a layout-only communicator ran a collective");
  }
  int size_, rank_;
};

// The model each rank built, by its (TP, EP) coordinates: its parameters' local shapes and
// global placement (pipeline stages hold subsets of the same parameters, so the whole model
// stands for every stage). Values are untouched pages, so no memory is used.
// A LoRA run's checkpoints hold adapters only: then the adapters' parameters (split like their
// layers under TP, model/lora.h) are what is placed.
class RankModels {
 public:
  RankModels(const ModelConfig& cfg, const DistributedLayout& layout,
             const std::optional<LoraConfig>& lora)
      : cfg_(cfg), layout_(layout), lora_(lora) {}
  const ParamSet& params(const comm::RankCoords& c) {
    auto& slot = models_[{c.tp, c.ep}];
    if (!slot.model) {
      slot.tp_comm = std::make_unique<LayoutOnlyCommunicator>(layout_.tp, c.tp);
      slot.ep_comm = std::make_unique<LayoutOnlyCommunicator>(layout_.ep, c.ep);
      TensorParallel tp;
      tp.size = layout_.tp;
      tp.rank = c.tp;
      tp.comm = layout_.tp > 1 ? slot.tp_comm.get() : nullptr;
      ExpertParallel ep;
      ep.size = layout_.ep;
      ep.rank = c.ep;
      ep.comm = layout_.ep > 1 ? slot.ep_comm.get() : nullptr;
      slot.model =
          std::make_unique<Decoder>(cfg_, cpu_backend(), Recompute::None, DType::F32, tp, ep);
      if (lora_) slot.lora = std::make_unique<Lora>(*slot.model, *lora_);
    }
    return slot.lora ? slot.lora->params() : slot.model->params();
  }

 private:
  struct Slot {
    std::unique_ptr<LayoutOnlyCommunicator> tp_comm, ep_comm;
    std::unique_ptr<Decoder> model;
    std::unique_ptr<Lora> lora;
  };
  ModelConfig cfg_;
  DistributedLayout layout_;
  std::optional<LoraConfig> lora_;
  std::map<std::pair<int, int>, Slot> models_;
};

}  // namespace

DistributedLayout DistributedLayout::parse(const std::string& text) {
  DistributedLayout l;
  std::istringstream in(text);
  std::string item;
  std::map<std::string, int*> fields = {{"tp", &l.tp}, {"cp", &l.cp}, {"dp", &l.dp},
                                        {"pp", &l.pp}, {"ep", &l.ep}, {"zero", &l.zero}};
  while (in >> item) {
    const size_t eq = item.find('=');
    LOOM_CHECK(eq != std::string::npos && eq > 0, "layout '", text, "': malformed entry '", item,
               "'");
    auto it = fields.find(item.substr(0, eq));
    if (it == fields.end()) continue;  // sp, vp, stages: no bearing on placement
    try {
      *it->second = std::stoi(item.substr(eq + 1));
    } catch (const std::exception&) {
      fail("layout '", text, "': '", item, "' is not a number");
    }
  }
  LOOM_CHECK(l.tp > 0 && l.cp > 0 && l.dp > 0 && l.pp > 0 && l.ep > 0 && l.dp % l.ep == 0,
             "layout '", text, "': sizes must be positive and ep must divide dp");
  return l;
}

ConsolidateResult consolidate(const ConsolidateOptions& opt) {
  LOOM_CHECK(!opt.out.empty(), "consolidate: no output directory");
  const std::string root = ranks_root(opt.input);
  const int64_t step = choose_step(root, opt.step);

  // Every rank's checkpoint of that step, of one run and layout.
  std::vector<std::unique_ptr<Checkpoint>> ranks;
  ranks.push_back(std::make_unique<Checkpoint>(step_dir(root, 0, step)));
  const Checkpoint& c0 = *ranks[0];
  const std::string layout_text = layout_of(c0.state(), c0.dir());
  const DistributedLayout layout = DistributedLayout::parse(layout_text);
  for (int r = 1; r < layout.world(); ++r) {
    ranks.push_back(std::make_unique<Checkpoint>(step_dir(root, r, step)));
    check_same_run(c0, *ranks.back(), r);
  }

  // The one-process model and optimizer state, to be filled.
  const SavedModel saved = saved_model_of(c0);
  const Config& cfg = saved.config;
  const int64_t etp = cfg.get_int("parallel.etp", 1);
  LOOM_CHECK(etp == 1, c0.dir(), ": the run splits its experts with expert tensor parallelism ",
             "(parallel.etp = ", etp, "), whose shards consolidation does not place yet ",
             "(docs/parallel.md, \"Not done yet\"): cannot consolidate");
  Decoder model(saved.model, cpu_backend());
  const std::string model_fp = c0.state().extra.contains("model_fingerprint")
                                   ? c0.state().extra.at("model_fingerprint").as_string()
                                   : std::string();
  LOOM_CHECK(model_fp == model.config().fingerprint(), c0.dir(), ": recorded model '", model_fp,
             "' differs from the config's '", model.config().fingerprint(), "'");
  const PrecisionPolicy policy = precision_from_name(
      c0.state().extra.contains("precision") ? c0.state().extra.at("precision").as_string()
                                             : std::string("fp32"));
  const bool has_master = policy.compute != DType::F32;  // as AdamW keeps them
  // A LoRA run: its adapters, over the one-process model (the base is train.pretrained's).
  std::optional<LoraConfig> lora_cfg;
  std::unique_ptr<Lora> lora;
  if (c0.state().extra.contains("lora")) {
    lora_cfg = lora_config_from(cfg, 0);
    lora = std::make_unique<Lora>(model, *lora_cfg);
  }
  ParamSet& whole = lora ? lora->params() : model.params();
  Placement model_pl, optim_pl;
  TensorMap optim;
  for (const auto& [name, t] : whole.tensors("checkpoint consolidation")) {
    model_pl.dst[name] = {t, name};
    for (const char* prefix : {"exp_avg.", "exp_avg_sq.", "master."}) {
      if (std::strcmp(prefix, "master.") == 0 && !has_master) continue;
      Tensor state = Tensor::zeros(t.shape());
      optim[prefix + name] = state;
      optim_pl.dst[prefix + name] = {state, name};
    }
  }

  const comm::RankGenerator gen(
      layout.world(), comm::ParallelDims{layout.tp, layout.cp, layout.ep, layout.dp, layout.pp});
  RankModels rank_models(model.config(), layout, lora_cfg);
  for (int r = 0; r < layout.world(); ++r) {
    const ParamSet& local = rank_models.params(gen.coords(r));
    add_pieces(model_pl, ranks[r]->model(), r, local, false, has_master);
    add_pieces(optim_pl, ranks[r]->optim(), r, local, true, has_master);
  }
  for (Placement* pl : {&model_pl, &optim_pl})
    for (auto& [name, d] : pl->dst) place(*pl, name, pl->pieces[name]);
  std::vector<std::string> problems = model_pl.problems;
  problems.insert(problems.end(), optim_pl.problems.begin(), optim_pl.problems.end());
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems) msg += "\n  " + p;
    fail(root, ": step ", step, " of layout '", layout_text,
         "' does not consolidate into whole tensors:", msg);
  }
  // The one-process model holds the weights rounded to the compute dtype; ZeRO >= 1 ranks store
  // their fp32 master slices instead (rounding values already rounded changes nothing).
  if (policy.compute != DType::F32)
    whole.backend().round_to(policy.compute, whole.data(), whole.total(), nullptr);

  const TrainerState st = one_process_state(c0.state(), layout_text, layout.world());
  const bool created = !fs::exists(opt.out);
  ConsolidateResult res;
  try {
    res.dir =
        save_checkpoint(opt.out, st, whole.tensors("saving the consolidated checkpoint"), optim);
  } catch (...) {
    if (created) remove_all(opt.out);
    throw;
  }
  res.step = step;
  res.ranks = layout.world();
  res.layout = layout_text;
  res.replica_mismatches = model_pl.mismatches + optim_pl.mismatches;
  return res;
}

}  // namespace loom::ckpt
