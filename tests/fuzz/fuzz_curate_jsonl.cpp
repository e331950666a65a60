// curate/readers: JSONL shards (plain, or gzip/zstd by magic bytes), every document read.
#include "fuzz_curate_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  loom::fuzz::read_all_documents(bytes, "jsonl",
                                 "shard.jsonl" + loom::fuzz::compression_suffix(bytes));
  return 0;
}
