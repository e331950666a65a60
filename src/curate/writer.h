// JSONL output through an AtomicFile: nothing is visible under the final name until commit(),
// so a killed run never leaves a half-written shard that looks finished. Optional zstd.
#pragma once

#include <memory>
#include <string>

#include "core/fs.h"

typedef struct ZSTD_CCtx_s ZSTD_CCtx;

namespace loom::curate {

class JsonlWriter {
 public:
  JsonlWriter(const std::string& path, bool zstd, int level = 3);
  ~JsonlWriter();
  void write_line(const std::string& line);  // appends '\n'
  void commit();
  uint64_t lines() const { return lines_; }

 private:
  void flush(bool end);
  AtomicFile file_;
  ZSTD_CCtx* cctx_ = nullptr;
  std::string buf_, out_;
  uint64_t lines_ = 0;
};

}  // namespace loom::curate
