#include "ckpt/peft.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/fs.h"

namespace loom::ckpt {

namespace {

namespace fs = std::filesystem;

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";
constexpr const char* kPrefix = "base_model.model.";

// One Hugging Face module's share of a Loom linear layer: rows [r0, r1) of its output (r1 0:
// all rows).
struct Part {
  std::string module;  // "model.layers.0.self_attn.q_proj"
  int64_t r0 = 0, r1 = 0;
};

// The Hugging Face modules of Loom linear `linear` ("blocks.3.attn.qkv", "head").
std::vector<Part> parts_of(const HfModelShape& s, const std::string& linear) {
  if (linear == "head") {
    LOOM_CHECK(!s.tied, "LoRA on the output head of a model whose head is tied to the embedding ",
               "has no PEFT form");
    return {{"lm_head"}};
  }
  int layer = -1;
  char kind[32] = {};
  LOOM_CHECK(std::sscanf(linear.c_str(), "blocks.%d.%31s", &layer, kind) == 2 && layer >= 0 &&
                 layer < s.n_layer,
             "LoRA adapter on '", linear, "', which has no Hugging Face module");
  const std::string k = kind;
  const int64_t q = int64_t{s.n_head} * s.head_dim, kv = int64_t{s.n_kv_head} * s.head_dim;
  if (s.family == "gpt2") {
    const std::string h = cat("transformer.h.", layer, ".");
    if (k == "attn.qkv") return {{h + "attn.c_attn"}};
    if (k == "attn.proj") return {{h + "attn.c_proj"}};
    if (k == "mlp.fc") return {{h + "mlp.c_fc"}};
    if (k == "mlp.proj") return {{h + "mlp.c_proj"}};
  } else {
    const std::string h = cat("model.layers.", layer, ".");
    if (k == "attn.qkv")
      return {{h + "self_attn.q_proj", 0, q},
              {h + "self_attn.k_proj", q, q + kv},
              {h + "self_attn.v_proj", q + kv, q + 2 * kv}};
    if (k == "attn.proj") return {{h + "self_attn.o_proj"}};
    if (k == "mlp.fc")
      return {{h + "mlp.gate_proj", 0, s.d_ff}, {h + "mlp.up_proj", s.d_ff, 2 * int64_t{s.d_ff}}};
    if (k == "mlp.proj") return {{h + "mlp.down_proj"}};
  }
  fail("LoRA adapter on '", linear, "', which has no Hugging Face module");
}

// (out, in) of Loom linear `linear`: its weight's shape.
std::pair<int64_t, int64_t> linear_dims(const HfModelShape& s, const std::string& linear) {
  const int64_t C = s.d_model, F = s.d_ff, q = int64_t{s.n_head} * s.head_dim,
                kv = int64_t{s.n_kv_head} * s.head_dim;
  if (linear == "head") return {s.vocab, C};
  const std::string k = linear.substr(linear.find('.', std::strlen("blocks.")) + 1);
  if (k == "attn.qkv") return {q + 2 * kv, C};
  if (k == "attn.proj") return {C, q};
  if (k == "mlp.fc") return {s.family == "gpt2" ? F : 2 * F, C};
  return {C, F};  // mlp.proj
}

// Every Loom linear layer of `s` (the names Decoder::linears() gives a dense model).
std::vector<std::string> loom_linears(const HfModelShape& s) {
  std::vector<std::string> out;
  for (int i = 0; i < s.n_layer; ++i)
    for (const char* k : {"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"})
      out.push_back(cat("blocks.", i, ".", k));
  if (!s.tied) out.push_back("head");
  return out;
}

std::string short_name(const std::string& module) {
  return module.substr(module.rfind('.') + 1);
}

std::string join(const std::string& a, const char* b) {
  return (fs::path(a) / b).string();
}

}  // namespace

bool is_peft_dir(const std::string& dir) {
  return file_exists(join(dir, kConfigFile));
}

void export_peft(const std::string& dir, const HfModelShape& shape, const PeftAdapters& a,
                 const std::string& base_model) {
  LOOM_CHECK(a.rank > 0 && a.alpha > 0, "PEFT export: rank ", a.rank, " and alpha ", a.alpha,
             " must be positive");
  TensorMap out;
  // Short module name -> the full names of the modules carrying it: in the model, and adapted.
  std::map<std::string, std::set<std::string>> modules_of, adapted_of;
  for (const std::string& linear : loom_linears(shape))
    for (const Part& p : parts_of(shape, linear)) modules_of[short_name(p.module)].insert(p.module);
  int adapted = 0;
  for (const std::string& linear : loom_linears(shape)) {
    auto ia = a.tensors.find(linear + ".lora_A"), ib = a.tensors.find(linear + ".lora_B");
    LOOM_CHECK((ia == a.tensors.end()) == (ib == a.tensors.end()), "PEFT export: '", linear,
               "' has only one of lora_A and lora_B");
    if (ia == a.tensors.end()) continue;
    ++adapted;
    const Tensor& A = ia->second;
    const Tensor& B = ib->second;
    LOOM_CHECK(A.ndim() == 2 && B.ndim() == 2 && A.dim(0) == a.rank && B.dim(1) == a.rank,
               "PEFT export: '", linear, "' adapters ", shape_str(A.shape()), " / ",
               shape_str(B.shape()), " are not of rank ", a.rank);
    for (const Part& p : parts_of(shape, linear)) {
      const std::string key = kPrefix + p.module;
      out[key + ".lora_A.weight"] = A.clone();
      out[key + ".lora_B.weight"] = p.r1 > 0 ? B.slice(p.r0, p.r1).clone() : B.clone();
      adapted_of[short_name(p.module)].insert(p.module);
    }
  }
  LOOM_CHECK(adapted > 0 && adapted * 2 == int(a.tensors.size()), "PEFT export: ", a.tensors.size(),
             " adapter tensors, of which ", adapted * 2, " belong to linear layers of this model");
  // target_modules: PEFT adapts every module whose name equals an entry or ends with "." and
  // it. Short names (PEFT's usual form) only when each one names exactly the adapted modules:
  // every module of the model with that name is adapted (GPT-2's attn.c_proj and mlp.c_proj
  // share theirs, so adapting one kind takes full names); else each module's full dotted
  // name, which matches that module alone.
  bool short_names = true;
  for (const auto& [name, modules] : adapted_of) short_names &= modules == modules_of.at(name);
  Json targets = Json::array();
  if (short_names) {
    for (const auto& [name, modules] : adapted_of) targets.push_back(name);
  } else {
    for (const auto& [key, t] : out) {
      const std::string suffix = ".lora_A.weight";
      if (key.size() > suffix.size() &&
          key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0)
        targets.push_back(
            key.substr(std::strlen(kPrefix), key.size() - suffix.size() - std::strlen(kPrefix)));
    }
  }
  Json c = Json::object();
  c["peft_type"] = "LORA";
  c["task_type"] = "CAUSAL_LM";
  c["base_model_name_or_path"] = base_model.empty() ? Json() : Json(base_model);
  c["r"] = a.rank;
  c["lora_alpha"] = a.alpha;
  c["lora_dropout"] = a.dropout;
  c["use_rslora"] = a.rslora;
  c["use_dora"] = false;
  c["bias"] = "none";
  c["fan_in_fan_out"] = shape.family == "gpt2";  // GPT-2's Conv1D stores [in, out]
  c["init_lora_weights"] = true;
  c["inference_mode"] = true;
  c["target_modules"] = std::move(targets);
  c["modules_to_save"] = Json();
  c["rank_pattern"] = Json::object();
  c["alpha_pattern"] = Json::object();
  make_dirs(dir);
  write_safetensors(join(dir, kWeightsFile), out, {{"format", "pt"}});
  write_file_atomic(join(dir, kConfigFile), c.dump(2) + "\n");
}

namespace {

// A PEFT directory as read: its settings and each module's (lora_A, lora_B), fp32.
struct PeftFile {
  PeftAdapters settings;  // rank, alpha, rslora; no tensors
  std::map<std::string, std::pair<Tensor, Tensor>> modules;
  std::string st_path;
};

PeftFile read_peft(const std::string& dir) {
  const std::string cfg_path = join(dir, kConfigFile), st_path = join(dir, kWeightsFile);
  const Json c = Json::parse(read_file(cfg_path), cfg_path);
  LOOM_CHECK(c.is_object(), cfg_path, ": expected a JSON object");
  auto field = [&](const char* k) -> const Json& {
    LOOM_CHECK(c.contains(k) && !c.at(k).is_null(), cfg_path, ": missing field '", k, "'");
    return c.at(k);
  };
  auto flag = [&](const char* k) {
    if (!c.contains(k) || c.at(k).is_null()) return false;
    LOOM_CHECK(c.at(k).type() == Json::Type::Bool, cfg_path, ": '", k, "' must be true or false");
    return c.at(k).as_bool();
  };
  LOOM_CHECK(field("peft_type").is_string() && field("peft_type").as_string() == "LORA", cfg_path,
             ": peft_type ", field("peft_type").dump(), " is not supported (LORA)");
  PeftFile f;
  PeftAdapters& a = f.settings;
  try {
    a.rank = int(field("r").as_int(1, 4096));
    a.alpha = field("lora_alpha").as_double();
  } catch (const Error& e) {
    fail(cfg_path, ": ", e.what());
  }
  LOOM_CHECK(a.alpha > 0 && std::isfinite(a.alpha), cfg_path, ": 'lora_alpha' must be positive");
  if (c.contains("lora_dropout") && !c.at("lora_dropout").is_null()) {
    try {
      a.dropout = c.at("lora_dropout").as_double();
    } catch (const Error& e) {
      fail(cfg_path, ": 'lora_dropout': ", e.what());
    }
    LOOM_CHECK(a.dropout >= 0 && a.dropout < 1, cfg_path, ": 'lora_dropout' must lie in [0, 1), ",
               "got ", a.dropout);
  }
  a.rslora = flag("use_rslora");
  LOOM_CHECK(!flag("use_dora"), cfg_path, ": 'use_dora' true (DoRA) is not supported");
  if (c.contains("bias") && !c.at("bias").is_null())
    LOOM_CHECK(c.at("bias").is_string() && c.at("bias").as_string() == "none", cfg_path,
               ": 'bias' ", c.at("bias").dump(), " is not supported (none)");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    if (c.contains(k) && !c.at(k).is_null())
      LOOM_CHECK(c.at(k).is_object() && c.at(k).size() == 0, cfg_path, ": '", k,
                 "' (per-module ranks) is not supported");
  if (c.contains("modules_to_save") && !c.at("modules_to_save").is_null())
    LOOM_CHECK(c.at("modules_to_save").is_array() && c.at("modules_to_save").size() == 0, cfg_path,
               ": 'modules_to_save' is not supported (Loom adapters hold LoRA weights only)");

  // Modules of the file, by full Hugging Face module name.
  SafetensorsReader reader(st_path);
  f.st_path = st_path;
  auto& modules = f.modules;
  for (const std::string& key : reader.names()) {
    const std::string sa = ".lora_A.weight", sb = ".lora_B.weight";
    auto ends = [&](const std::string& s) {
      return key.size() > s.size() && key.compare(key.size() - s.size(), s.size(), s) == 0;
    };
    LOOM_CHECK(key.rfind(kPrefix, 0) == 0 && (ends(sa) || ends(sb)), st_path, ": tensor '", key,
               "' is not a LoRA weight (base_model.model.<module>.lora_A/lora_B.weight)");
    const std::string module =
        key.substr(std::strlen(kPrefix), key.size() - sa.size() - std::strlen(kPrefix));
    Tensor t = reader.load(key).to(DType::F32);
    (ends(sa) ? modules[module].first : modules[module].second) = t;
  }
  LOOM_CHECK(!modules.empty(), st_path, ": no LoRA weights");
  for (const auto& [module, ab] : modules)
    LOOM_CHECK(ab.first.defined() && ab.second.defined(), st_path, ": module '", module,
               "' lacks lora_A or lora_B");
  return f;
}

}  // namespace

PeftAdapters import_peft(const std::string& dir, const HfModelShape& shape) {
  PeftFile f = read_peft(dir);
  PeftAdapters a = f.settings;
  const auto& modules = f.modules;
  const std::string& st_path = f.st_path;
  std::set<std::string> used;
  for (const std::string& linear : loom_linears(shape)) {
    const std::vector<Part> parts = parts_of(shape, linear);
    bool any = false;
    for (const Part& p : parts) any |= modules.count(p.module) > 0;
    if (!any) continue;
    const auto [out, in] = linear_dims(shape, linear);
    const int64_t r = a.rank;
    Tensor A, B;
    for (const Part& p : parts) {
      auto it = modules.find(p.module);
      if (it == modules.end()) continue;  // a module left out: its rows of B stay zero
      used.insert(p.module);
      const auto& [ma, mb] = it->second;
      LOOM_CHECK(ma.defined() && mb.defined(), st_path, ": module '", p.module,
                 "' lacks lora_A or lora_B");
      LOOM_CHECK(
          ma.ndim() == 2 && ma.dim(0) == r && ma.dim(1) == in && mb.ndim() == 2 && mb.dim(1) == r,
          st_path, ": module '", p.module, "' has lora_A ", shape_str(ma.shape()), " and lora_B ",
          shape_str(mb.shape()), "; rank ", r, " and ", in, " inputs expected");
      if (!A.defined()) {
        A = ma.clone();
        B = Tensor::zeros({out, r});
      } else {
        LOOM_CHECK(
            ma.shape() == A.shape() && std::memcmp(ma.raw(), A.raw(), size_t(A.nbytes())) == 0,
            st_path, ": modules of Loom's fused layer '", linear, "' carry different lora_A (",
            p.module,
            "): one shared A is needed (train all of them from Loom, or merge the "
            "adapters into the base with transformers first)");
      }
      const int64_t r0 = p.r1 > 0 ? p.r0 : 0, r1 = p.r1 > 0 ? p.r1 : B.dim(0);
      LOOM_CHECK(mb.dim(0) == r1 - r0, st_path, ": module '", p.module, "' lora_B has ", mb.dim(0),
                 " rows, expected ", r1 - r0);
      B.slice(r0, r1).copy_from(mb);
    }
    a.tensors[linear + ".lora_A"] = A;
    a.tensors[linear + ".lora_B"] = B;
  }
  for (const auto& [module, ab] : modules)
    LOOM_CHECK(used.count(module), st_path, ": module '", module,
               "' is not a linear layer of this ", shape.family, " model (", shape.n_layer,
               " layers)");
  return a;
}

void merge_peft(const std::string& dir, const HfModelShape& shape, TensorMap& params) {
  const PeftFile f = read_peft(dir);
  const PeftAdapters& a = f.settings;
  const double scale = a.rslora ? a.alpha / std::sqrt(double(a.rank)) : a.alpha / a.rank;
  std::set<std::string> used;
  for (const std::string& linear : loom_linears(shape)) {
    const auto [out, in] = linear_dims(shape, linear);
    for (const Part& p : parts_of(shape, linear)) {
      auto it = f.modules.find(p.module);
      if (it == f.modules.end()) continue;
      used.insert(p.module);
      const Tensor& A = it->second.first;
      const Tensor& B = it->second.second;
      const int64_t r0 = p.r1 > 0 ? p.r0 : 0, r1 = p.r1 > 0 ? p.r1 : out, r = a.rank;
      LOOM_CHECK(A.ndim() == 2 && A.dim(0) == r && A.dim(1) == in && B.ndim() == 2 &&
                     B.dim(0) == r1 - r0 && B.dim(1) == r,
                 f.st_path, ": module '", p.module, "' has lora_A ", shape_str(A.shape()),
                 " and lora_B ", shape_str(B.shape()), "; expected [", r, ", ", in, "] and [",
                 r1 - r0, ", ", r, "]");
      auto w = params.find(linear + ".weight");
      LOOM_CHECK(w != params.end() && w->second.dtype() == DType::F32 &&
                     w->second.is_contiguous() && w->second.shape() == Shape({out, in}),
                 "merge_peft: no fp32 weight ", shape_str({out, in}), " for '", linear, "'");
      float* W = w->second.data<float>();
      const float* pa = A.data<float>();
      const float* pb = B.data<float>();
      // Row by row in double: W[i, :] += scale * B[i, :] A, exact to fp32 rounding.
      std::vector<double> row(static_cast<size_t>(in));
      for (int64_t i = 0; i < r1 - r0; ++i) {
        std::fill(row.begin(), row.end(), 0.0);
        for (int64_t k = 0; k < r; ++k) {
          const double b = pb[i * r + k];
          for (int64_t j = 0; j < in; ++j) row[size_t(j)] += b * pa[k * in + j];
        }
        float* wi = W + (r0 + i) * in;
        for (int64_t j = 0; j < in; ++j) wi[j] = float(wi[j] + scale * row[size_t(j)]);
      }
    }
  }
  for (const auto& [module, ab] : f.modules)
    LOOM_CHECK(used.count(module), f.st_path, ": module '", module,
               "' is not a linear layer of this ", shape.family, " model (", shape.n_layer,
               " layers)");
}

}  // namespace loom::ckpt
