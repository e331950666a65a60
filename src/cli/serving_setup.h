// What `loom generate` and `loom serve` both need to put a checkpoint behind the engine: the
// run's tokenizer, and the engine's end-of-text ids and detokeniser for it.
#pragma once

#include <memory>
#include <string>

#include "data/bpe.h"
#include "data/chat.h"
#include "infer/engine.h"
#include "model/decoder.h"

namespace loom::cli {

// The tokenizer named by `spec`, else by the checkpoint's run (data.tokenizer); null for a
// byte-level model. Throws when the model is neither.
std::unique_ptr<data::BpeTokenizer> checkpoint_tokenizer(const std::string& ckpt,
                                                         const std::string& spec,
                                                         const Decoder& model);

// End-of-text (and the template's end-of-turn) as stop ids; text from ids, where ids the
// tokenizer does not have (a model vocabulary padded past it) decode to nothing.
void set_text_codec(infer::EngineConfig& cfg, const data::BpeTokenizer* tok,
                    const data::ChatTemplate* chat);

}  // namespace loom::cli
