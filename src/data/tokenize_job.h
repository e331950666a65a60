// JSONL -> Megatron indexed token files (`loom tokenize`). Streaming: a reader hands blocks of
// lines to worker threads, which parse, validate and encode them; the calling thread writes
// the results in input order. Memory is bounded by (workers x block size), not corpus size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/bpe.h"

namespace loom::data {

struct TokenizeOptions {
  std::vector<std::string> inputs;  // JSONL files, read in order
  std::string field = "text";       // the string field holding each document's text
  std::string output_prefix;        // writes PREFIX.bin and PREFIX.idx
  bool append_eod = false;          // append the tokenizer's <|endoftext|> to every document
  int workers = 1;
  bool skip_errors = true;  // malformed lines: skip and count (true) or fail (false)
  bool progress = true;     // log MB/s and ETA every few seconds
  size_t block_bytes = 1 << 20;
  int max_reported_errors = 20;  // skipped lines logged individually, then only counted
};

struct TokenizeStats {
  int64_t lines = 0, documents = 0, skipped = 0;
  uint64_t tokens = 0, input_bytes = 0;
  double seconds = 0;
};

// Throws loom::Error naming file:line for the first malformed line when !skip_errors; on any
// error no output file is left behind.
TokenizeStats tokenize_jsonl(const BpeTokenizer& tok, const TokenizeOptions& opt);

}  // namespace loom::data
