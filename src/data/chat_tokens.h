// Chat data as Megatron-style token files, so that large SFT sets stream from memory-mapped
// files like pre-training data instead of being parsed and held whole:
//
//   PREFIX.bin / PREFIX.idx            the rendered ids, one sequence (= one document) per
//                                      example, in the file's order (indexed_dataset.h)
//   PREFIX.mask.bin / PREFIX.mask.idx  a parallel indexed dataset of uint8: 1 where the chat
//                                      template trains the token (assistant replies and their
//                                      end of turn), 0 elsewhere; the same sequence lengths
//
// Both are plain Megatron indexed datasets (the mask one with dtype code 1, uint8), so the
// existing tools read them; the pair is what ChatExample holds (ids, mask).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/chat.h"
#include "data/indexed_dataset.h"

namespace loom::data {

struct ChatTokenStats {
  int64_t examples = 0, tokens = 0, trained_tokens = 0;
};

// Renders every example of the chat JSONL files (messages or prompt/completion; a malformed line
// is an error naming file and line) and writes PREFIX.{bin,idx} and PREFIX.mask.{bin,idx}.
// Lines are read one at a time; nothing appears under the final names unless all succeed.
ChatTokenStats write_chat_token_files(const std::vector<std::string>& inputs, const ChatTemplate& t,
                                      int64_t vocab_size, const std::string& prefix);

// Reads such a pair; the constructor checks that the mask file is uint8 with the same sequence
// lengths as the ids (errors name the files and the first sequence that differs).
class ChatTokenFile {
 public:
  explicit ChatTokenFile(const std::string& prefix);
  int64_t size() const { return ids_->num_sequences(); }
  // Example i: its ids, and its mask (values other than 0/1 are errors naming the sequence).
  ChatExample example(int64_t i) const;
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  std::unique_ptr<IndexedDataset> ids_, mask_;
};

std::string chat_mask_prefix(const std::string& prefix);  // PREFIX.mask

}  // namespace loom::data
