// PEFT's LoRA files (adapter_config.json + adapter_model.safetensors) <-> Loom's adapters.
//
// Loom adapts its fused layers (attn.qkv; Llama's mlp.fc = gate|up) with one A [r, in] and one
// B [out, r]; PEFT adapts Hugging Face's modules (q_proj, k_proj, v_proj; gate_proj, up_proj).
// Export gives each module the shared A and its rows of B, so every module's B A is exactly its
// rows of the fused update. Import reverses that when the modules of one fused layer share A
// (always so for Loom's own files; a module left out gets zero rows of B), and refuses files whose
// modules of one fused layer carry different A (PEFT's own q_proj + v_proj training), naming
// them. Keys: base_model.model.<module>.lora_A.weight / lora_B.weight; GPT-2's Conv1D modules
// keep [r, in] / [out, r] (fan_in_fan_out only transposes the base weight).
#pragma once

#include <string>

#include "ckpt/hf_export.h"
#include "ckpt/safetensors.h"

namespace loom::ckpt {

struct PeftAdapters {
  int rank = 0;
  double alpha = 0;
  bool rslora = false;
  double dropout = 0;  // lora_dropout: a training setting, kept so a round trip keeps it
  // Loom names: "<linear>.lora_A" [r, in] and "<linear>.lora_B" [out, r], linear as in
  // Decoder::linears() ("blocks.3.attn.qkv", "head").
  TensorMap tensors;
};

// Writes DIR/adapter_model.safetensors then DIR/adapter_config.json, each atomically.
// base_model names the base for PEFT (base_model_name_or_path; may be empty).
void export_peft(const std::string& dir, const HfModelShape& shape, const PeftAdapters& adapters,
                 const std::string& base_model);

// Reads DIR's PEFT files for a base of `shape`; errors name the file and the key or field.
PeftAdapters import_peft(const std::string& dir, const HfModelShape& shape);

// Adds DIR's adapters to `params` (Loom names, "<linear>.weight" fp32 [out, in]): W += scale *
// B A per module, each module on its rows. Works for any PEFT LoRA file Loom's model shape has
// modules for, including different A per module (PEFT's own q_proj + v_proj training).
void merge_peft(const std::string& dir, const HfModelShape& shape, TensorMap& params);

bool is_peft_dir(const std::string& dir);  // holds adapter_config.json

}  // namespace loom::ckpt
