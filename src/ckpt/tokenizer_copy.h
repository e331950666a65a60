// A checkpoint's tokenizer travels with it, as a Hugging Face directory holds its own: the
// trainer copies the files its run's data.tokenizer names into the checkpoints root,
//
//   <out_dir>/checkpoints/tokenizer/<the tokenizer's files>
//                                   loom_tokenizer_source.json   {"from": the run's spec,
//                                        "spec": the copy's spec, "chat_template": its name}
//
// so `loom serve --ckpt /abs/path/to/step_N` finds it from any working directory.
// Checkpoints written before the copy existed name the tokenizer by the path the run was given
// (often relative to the directory training ran in); checkpoint_tokenizer_spec resolves it.
#pragma once

#include <string>

namespace loom::ckpt {

// Copies the tokenizer named by config_text's data.tokenizer (a path relative to the current
// directory, as the trainer read it) under <out_dir>/checkpoints/tokenizer, unless a copy of
// the same spec and chat template is there already. Only a tokenizer's own files are copied
// (encoder.json, vocab.bpe, tokenizer.tiktoken and its .json, tokenizer.json,
// tokenizer_config.json, special_tokens_map.json), never a model folder's weights. No
// data.tokenizer (a byte-level run): nothing. Throws naming the file that cannot be copied.
void copy_tokenizer_in(const std::string& out_dir, const std::string& config_text);

// The tokenizer spec to load a checkpoint's model with ("" when the run named none). The rule:
//   1. the copy: loom_tokenizer_source.json in <step>/tokenizer, or in the tokenizer folder of
//      the checkpoints root above the step (<step>/.. or, per rank, <step>/../..);
//   2. else the recorded data.tokenizer: absolute as it is; relative, the first that exists of
//      the current directory, then the run directory holding the checkpoints and each of its
//      ancestors, nearest first (the directory training ran in is one of them when
//      train.out_dir was relative);
//   3. else the recorded spec unchanged (loading it then fails naming it).
std::string checkpoint_tokenizer_spec(const std::string& step_dir, const std::string& config_text);

// The chat template recorded with the copy (the run's data.chat_template), "" when none.
std::string checkpoint_chat_template(const std::string& step_dir);

}  // namespace loom::ckpt
