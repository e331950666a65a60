// data/indexed_dataset: a Megatron PREFIX.idx + PREFIX.bin pair (input: idx, separator, bin),
// validated on open, then every sequence and document read.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = loom::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 2);
  auto dir = loom::fuzz::fresh_dir("indexed");
  loom::fuzz::write_bytes(dir / "d.idx", parts[0]);
  loom::fuzz::write_bytes(dir / "d.bin", parts[1]);
  try {
    loom::data::IndexedDataset ds((dir / "d").string());
    for (int64_t i = 0; i < ds.num_sequences(); ++i) (void)ds.sequence(i);
    for (int64_t k = 0; k < ds.num_documents(); ++k) (void)ds.document(k);
  } catch (const loom::Error&) {
  }
  return 0;
}
