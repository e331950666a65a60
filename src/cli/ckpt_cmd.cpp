// `loom ckpt`: inspect checkpoints; export to / import from Hugging Face safetensors; consolidate
// a distributed run's per-rank checkpoints into one.
#include <cstdio>

#include "ckpt/checkpoint.h"
#include "ckpt/consolidate.h"
#include "ckpt/hf_export.h"
#include "ckpt/model_bridge.h"
#include "ckpt/verify.h"
#include "cli/command.h"
#include "cli/options.h"
#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "infer/generator.h"
#include "model/decoder.h"

namespace loom::cli {

static ModelConfig model_of(const ckpt::Checkpoint& c) {
  return model_config_from(Config::parse(c.state().config_text, c.dir() + "/state.json"));
}

static int inspect(const Args& args) {
  Options o("loom ckpt inspect PATH", "Prints a checkpoint's step, model and tensors.");
  o.positional("path", "a step directory or a checkpoints root (uses latest)");
  if (!o.parse(args)) return 0;
  ckpt::Checkpoint c(o.get("path"));
  ModelConfig mc = model_of(c);
  std::printf("checkpoint %s\n  step %lld\n  model %s (%lld parameters)\n", c.dir().c_str(),
              static_cast<long long>(c.state().step), mc.fingerprint().c_str(),
              static_cast<long long>(mc.num_params()));
  for (const auto* f : {&c.model(), &c.optim()}) {
    std::printf("  %s\n", f->path().c_str());
    for (const auto& name : f->names()) {
      const auto& e = f->entry(name);
      std::printf("    %-48s %-5s %s\n", name.c_str(), dtype_name(e.dtype),
                  shape_str(e.shape).c_str());
    }
  }
  return 0;
}

static int export_cmd(const Args& args) {
  Options o("loom ckpt export PATH --out DIR [--dtype fp32|bf16|fp16]",
            "Writes the checkpoint's weights as Hugging Face safetensors with a config.json\n"
            "(GPT2LMHeadModel or LlamaForCausalLM names and layouts).");
  o.positional("path", "a step directory or a checkpoints root (uses latest)")
      .value("out", "", "output directory", true)
      .value("dtype", "fp32", "weight dtype in the exported file");
  if (!o.parse(args)) return 0;
  ckpt::Checkpoint c(o.get("path"));
  auto loaded = load_model_from_checkpoint(o.get("path"));  // LoRA adapters merged
  Decoder& model = *loaded;
  ckpt::export_hf(o.get("out"), ckpt::hf_shape_of(model.config()), model.params().tensors(),
                  dtype_from_name(o.get("dtype")));
  std::printf("exported %s -> %s\n", c.dir().c_str(), o.get("out").c_str());
  return 0;
}

static int import_cmd(const Args& args) {
  Options o("loom ckpt import HF_DIR --out ROOT",
            "Reads a Hugging Face GPT-2 or Llama model (config.json + safetensors) and writes a\n"
            "Loom checkpoint at step 0 under ROOT, usable by generate and as a training start.");
  o.positional("hf_dir", "directory with config.json and model.safetensors")
      .value("out", "", "checkpoints root to write", true);
  if (!o.parse(args)) return 0;
  ckpt::HfModel hf = ckpt::import_hf(o.get("hf_dir"));
  ModelConfig mc = ckpt::model_config_of(hf.shape);
  Decoder model(mc, cpu_backend());
  auto dst = model.params().tensors();
  for (auto& [name, t] : dst) {
    auto it = hf.params.find(name);
    LOOM_CHECK(it != hf.params.end(), o.get("hf_dir"), ": no weights for ", name);
    t.copy_from(it->second);
  }
  // The model section below reproduces the imported shape exactly for later loads.
  std::string cfg =
      cat("[model]\npreset = \"tiny\"\nfamily = \"", family_name(mc.family),
          "\"\nn_layer = ", mc.n_layer, "\nd_model = ", mc.d_model, "\nn_head = ", mc.n_head,
          "\nn_kv_head = ", mc.n_kv_head, "\nhead_dim = ", mc.head_dim, "\nd_ff = ", mc.d_ff,
          "\nvocab = ", mc.vocab, "\nmax_seq = ", mc.max_seq, "\nnorm_eps = ", mc.norm_eps,
          "\nrope_theta = ", mc.rope_theta, "\ntied = ", mc.tied ? "true" : "false",
          "\nbias = ", mc.bias ? "true" : "false", "\n");
  ckpt::TrainerState st;
  st.config_text = cfg;
  st.extra["model_fingerprint"] = mc.fingerprint();
  st.extra["imported_from"] = o.get("hf_dir");
  std::string dir = ckpt::save_checkpoint(o.get("out"), st, dst, ckpt::TensorMap{});
  std::printf("imported %s -> %s\n", o.get("hf_dir").c_str(), dir.c_str());
  return 0;
}

static int consolidate_cmd(const Args& args) {
  Options o("loom ckpt consolidate RUN_DIR --out ROOT [--step N]",
            "Places the per-rank checkpoints of a distributed run (data parallelism with ZeRO\n"
            "0-3, pipeline, context and expert parallelism; not tensor parallelism) into whole\n"
            "tensors and writes a one-process checkpoint under ROOT, which export, generate and a\n"
            "one-process train read.");
  o.positional("run_dir", "a distributed run's out_dir, or its checkpoints directory")
      .value("out", "", "checkpoints root to write", true)
      .value("step", "-1", "the step to consolidate (default: the newest every rank committed)");
  if (!o.parse(args)) return 0;
  ckpt::ConsolidateResult r =
      ckpt::consolidate({o.get("run_dir"), o.get("out"), o.get_int("step")});
  std::printf("consolidated step %lld of %d ranks (%s) -> %s\n", static_cast<long long>(r.step),
              r.ranks, r.layout.c_str(), r.dir.c_str());
  if (r.replica_mismatches > 0)
    std::printf("warning: %lld elements differed between replicas (lowest rank's copy taken)\n",
                static_cast<long long>(r.replica_mismatches));
  return 0;
}

static int verify_cmd(const Args& args) {
  Options o("loom ckpt verify PATH",
            "Checks every checkpoint of a run against its commit record (sizes and XXH64\n"
            "checksums of every tensor, header and state.json) and, for a distributed run, every\n"
            "global commit record against the ranks' parts. Prints one line per checkpoint and\n"
            "exits 1 when any fails.");
  o.positional("path", "a run directory, a checkpoints root, a rank's root or a step directory");
  if (!o.parse(args)) return 0;
  int bad = 0, total = 0;
  for (const ckpt::VerifyEntry& e : ckpt::verify_checkpoints(o.get("path"))) {
    ++total;
    if (!e.error.empty()) {
      ++bad;
      std::printf("BAD %s: %s\n", e.dir.c_str(), e.error.c_str());
    } else if (!e.note.empty()) {
      std::printf("ok  %s (step %lld; %s)\n", e.dir.c_str(), static_cast<long long>(e.step),
                  e.note.c_str());
    } else {
      std::printf("ok  %s (step %lld)\n", e.dir.c_str(), static_cast<long long>(e.step));
    }
  }
  std::fflush(stdout);
  if (bad == 0) {
    std::printf("%d checkpoints verified\n", total);
    return 0;
  }
  std::fprintf(stderr, "loom ckpt verify: %d of %d checkpoints under %s failed verification\n", bad,
               total, o.get("path").c_str());
  return 1;
}

static int merge_cmd(const Args& args) {
  Options o("loom ckpt merge PATH --out ROOT",
            "Folds a LoRA run's adapters into its base model (train.pretrained) and writes a\n"
            "whole checkpoint at step 0 under ROOT, which generate, export and training read.");
  o.positional("path", "a LoRA run's step directory or checkpoints root (uses latest)")
      .value("out", "", "checkpoints root to write", true);
  if (!o.parse(args)) return 0;
  ckpt::Checkpoint c(o.get("path"));
  LOOM_CHECK(c.state().extra.contains("lora"), c.dir(),
             ": not a LoRA checkpoint (nothing to merge)");
  auto model = load_model_from_checkpoint(o.get("path"));
  // The run's config is kept for the record (its model section rebuilds the model); the
  // missing "lora" entry makes the checkpoint a whole model.
  const Config run = Config::parse(c.state().config_text, c.dir() + "/state.json:config_text");
  ckpt::TrainerState st;
  st.config_text = c.state().config_text;
  st.extra["model_fingerprint"] = model->config().fingerprint();
  st.extra["precision"] = run.get_string("precision.policy", "fp32");
  st.extra["merged_from"] = c.dir();
  std::string dir =
      ckpt::save_checkpoint(o.get("out"), st, model->params().tensors(), ckpt::TensorMap{});
  std::printf("merged %s -> %s\n", c.dir().c_str(), dir.c_str());
  return 0;
}

int run_ckpt(const Args& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf(
        "usage: loom ckpt <inspect|verify|export|import|consolidate|merge> ...\n\n"
        "  inspect PATH                 step, model and tensors of a checkpoint\n"
        "  verify PATH                  checksums of every checkpoint of a run\n"
        "  export PATH --out DIR        Hugging Face safetensors + config.json\n"
        "  import HF_DIR --out ROOT     Hugging Face model -> Loom checkpoint\n"
        "  consolidate RUN --out ROOT   distributed run's per-rank checkpoints -> one\n"
        "  merge PATH --out ROOT        LoRA adapters folded into their base -> whole model\n");
    return args.empty() ? 2 : 0;
  }
  Args rest(args.begin() + 1, args.end());
  if (args[0] == "inspect") return inspect(rest);
  if (args[0] == "verify") return verify_cmd(rest);
  if (args[0] == "export") return export_cmd(rest);
  if (args[0] == "import") return import_cmd(rest);
  if (args[0] == "consolidate") return consolidate_cmd(rest);
  if (args[0] == "merge") return merge_cmd(rest);
  fail("unknown ckpt command '", args[0],
       "' (inspect, verify, export, import, consolidate, merge)");
}

}  // namespace loom::cli
