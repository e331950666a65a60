// The curate readers' entry points share this: write the input as one shard file named by
// `file_name` (its extension picks gzip/zstd decompression), then read every document.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "curate/readers.h"
#include "fuzz_util.h"

namespace loom::fuzz {

inline void read_all_documents(std::string_view bytes, const std::string& format,
                               const std::string& file_name) {
  auto dir = fresh_dir("curate");
  auto path = dir / file_name;
  write_bytes(path, bytes);
  curate::ReaderOptions opt;
  opt.format = format;
  opt.max_line_bytes = 4096;  // small caps, so the fuzzer reaches the "too long" paths
  opt.max_doc_bytes = 4096;
  curate::InputShard shard;
  shard.files = {path.string()};
  shard.bytes = bytes.size();
  try {
    auto reader = curate::open_reader(shard, opt);
    curate::Doc doc;
    std::string reject;
    while (reader->next(doc, reject)) (void)reader->position();
  } catch (const loom::Error&) {
  }
}

// The extension that makes the reader decompress what the input starts with.
inline std::string compression_suffix(std::string_view bytes) {
  if (bytes.size() >= 2 && uint8_t(bytes[0]) == 0x1f && uint8_t(bytes[1]) == 0x8b) return ".gz";
  if (bytes.size() >= 4 && bytes.substr(0, 4) == std::string_view("\x28\xb5\x2f\xfd", 4))
    return ".zst";
  return "";
}

}  // namespace loom::fuzz
