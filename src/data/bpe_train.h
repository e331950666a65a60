// Byte-level BPE training (GPT-2 style): count pre-token frequencies over the corpus with
// several threads, then repeatedly merge the most frequent adjacent pair of symbols.
// Deterministic: counts do not depend on the thread count, and ties between equally frequent
// pairs go to the pair of smaller (left id, right id). Special-token strings in the corpus
// are cut out before counting.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/bpe.h"

namespace loom::data {

struct BpeTrainOptions {
  int32_t vocab_size = 8192;  // total, including the 256 byte tokens and the specials
  std::vector<std::string> specials = {"<|endoftext|>"};
  PreTokenizer pretokenizer = PreTokenizer::Gpt2;
  int threads = 1;
  std::string text_field = "text";  // for .jsonl inputs
  bool progress = true;
};

using PieceCounts = std::unordered_map<std::string, int64_t>;

// Counts pieces in .jsonl (one JSON object a line, text in options.text_field) or plain-text
// files (anything else). Bad JSONL lines are errors naming the file and line.
PieceCounts count_pieces(const std::vector<std::string>& inputs, const BpeTrainOptions& opt);
void count_pieces_in_text(std::string_view text, const BpeTrainOptions& opt, PieceCounts& out);

// Learns merges from piece counts. The vocabulary may come out smaller than asked if the
// corpus runs out of pairs (logged).
BpeTokenizer train_bpe(const PieceCounts& counts, const BpeTrainOptions& opt);
BpeTokenizer train_bpe(const std::vector<std::string>& inputs, const BpeTrainOptions& opt);

}  // namespace loom::data
