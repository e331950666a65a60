// curate/readers: WARC shards (plain, or gzip/zstd by magic bytes), every record read.
#include "fuzz_curate_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  loom::fuzz::read_all_documents(bytes, "warc",
                                 "shard.warc" + loom::fuzz::compression_suffix(bytes));
  return 0;
}
