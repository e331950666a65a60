// Hugging Face interchange: Loom parameters <-> a transformers model directory (config.json plus
// model.safetensors, or model-0000i-of-0000n.safetensors with model.safetensors.index.json).
// Families: GPT-2, Llama, Qwen2/2.5, Qwen3 and Mistral (dense), Mixtral and Qwen3-MoE (every
// layer's MLP a mixture of experts: Loom's MoE layers, router "moe.router.weight" [E, C], the
// experts' gate/up rows in "moe.experts.w1" [E, 2F, C] and down in "moe.experts.w2" [E, C, F]).
//
// Loom keeps every linear weight as [out, in] (torch.nn.Linear), fuses q/k/v into one
// "attn.qkv.weight" (rows: q heads, k heads, v heads) and, for Llama, gate/up into one
// "mlp.fc.weight" (rows: gate, up). GPT-2 on the Hub uses Conv1D, whose weights are [in, out]:
// those are transposed on the way out and back. Llama q/k need no permutation: HF's rotate-half
// RoPE convention is Loom's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/json.h"
#include "kernels/rope_scaling.h"

namespace loom::ckpt {

// The shape-determining fields of a model, in the terms both sides share.
struct HfModelShape {
  // "gpt2" | "llama" | "qwen2" (q/k/v biases) | "qwen3" (per-head q/k RMSNorm) | "mistral"
  // (sliding window): the last three are Llama's layout with their one difference; "mixtral"
  // (Mistral's attention) and "qwen3_moe" (Qwen3's) with mixture-of-experts MLPs.
  std::string family;
  int n_layer = 0;
  int d_model = 0;
  int n_head = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  int d_ff = 0;  // MLP hidden width (per branch for SwiGLU)
  int vocab = 0;
  int max_seq = 0;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.f;  // Llama only
  RopeScaling rope_scaling;    // Llama only: rope_scaling {"rope_type": "llama3", ...}
  bool tied = true;            // output head shares the token embedding
  int sliding_window = 0;      // mistral, mixtral: sliding_window (0: null, no window)
  // mixtral, qwen3_moe: experts in every layer (each of width d_ff) and experts per token,
  // chosen by softmax scores with the top k renormalised to sum to 1.
  int n_experts = 0;
  int top_k = 0;
  // gemma, gemma2, gemma3_text (GeGLU, embedding scaled by sqrt(hidden), RMSNorm weights as
  // offsets from 1: Loom's weight = HF's + 1). gemma2 and gemma3_text: the sandwich norms,
  // query_pre_attn_scalar, and sliding windows on every layer but each window_pattern-th
  // (Gemma 2: 2, Gemma 3: 6); gemma3_text: q/k norms, rope_local_base_freq for windowed layers.
  float attn_scalar = 0.f;       // query_pre_attn_scalar (0: head_dim)
  float attn_softcap = 0.f;      // attn_logit_softcapping (0: null)
  float final_softcap = 0.f;     // final_logit_softcapping (0: null)
  int window_pattern = 0;        // with sliding_window: every window_pattern-th layer global
  float rope_local_theta = 0.f;  // gemma3_text: rope_local_base_freq
  int bos_token_id = -1;         // -1: not written to config.json
  int eos_token_id = -1;

  bool qkv_bias() const { return family == "qwen2"; }
  bool qk_norm() const {
    return family == "qwen3" || family == "qwen3_moe" || family == "gemma3_text";
  }
  bool fused() const { return family == "phi3"; }  // qkv_proj and gate_up_proj
  bool gemma() const { return family == "gemma" || family == "gemma2" || family == "gemma3_text"; }
  bool sandwich_norm() const { return family == "gemma2" || family == "gemma3_text"; }
  bool is_moe() const { return n_experts > 0; }

  bool operator==(const HfModelShape&) const = default;
  void validate() const;  // throws naming the field
};

// Loom names and shapes of every parameter of `shape` (what export_hf takes, import_hf returns).
std::map<std::string, Shape> loom_param_shapes(const HfModelShape& shape);
// HF names and shapes of the exported tensors.
std::map<std::string, Shape> hf_param_shapes(const HfModelShape& shape);

// config.json contents; `dtype` (F32, BF16 or F16) becomes torch_dtype.
Json hf_config_json(const HfModelShape& shape, DType dtype);
// generation_config.json contents: bos_token_id and eos_token_id (`eos_ids` when it has several,
// such as a chat model's end of turn and <|endoftext|>, else shape.eos_token_id).
Json hf_generation_config_json(const HfModelShape& shape, const std::vector<int32_t>& eos_ids = {});
// Reads config.json contents; rejects model types and options Loom cannot represent exactly.
HfModelShape hf_shape_from_config(const Json& config, const std::string& where);

// In-memory conversions. loom_to_hf checks that `loom` holds exactly loom_param_shapes(shape);
// hf_to_loom checks that `hf` holds hf_param_shapes(shape) (ignoring non-parameter buffers such
// as GPT-2's attn.bias and tolerating GPT-2 names without the "transformer." prefix).
// `where` names the source in errors. Results are contiguous tensors of `dtype`; loom_to_hf
// returns views of its inputs where no conversion or transpose is needed.
TensorMap loom_to_hf(const HfModelShape& shape, const TensorMap& loom, DType dtype);
TensorMap hf_to_loom(const HfModelShape& shape, const TensorMap& hf, DType dtype,
                     const std::string& where);

// Writes config.json and the weights into `dir` (created if missing), each file atomically, the
// weights first so a config.json always describes complete weights. max_shard_bytes > 0 splits
// the weights into model-0000i-of-0000n.safetensors files of at most that size (a single larger
// tensor gets a file to itself) plus model.safetensors.index.json. With a bos or eos id in
// `shape`, generation_config.json too (eos_ids as for hf_generation_config_json).
void export_hf(const std::string& dir, const HfModelShape& shape, const TensorMap& loom_params,
               DType out_dtype = DType::F32, uint64_t max_shard_bytes = 0,
               const std::vector<int32_t>& eos_ids = {});

struct HfModel {
  HfModelShape shape;
  TensorMap params;  // Loom names, owned contiguous tensors of the requested dtype
};

// Reads config.json and model.safetensors (or the sharded set named by
// model.safetensors.index.json) from `dir` into Loom names.
HfModel import_hf(const std::string& dir, DType dtype = DType::F32);
// The two halves of import_hf, for a caller that owns the destination (a model's parameters):
// the shape config.json describes, then the weights of the mapped files converted tensor by
// tensor into `dst` (exactly loom_param_shapes(shape), contiguous, each of its own dtype), so
// the model is never held twice.
HfModelShape read_hf_shape(const std::string& dir);
void import_hf_into(const std::string& dir, const HfModelShape& shape, const TensorMap& dst);
// The checks import_hf_into makes before it writes anything (names, shapes, the layer count):
// run before allocating a model of `shape`.
void check_hf_import(const std::string& dir, const HfModelShape& shape);

}  // namespace loom::ckpt
