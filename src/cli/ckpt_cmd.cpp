// `loom ckpt`: inspect checkpoints; export to / import from Hugging Face safetensors; consolidate
// a distributed run's per-rank checkpoints into one.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "ckpt/checkpoint.h"
#include "ckpt/consolidate.h"
#include "ckpt/hf_export.h"
#include "ckpt/model_bridge.h"
#include "ckpt/peft.h"
#include "ckpt/verify.h"
#include "cli/command.h"
#include "cli/options.h"
#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "data/hf_chat_template.h"
#include "data/hf_tokenizer.h"
#include "data/spm_tokenizer.h"
#include "infer/generator.h"
#include "model/decoder.h"
#include "model/lora.h"

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

// A model's own chat template (chat_template.jinja, or tokenizer_config.json's) copied beside
// its tokenizer as hf:TOK_DIR when Loom's Jinja subset reads it; "" (with a warning) otherwise.
static std::string import_chat_template(const std::string& hf_dir, const std::string& tok_dir) {
  const std::filesystem::path dir(hf_dir);
  const std::string cfg = (dir / "tokenizer_config.json").string();
  const std::string jinja = (dir / "chat_template.jinja").string();
  const bool in_cfg =
      file_exists(cfg) && Json::parse(read_file(cfg), cfg).contains("chat_template");
  if (!in_cfg && !file_exists(jinja)) return "";  // a model without a chat format
  for (const std::string& f : {cfg, jinja})
    if (file_exists(f))
      write_file_atomic(tok_dir + "/" + std::filesystem::path(f).filename().string(), read_file(f));
  try {
    data::HfChatTemplate check(tok_dir);
    return "hf:" + tok_dir;
  } catch (const Error& e) {
    std::fprintf(stderr, "warning: chat template not imported: %s\n", e.what());
    return "";
  }
}

// The chat template a run trained with: data.chat_template of chat or preference data.
static std::string run_chat_template(const Config& run) {
  const std::string source = run.get_string("data.source", "");
  if (source != "chat" && source != "preference") return "";
  return run.get_string("data.chat_template", "chatml");
}

// The model section of a checkpoint's config that reproduces `mc` exactly on later loads.
static std::string model_section(const ModelConfig& mc) {
  std::string cfg =
      cat("[model]\npreset = \"tiny\"\nfamily = \"", family_name(mc.family),
          "\"\nn_layer = ", mc.n_layer, "\nd_model = ", mc.d_model, "\nn_head = ", mc.n_head,
          "\nn_kv_head = ", mc.n_kv_head, "\nhead_dim = ", mc.head_dim, "\nd_ff = ", mc.d_ff,
          "\nvocab = ", mc.vocab, "\nmax_seq = ", mc.max_seq, "\nnorm_eps = ", mc.norm_eps,
          "\nrope_theta = ", mc.rope_theta, "\ntied = ", mc.tied ? "true" : "false",
          "\nbias = ", mc.bias ? "true" : "false", "\nqkv_bias = ", mc.qkv_bias ? "true" : "false",
          "\nqk_norm = ", mc.qk_norm ? "true" : "false", "\nsliding_window = ", mc.sliding_window,
          "\n");
  if (mc.rope_scaling.enabled())
    cfg += cat("rope_scaling = \"llama3\"\nrope_factor = ", mc.rope_scaling.factor,
               "\nrope_low_freq_factor = ", mc.rope_scaling.low_freq_factor,
               "\nrope_high_freq_factor = ", mc.rope_scaling.high_freq_factor,
               "\nrope_original_max_seq = ", mc.rope_scaling.original_max_seq, "\n");
  if (mc.window_pattern > 0 || mc.embed_scale || mc.geglu || mc.sandwich_norm ||
      mc.attn_softcap > 0 || mc.final_softcap > 0 || mc.attn_scalar > 0 || mc.rope_local_theta > 0)
    cfg += cat("window_pattern = ", mc.window_pattern, "\nrope_local_theta = ", mc.rope_local_theta,
               "\nembed_scale = ", mc.embed_scale ? "true" : "false",
               "\ngeglu = ", mc.geglu ? "true" : "false",
               "\nsandwich_norm = ", mc.sandwich_norm ? "true" : "false",
               "\nattn_softcap = ", mc.attn_softcap, "\nfinal_softcap = ", mc.final_softcap,
               "\nattn_scalar = ", mc.attn_scalar, "\n");
  if (!mc.hf_family.empty()) cfg += cat("hf_family = \"", mc.hf_family, "\"\n");
  if (mc.is_moe())
    cfg += cat("n_experts = ", mc.n_experts, "\ntop_k = ", mc.top_k, "\nmoe_router = \"",
               mc.moe_router, "\"\ncapacity_factor = ", mc.capacity_factor,
               "\nmoe_layer_freq = ", mc.moe_layer_freq, "\n");
  return cfg;
}

// base_model_name_or_path of a PEFT export: what transformers' AutoPeftModelForCausalLM loads
// the base from, so a Hugging Face model, never a Loom checkpoint. --base-model as given (a hub
// name, or a directory holding a config.json: the base's `loom ckpt export`); else the Hugging
// Face directory train.pretrained was imported from (`loom ckpt import HF_DIR`, its
// imported_from); else none (null, with a warning saying how to name one).
static std::string peft_base_model(const Config& run, const std::string& given) {
  if (!given.empty()) {
    LOOM_CHECK(!std::filesystem::is_directory(given) ||
                   std::filesystem::exists(std::filesystem::path(given) / "config.json"),
               "--base-model ", given, " is a directory without config.json, not a Hugging Face ",
               "model (a Loom checkpoint? write its Hugging Face export with loom ckpt export ",
               "PATH --out DIR and pass that DIR)");
    return given;
  }
  const std::string pre = run.get_string("train.pretrained", "");
  if (!pre.empty() && std::filesystem::exists(pre)) {
    try {
      const ckpt::Checkpoint base(pre);
      const Json& extra = base.state().extra;
      if (extra.contains("imported_from") && !extra.contains("merged_onto") &&
          !extra.contains("lora"))
        return extra.at("imported_from").as_string();
    } catch (const Error&) {
      // Not a checkpoint this build reads: no Hugging Face source to name.
    }
  }
  log_warn("PEFT export: base_model_name_or_path left null: the base (train.pretrained = '", pre,
           "') is no Hugging Face model; write its export (loom ckpt export BASE --out HF_BASE) ",
           "and pass --base-model HF_BASE, or load the adapters onto the base by hand");
  return "";
}

// A LoRA run's adapters as PEFT files (the base is exported on its own).
static int export_peft_cmd(const ckpt::Checkpoint& c, const Config& run, const std::string& out,
                           const std::string& base_model) {
  LOOM_CHECK(c.state().extra.contains("lora"), c.dir(),
             ": --peft exports a LoRA run's adapters, and this checkpoint has none");
  const ModelConfig mc = model_config_from(run);
  const LoraConfig lc = lora_config_from(run, 0);
  ckpt::PeftAdapters a;
  a.rank = lc.rank;
  a.alpha = lc.alpha;
  a.rslora = lc.rslora;
  a.dropout = lc.dropout;
  a.tensors = c.model().load_all();
  ckpt::export_peft(out, ckpt::hf_shape_of(mc), a, peft_base_model(run, base_model));
  std::printf("exported the LoRA adapters of %s -> %s (PEFT)\n", c.dir().c_str(), out.c_str());
  return 0;
}

static int export_cmd(const Args& args) {
  Options o(
      "loom ckpt export PATH --out DIR [--dtype fp32|bf16|fp16] [--tokenizer SPEC]",
      "Writes the checkpoint's weights as Hugging Face safetensors with a config.json\n"
      "(GPT-2, Llama, Qwen2/3, Mistral, Mixtral, Qwen3-MoE, Phi-3 or Gemma 1/2/3 names and\n"
      "layouts), generation_config.json and, when the run names a tokenizer, tokenizer.json +\n"
      "tokenizer_config.json (with the chat template of chat/preference runs): a directory\n"
      "transformers loads as is.");
  o.positional("path", "a step directory or a checkpoints root (uses latest)")
      .value("out", "", "output directory", true)
      .value("dtype", "fp32", "weight dtype in the exported file")
      .value("tokenizer", "", "tokenizer spec (default: the run's data.tokenizer; none: skip)")
      .value("chat-template", "",
             "chatml | llama3 | hf:PATH | none (default: the run's, for chat data)")
      .flag("peft", "a LoRA run: write its adapters as PEFT files, not the merged model")
      .value("base-model", "",
             "--peft: base_model_name_or_path, a Hugging Face model (default: the HF directory "
             "train.pretrained was imported from, else null)");
  if (!o.parse(args)) return 0;
  ckpt::Checkpoint c(o.get("path"));
  const Config run = Config::parse(c.state().config_text, c.dir() + "/state.json:config_text");
  if (o.has("peft")) return export_peft_cmd(c, run, o.get("out"), o.get("base-model"));
  auto loaded = load_model_from_checkpoint(o.get("path"));  // LoRA adapters merged
  Decoder& model = *loaded;
  ckpt::HfModelShape shape = ckpt::hf_shape_of(model.config());

  std::string spec = o.get("tokenizer");
  if (spec.empty()) spec = run.get_string("data.tokenizer", "");
  const Json& extra = c.state().extra;
  std::string chat = o.get("chat-template");
  if (chat.empty() && extra.contains("hf_chat_template"))
    chat = extra.at("hf_chat_template").as_string();
  if (chat.empty()) chat = run_chat_template(run);
  if (chat == "none") chat.clear();
  std::unique_ptr<data::BpeTokenizer> tok;
  std::vector<int32_t> eos_ids;
  if (!spec.empty() && spec != "none") {
    tok = data::load_tokenizer(spec);
    LOOM_CHECK(tok->vocab_size() <= shape.vocab, "tokenizer ", spec, " has ", tok->vocab_size(),
               " tokens, more than the model's vocabulary of ", shape.vocab);
    if (!chat.empty()) data::ChatTemplate check(chat, *tok);  // its markers must be tokens
    const data::HfSpecialIds ids = data::hf_special_ids(*tok, chat);
    shape.bos_token_id = ids.bos;
    eos_ids = ids.eos;
    if (!eos_ids.empty()) shape.eos_token_id = eos_ids.front();
  }
  // An imported model keeps the ids its own config.json named (or left out).
  if (extra.contains("imported_from")) {
    auto id = [&](const char* k) { return extra.contains(k) ? int(extra.at(k).as_int()) : -1; };
    shape.bos_token_id = id("hf_bos_token_id");
    shape.eos_token_id = id("hf_eos_token_id");
    eos_ids.clear();
    if (shape.eos_token_id >= 0) eos_ids.push_back(shape.eos_token_id);
    if (tok && tok->eot_id() >= 0 && tok->eot_id() != shape.eos_token_id)
      eos_ids.push_back(tok->eot_id());
  }
  ckpt::export_hf(o.get("out"), shape, model.params().tensors("Hugging Face export"),
                  dtype_from_name(o.get("dtype")), 0, eos_ids);
  if (tok) data::save_hf_tokenizer(*tok, o.get("out"), chat, shape.max_seq);
  std::printf("exported %s -> %s%s\n", c.dir().c_str(), o.get("out").c_str(),
              tok ? " (with tokenizer.json)" : "");
  return 0;
}

// PEFT adapters onto a Loom base checkpoint: a LoRA checkpoint (adapters only, the base named
// as train.pretrained), which generate, export and merge read like a LoRA run's.
static int import_peft_cmd(const std::string& dir, const std::string& base, const std::string& out,
                           bool merge) {
  LOOM_CHECK(!base.empty(), dir, " holds PEFT adapters: name their base with --base CKPT");
  ckpt::Checkpoint bc(base);
  LOOM_CHECK(!bc.state().extra.contains("lora"), bc.dir(), ": --base must be a whole model");
  const ModelConfig mc = model_of(bc);
  if (merge) {  // any PEFT LoRA file: base + scale * B A, written as a whole model
    Decoder model(mc, cpu_backend());
    auto params = model.params().tensors("PEFT merge");
    bc.restore_model(params);
    ckpt::merge_peft(dir, ckpt::hf_shape_of(mc), params);
    ckpt::TrainerState st;
    st.config_text = model_section(mc);
    st.extra["model_fingerprint"] = mc.fingerprint();
    st.extra["imported_from"] = dir;
    st.extra["merged_onto"] = bc.dir();
    const std::string step = ckpt::save_checkpoint(out, st, params, ckpt::TensorMap{});
    std::printf("merged PEFT adapters %s into %s -> %s\n", dir.c_str(), bc.dir().c_str(),
                step.c_str());
    return 0;
  }
  ckpt::PeftAdapters a = ckpt::import_peft(dir, ckpt::hf_shape_of(mc));
  std::string targets;
  for (const auto& [name, t] : a.tensors)
    if (name.size() > 7 && name.compare(name.size() - 7, 7, ".lora_A") == 0)
      targets += (targets.empty() ? "" : ",") + name.substr(0, name.size() - 7);
  std::string cfg =
      model_section(mc) + cat("[lora]\nrank = ", a.rank, "\nalpha = ", a.alpha,
                              "\nrslora = ", a.rslora ? "true" : "false", "\ndropout = ", a.dropout,
                              "\ntargets = \"", targets, "\"\n[train]\npretrained = \"",
                              std::filesystem::absolute(bc.dir()).string(), "\"\n");
  // A Lora over the base checks every adapter's name and shape before anything is written.
  {
    Decoder model(mc, cpu_backend());
    Lora lora(model, lora_config_from(Config::parse(cfg, "peft import"), 0));
    auto dst = lora.params().tensors("PEFT import");
    for (auto& [name, t] : dst) t.copy_from(a.tensors.at(name));
  }
  ckpt::TrainerState st;
  st.config_text = cfg;
  st.extra["model_fingerprint"] = mc.fingerprint();
  st.extra["lora"] = lora_config_from(Config::parse(cfg, "peft import"), 0).describe();
  st.extra["imported_from"] = dir;
  std::string step = ckpt::save_checkpoint(out, st, a.tensors, ckpt::TensorMap{});
  std::printf("imported PEFT adapters %s onto %s -> %s\n", dir.c_str(), bc.dir().c_str(),
              step.c_str());
  return 0;
}

static int import_cmd(const Args& args) {
  Options o("loom ckpt import HF_DIR --out ROOT [--dtype fp32|bf16] [--base CKPT]",
            "Reads a Hugging Face model (GPT-2, Llama, Qwen2/3, Mistral, Mixtral, Qwen3-MoE,\n"
            "Phi-3, Gemma 1/2/3: config.json + safetensors, or the shards\n"
            "model.safetensors.index.json names) and writes a Loom checkpoint at step 0 under\n"
            "ROOT, usable by generate and as a training start. --dtype bf16 keeps the weights\n"
            "in bf16 (a bf16 file's bits as they are; loaders widen them to fp32 exactly).\n"
            "A PEFT LoRA directory (adapter_config.json) becomes a LoRA checkpoint over --base.");
  o.positional("hf_dir", "directory with config.json and model.safetensors")
      .value("out", "", "checkpoints root to write", true)
      .value("base", "", "PEFT adapters: the Loom checkpoint of their base model")
      .value("dtype", "fp32", "the checkpoint's weights: fp32, or bf16 (half the memory)")
      .flag("merge", "PEFT adapters: fold them into the base (any LoRA file) instead");
  if (!o.parse(args)) return 0;
  if (ckpt::is_peft_dir(o.get("hf_dir")))
    return import_peft_cmd(o.get("hf_dir"), o.get("base"), o.get("out"), o.has("merge"));
  const std::string dtype = o.get("dtype");
  LOOM_CHECK(dtype == "fp32" || dtype == "bf16", "--dtype must be fp32 or bf16, got '", dtype, "'");
  const ckpt::HfModelShape shape = ckpt::read_hf_shape(o.get("hf_dir"));
  ckpt::check_hf_import(o.get("hf_dir"), shape);  // before the model is allocated
  ModelConfig mc = ckpt::model_config_of(shape);
  // The model's tokenizer.json, when Loom can read it, travels with the checkpoint (a copy under
  // ROOT/tokenizer, named as the run's data.tokenizer) so generate and export find it.
  const std::string hf_tok = (std::filesystem::path(o.get("hf_dir")) / "tokenizer.json").string();
  // Without one, a SentencePiece tokenizer.model (old Llama 2, Mistral, Gemma repositories).
  const std::string spm_tok = (std::filesystem::path(o.get("hf_dir")) / "tokenizer.model").string();
  std::string tok_dir, tok_kind = "hf:";
  std::string chat;  // the model's chat template: one of Loom's, or its own as hf:PATH
  if (!file_exists(hf_tok) && file_exists(spm_tok)) {
    try {
      data::load_spm_tokenizer(spm_tok);
      tok_dir = std::filesystem::absolute(std::filesystem::path(o.get("out")) / "tokenizer");
      make_dirs(tok_dir);
      write_file_atomic(tok_dir + "/tokenizer.model", read_file(spm_tok));
      tok_kind = "spm:";
      chat = import_chat_template(o.get("hf_dir"), tok_dir);
    } catch (const Error& e) {
      std::fprintf(stderr, "warning: tokenizer.model not imported: %s\n", e.what());
      tok_dir.clear();
    }
  }
  if (file_exists(hf_tok)) {
    try {
      data::load_hf_tokenizer(hf_tok);
      const std::string cfg_path =
          (std::filesystem::path(o.get("hf_dir")) / "tokenizer_config.json").string();
      // HF reads chat_template.jinja in place of the config's template when both are there.
      const bool own_jinja =
          file_exists((std::filesystem::path(o.get("hf_dir")) / "chat_template.jinja").string());
      if (file_exists(cfg_path) && !own_jinja) {
        const Json tc = Json::parse(read_file(cfg_path), cfg_path);
        if (tc.is_object() && tc.contains("chat_template") && tc.at("chat_template").is_string())
          for (const char* name : {"chatml", "llama3"})
            if (tc.at("chat_template").as_string() == data::ChatTemplate::jinja(name)) chat = name;
      }
      tok_dir = std::filesystem::absolute(std::filesystem::path(o.get("out")) / "tokenizer");
      make_dirs(tok_dir);
      write_file_atomic(tok_dir + "/tokenizer.json", read_file(hf_tok));
      if (chat.empty()) chat = import_chat_template(o.get("hf_dir"), tok_dir);
    } catch (const Error& e) {
      std::fprintf(stderr, "warning: tokenizer.json not imported: %s\n", e.what());
      tok_dir.clear();
    }
  }
  // The weights go straight from the mapped files into the model's parameters, tensor by
  // tensor (each file tensor's pages dropped once copied); bf16: into bf16 tensors of the
  // parameters' names and shapes (a bf16 file's tensors are copied as they are).
  std::unique_ptr<Decoder> model;
  ckpt::TensorMap dst;
  if (dtype == "bf16") {
    for (const auto& [name, s] : ckpt::loom_param_shapes(shape))
      dst[name] = Tensor::zeros(s, DType::BF16);
  } else {
    model = std::make_unique<Decoder>(mc, cpu_backend());
    dst = model->params().tensors("Hugging Face import");
  }
  ckpt::import_hf_into(o.get("hf_dir"), shape, dst);
  std::string cfg = model_section(mc);
  if (!tok_dir.empty()) cfg += cat("[data]\ntokenizer = \"", tok_kind, tok_dir, "\"\n");
  ckpt::TrainerState st;
  st.config_text = cfg;
  st.extra["model_fingerprint"] = mc.fingerprint();
  st.extra["imported_from"] = o.get("hf_dir");
  if (shape.bos_token_id >= 0) st.extra["hf_bos_token_id"] = int64_t(shape.bos_token_id);
  if (shape.eos_token_id >= 0) st.extra["hf_eos_token_id"] = int64_t(shape.eos_token_id);
  if (!chat.empty()) st.extra["hf_chat_template"] = chat;
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
      ckpt::consolidate({o.get("run_dir"), o.get("out"), o.get_int("step", -1, INT64_MAX)});
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
  std::string dir = ckpt::save_checkpoint(
      o.get("out"), st, model->params().tensors("saving the merged checkpoint"), ckpt::TensorMap{});
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
