// Preference data for DPO tests: a byte tokenizer with ChatML markers and pairs whose chosen
// reply is the prompt's word reversed and whose rejected reply is "zzzz" (a preference a tiny
// model learns, and that holds for held-out prompts).
#pragma once

#include <string>
#include <vector>

#include "core/fs.h"
#include "core/rng.h"
#include "data/bpe.h"

namespace loom::test {

// Writes <d>/tok (the tokenizer, data.tokenizer = "loom:<d>/tok") and <d>/pairs.jsonl (n pairs).
inline void write_preference_pairs(const std::string& d, int n) {
  data::save_loom_tokenizer(data::byte_chatml_tokenizer(), d + "/tok");
  std::string text;
  for (int i = 0; i < n; ++i) {
    std::string w;
    for (int k = 0; k < 4; ++k) w += char('a' + int(uniform_at(5, uint64_t(i), uint64_t(k)) * 6));
    std::string r(w.rbegin(), w.rend());
    text += "{\"prompt\": \"rev " + w + "\", \"chosen\": \"" + r + "\", \"rejected\": \"zzzz\"}\n";
  }
  write_file_atomic(d + "/pairs.jsonl", text);
}

// Writes <d>/tok and <d>/kto.jsonl: n unpaired examples (dpo.loss = "kto"), the even ones the
// reversed word (desirable), the odd ones "zzzz" (undesirable).
inline void write_kto_examples(const std::string& d, int n) {
  data::save_loom_tokenizer(data::byte_chatml_tokenizer(), d + "/tok");
  std::string text;
  for (int i = 0; i < n; ++i) {
    std::string w;
    for (int k = 0; k < 4; ++k) w += char('a' + int(uniform_at(5, uint64_t(i), uint64_t(k)) * 6));
    const bool good = i % 2 == 0;
    const std::string reply = good ? std::string(w.rbegin(), w.rend()) : std::string("zzzz");
    text += "{\"prompt\": \"rev " + w + "\", \"completion\": \"" + reply +
            "\", \"label\": " + (good ? "true" : "false") + "}\n";
  }
  write_file_atomic(d + "/kto.jsonl", text);
}

}  // namespace loom::test
