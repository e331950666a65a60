// Megatron-LM's indexed dataset: PREFIX.bin holds the tokens of every sequence back to back;
// PREFIX.idx describes them:
//
//   "MMIDIDX\0\0"  u64 version (1)  u8 dtype code  u64 sequence count S  u64 document count D+1
//   i32 sequence_lengths[S]  i64 sequence_pointers[S] (byte offsets in .bin)
//   i64 document_indices[D+1] (first sequence of each document, then S)
//
// All little-endian. The writer produces byte-identical files to Megatron's
// IndexedDatasetBuilder; the reader memory-maps both files (processes reading the same files
// share one page-cached copy) and validates the index before use.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/fs.h"

namespace loom::data {

enum class TokenDType : uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8
};
size_t dtype_size(TokenDType t);
const char* dtype_name(TokenDType t);
// uint16 when every id fits (Megatron's rule: vocab_size < 65500), else int32.
TokenDType dtype_for_vocab(int64_t vocab_size);

class IndexedDatasetWriter {
 public:
  // Writes PREFIX.bin and PREFIX.idx through temporary names; nothing appears under the final
  // names until finalize(). Destroyed without finalize(), it leaves no files behind.
  IndexedDatasetWriter(const std::string& prefix, TokenDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  void add_sequence(std::span<const int32_t> tokens);  // throws if a token does not fit dtype
  void end_document();
  void add_document(std::span<const int32_t> tokens) {
    add_sequence(tokens);
    end_document();
  }
  void finalize();

  int64_t num_sequences() const { return n_sequences_; }
  int64_t num_documents() const { return n_documents_; }
  uint64_t num_tokens() const { return n_tokens_; }

 private:
  struct Spill;  // sequence lengths and document indices, spilled to temp files when large
  std::string prefix_;
  TokenDType dtype_;
  std::unique_ptr<AtomicFile> bin_;
  std::unique_ptr<Spill> lengths_, docs_;
  std::vector<char> buf_;
  int64_t n_sequences_ = 0, n_documents_ = 0;
  uint64_t n_tokens_ = 0;
  bool finalized_ = false;
};

class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);  // throws naming the file and field

  TokenDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return n_sequences_; }
  int64_t num_documents() const { return n_doc_indices_ - 1; }
  int32_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;  // byte offset in .bin
  int64_t document_index(int64_t k) const;    // k in [0, num_documents()]
  uint64_t num_tokens() const { return n_tokens_; }

  // Copies tokens [offset, offset + n) of sequence i, converted to int32.
  void read(int64_t i, int64_t offset, int64_t n, int32_t* out) const;
  std::vector<int32_t> sequence(int64_t i) const;
  // All tokens of document k (its sequences concatenated).
  std::vector<int32_t> document(int64_t k) const;
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  std::unique_ptr<MappedFile> idx_, bin_;
  TokenDType dtype_{};
  int64_t n_sequences_ = 0, n_doc_indices_ = 0;
  uint64_t n_tokens_ = 0;
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* doc_indices_ = nullptr;
};

}  // namespace loom::data
