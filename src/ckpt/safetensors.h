// safetensors files: the Hugging Face tensor container, used for Loom checkpoints and exports.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header (padded with spaces to a
// multiple of 8), then the data buffer. The header maps each tensor name to {dtype, shape,
// data_offsets: [begin, end)} relative to the buffer, plus an optional "__metadata__" object of
// string -> string. Tensors are packed with no gaps and no overlaps.
//
// Sharding: a tensor may be a piece of a larger global tensor. Its placement (global shape,
// global offset, replica id) travels in __metadata__ under "shard.<name>" as a JSON string, so
// plain safetensors readers still see an ordinary file.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/fs.h"
#include "core/tensor.h"

namespace loom::ckpt {

// Where a stored tensor sits inside its global tensor. Default: unsharded (the stored tensor is
// the whole tensor) and the primary replica.
struct ShardInfo {
  Shape global_shape;   // empty: unsharded, the global shape is the local shape
  Shape global_offset;  // per dimension, where this shard starts; empty: all zeros
  int replica_id = 0;   // 0 is the primary copy; data-parallel replicas count up

  bool sharded() const { return !global_shape.empty(); }
  bool is_default() const { return !sharded() && replica_id == 0; }
  bool operator==(const ShardInfo&) const = default;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
  ShardInfo shard = {};
  // Set for a tensor made as it is written (StateSlice::fill): `tensor` gives its dtype and
  // shape alone, and the writer calls fill(dst) for its bytes into a buffer it reuses, so that
  // only one such tensor at a time takes memory.
  std::function<void(void* dst)> fill = {};
};

using TensorList = std::vector<NamedTensor>;
using TensorMap = std::map<std::string, Tensor>;
using Metadata = std::map<std::string, std::string>;

// Unsharded list in name order.
TensorList to_list(const TensorMap& tensors);

// Checks that `shard` is a consistent placement for a local tensor of shape `local`
// (ranks agree, offset + local <= global in every dimension); throws naming `what`.
void check_shard(const ShardInfo& shard, const Shape& local, const std::string& what);

// safetensors dtype names ("F32", "BF16", "F8_E4M3", ...) <-> loom::DType.
const char* safetensors_dtype_name(DType t);
bool safetensors_dtype_from_name(const std::string& name, DType* out);  // false if unsupported

// Checksums (ckpt/checksum.h) of one safetensors file: its size, its header (length prefix and
// JSON) and each tensor's bytes. The tensors tile the data buffer, so together they cover every
// byte of the file, and a mismatch names the tensor that changed.
struct SafetensorsDigest {
  uint64_t bytes = 0;
  uint64_t header = 0;
  std::map<std::string, uint64_t> tensors;
};

// Writes `tensors` (any CPU tensors, contiguous or not) and `metadata` to `path` through
// AtomicFile: the file appears complete under its final name or not at all. Tensors are laid out
// largest element size first, then by name, so every tensor is aligned to its element size.
// Metadata keys starting with "shard." are reserved for shard placement. With `digest`, the
// checksums of the bytes written are stored there.
void write_safetensors(const std::string& path, const TensorList& tensors,
                       const Metadata& metadata = {}, SafetensorsDigest* digest = nullptr);
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const Metadata& metadata = {}, SafetensorsDigest* digest = nullptr);

// Memory-maps and validates a safetensors file on open; every error names the file and, where
// there is one, the tensor.
class SafetensorsReader {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin = 0, end = 0;  // byte range within the data buffer
    ShardInfo shard;
  };

  // skip_foreign: tensors of a dtype Loom has no type for (BOOL, I8, I16, U32, U64, F64) are
  // checked like the others but left out of entries() and listed in skipped() instead (an HF
  // checkpoint's BOOL attention-mask buffers); otherwise they are an error.
  explicit SafetensorsReader(const std::string& path, bool skip_foreign = false);

  const std::string& path() const { return file_->path(); }
  const Metadata& metadata() const { return metadata_; }          // without the "shard.*" keys
  const std::vector<Entry>& entries() const { return entries_; }  // sorted by name
  struct Skipped {
    std::string name, dtype;
    Shape shape;
  };
  const std::vector<Skipped>& skipped() const { return skipped_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  const Entry& entry(const std::string& name) const;  // throws naming file and tensor

  // Zero-copy view into the mapping, valid while this reader lives. Falls back to a copy when
  // the data is not aligned to its element size (possible in files written by other tools).
  Tensor view(const std::string& name) const;
  Tensor load(const std::string& name) const;  // an owned copy
  // The tensor's pages dropped from this process's memory (views of it read the file again).
  void release(const std::string& name) const;
  NamedTensor load_named(const std::string& name) const;
  TensorMap load_all() const;    // owned copies
  TensorList load_list() const;  // owned copies with shard info, in name order

  // Checksums of the mapped bytes (reads the whole file), tensors hashed on `workers` threads.
  SafetensorsDigest digest(int workers = 4) const;

 private:
  const uint8_t* data_of(const Entry& e) const { return file_->data() + data_start_ + e.begin; }
  std::shared_ptr<MappedFile> file_;
  uint64_t data_start_ = 0;
  std::vector<Entry> entries_;
  std::vector<Skipped> skipped_;
  Metadata metadata_;
};

}  // namespace loom::ckpt
