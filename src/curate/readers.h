// Readers turn input shards into documents: JSONL (configurable id/text fields), plain text
// files, HTML files from a directory tree, and WARC records (gzip, as Common Crawl ships them).
// Malformed input never disappears: it becomes a document rejected by the "reader" stage with
// a reason, and an error entry naming the file and line. A document's input_bytes are the
// bytes really read for it (never a header's claim), so the reader's documents, the WARC
// non-document records and the bytes left unread after a stream error add up to the input.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "curate/document.h"

namespace loom::curate {

struct ReaderOptions {
  std::string format = "jsonl";  // jsonl | text | html | warc
  std::string text_field = "text";
  std::string id_field = "id";
  size_t max_line_bytes = 64u << 20;  // longer lines are rejected as "line_too_long"
  size_t max_doc_bytes = 64u << 20;   // text/html files and WARC payloads past this: rejected
  bool fail_on_error = false;         // on_error = "fail": stop at the first malformed input
};

struct InputShard {
  int index = 0;
  std::vector<std::string> files;
  uint64_t bytes = 0;  // on-disk size, for progress
};

// Expands paths (files, directories walked recursively, glob patterns) into sorted shards:
// one shard per file for record formats (jsonl, warc), `files_per_shard` files per shard for
// file-per-document formats (text, html).
std::vector<InputShard> plan_shards(const std::vector<std::string>& paths,
                                    const std::string& format, int files_per_shard);

struct ReadError {
  std::string where;  // file:line
  std::string message;
};

class DocReader {
 public:
  virtual ~DocReader() = default;
  // Next document, or false at the end. A document with a non-empty `reject` is malformed
  // input that must be written to the rejected output with that reason.
  virtual bool next(Doc& doc, std::string& reject) = 0;
  virtual uint64_t position() const = 0;  // bytes of the shard consumed, for progress
  std::vector<ReadError> errors;          // also counted per reason in the reader's stats
  // On-disk bytes never read because a stream error (corrupt or truncated compression) ended
  // a file early: input that no document accounts for.
  uint64_t unread_bytes = 0;
  int64_t stream_errors = 0;  // files cut short: what they held past the error is lost
  // WARC request, metadata and warcinfo records: read and counted, but not documents.
  int64_t non_document_records = 0, non_document_bytes = 0;
};

std::unique_ptr<DocReader> open_reader(const InputShard& shard, const ReaderOptions& opt);

}  // namespace loom::curate
