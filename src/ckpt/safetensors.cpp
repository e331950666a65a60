#include "ckpt/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>

#include "ckpt/checksum.h"
#include "core/error.h"
#include "core/json.h"
#include "core/parallel.h"

namespace loom::ckpt {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; Loom maps it in place");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit
constexpr const char* kShardPrefix = "shard.";

const DType kAllDTypes[] = {DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2,
                            DType::I32, DType::I64,  DType::U8,  DType::U16};

Json shape_json(const Shape& s) {
  Json::Array a;
  for (int64_t d : s) a.emplace_back(d);
  return Json(std::move(a));
}

// Parses an array of non-negative integers; `what` prefixes errors.
Shape shape_from_json(const Json& j, const std::string& what) {
  LOOM_CHECK(j.is_array(), what, ": expected an array of integers");
  Shape s;
  for (const Json& d : j.as_array()) {
    LOOM_CHECK(d.type() == Json::Type::Int && d.as_int() >= 0, what,
               ": expected non-negative integers, got ", d.dump());
    s.push_back(d.as_int());
  }
  return s;
}

// Bytes of a tensor with `shape` and element size `esize`; false on overflow.
bool byte_size(const Shape& shape, size_t esize, uint64_t* out) {
  uint64_t n = esize;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  *out = n;
  return true;
}

// Copies the logical (row-major) contents of any strided CPU tensor into `dst`, byte-exact.
void gather_bytes(const Tensor& t, uint8_t* dst) {
  const size_t es = dtype_size(t.dtype());
  const auto* src = static_cast<const uint8_t*>(t.raw());
  const int nd = t.ndim();
  if (t.numel() == 0) return;
  if (t.is_contiguous()) {
    std::memcpy(dst, src, t.nbytes());
    return;
  }
  const Shape& shape = t.shape();
  const Shape& strides = t.strides();
  const int64_t inner = shape[nd - 1], inner_stride = strides[nd - 1];
  Shape idx(nd, 0);
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; ++d) off += idx[d] * strides[d];
    const uint8_t* p = src + off * static_cast<int64_t>(es);
    if (inner_stride == 1) {
      std::memcpy(dst, p, inner * es);
      dst += inner * es;
    } else {
      for (int64_t i = 0; i < inner; ++i, dst += es)
        std::memcpy(dst, p + i * inner_stride * static_cast<int64_t>(es), es);
    }
    int d = nd - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

std::string shard_json(const ShardInfo& s, const Shape& local) {
  Json j = Json::object();
  j["global_shape"] = shape_json(s.sharded() ? s.global_shape : local);
  j["global_offset"] =
      shape_json(s.global_offset.empty() ? Shape(local.size(), 0) : s.global_offset);
  j["replica_id"] = Json(s.replica_id);
  return j.dump();
}

ShardInfo shard_from_json(const std::string& text, const std::string& what) {
  Json j = Json::parse(text, what);
  LOOM_CHECK(j.is_object(), what, ": expected a JSON object");
  ShardInfo s;
  try {
    s.global_shape = shape_from_json(j.at("global_shape"), what + ".global_shape");
    s.global_offset = shape_from_json(j.at("global_offset"), what + ".global_offset");
    s.replica_id = static_cast<int>(j.at("replica_id").as_int());
  } catch (const Error& e) {
    fail(what, ": ", e.what());
  }
  LOOM_CHECK(s.replica_id >= 0, what, ": negative replica_id");
  return s;
}

}  // namespace

TensorList to_list(const TensorMap& tensors) {
  TensorList out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.push_back({name, t, {}});
  return out;
}

void check_shard(const ShardInfo& s, const Shape& local, const std::string& what) {
  if (!s.sharded()) {
    const bool zero_offset =
        s.global_offset.empty() || (s.global_offset.size() == local.size() &&
                                    std::all_of(s.global_offset.begin(), s.global_offset.end(),
                                                [](int64_t o) { return o == 0; }));
    LOOM_CHECK(zero_offset, what, ": global_offset ", shape_str(s.global_offset),
               " given without a global_shape");
  } else {
    LOOM_CHECK(s.global_shape.size() == local.size(), what, ": global shape ",
               shape_str(s.global_shape), " has a different rank than the local shape ",
               shape_str(local));
    LOOM_CHECK(s.global_offset.empty() || s.global_offset.size() == local.size(), what,
               ": global offset ", shape_str(s.global_offset), " has a different rank than ",
               "the local shape ", shape_str(local));
    for (size_t d = 0; d < local.size(); ++d) {
      int64_t off = s.global_offset.empty() ? 0 : s.global_offset[d];
      LOOM_CHECK(off >= 0 && off + local[d] <= s.global_shape[d], what, ": shard of shape ",
                 shape_str(local), " at offset ", shape_str(s.global_offset),
                 " does not fit in the global shape ", shape_str(s.global_shape));
    }
  }
  LOOM_CHECK(s.replica_id >= 0, what, ": negative replica_id ", s.replica_id);
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::F8E4M3:
      return "F8_E4M3";
    case DType::F8E5M2:
      return "F8_E5M2";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
    case DType::U16:
      return "U16";
  }
  return "?";
}

bool safetensors_dtype_from_name(const std::string& name, DType* out) {
  for (DType t : kAllDTypes)
    if (name == safetensors_dtype_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

void write_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata,
                       SafetensorsDigest* digest) {
  write_safetensors(path, to_list(tensors), metadata, digest);
}

void write_safetensors(const std::string& path, const TensorList& tensors, const Metadata& metadata,
                       SafetensorsDigest* digest) {
  // Validate everything before creating any file.
  for (const auto& [k, v] : metadata)
    LOOM_CHECK(k.rfind(kShardPrefix, 0) != 0, path, ": metadata key '", k,
               "' uses the reserved prefix 'shard.'");
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    size_t ea = dtype_size(tensors[a].tensor.dtype()), eb = dtype_size(tensors[b].tensor.dtype());
    if (ea != eb) return ea > eb;
    return tensors[a].name < tensors[b].name;
  });
  for (const NamedTensor& nt : tensors) {
    const std::string what = cat(path, ": tensor '", nt.name, "'");
    LOOM_CHECK(!nt.name.empty(), path, ": a tensor has an empty name");
    LOOM_CHECK(nt.name != "__metadata__", what, ": the name is reserved");
    LOOM_CHECK(nt.tensor.defined(), what, ": undefined tensor");
    LOOM_CHECK(nt.tensor.device() == Device::CPU, what,
               ": only CPU tensors can be written (copy it to the host first)");
    check_shard(nt.shard, nt.tensor.shape(), what);
  }
  {
    std::vector<std::string> names;
    for (const auto& nt : tensors) names.push_back(nt.name);
    std::sort(names.begin(), names.end());
    auto dup = std::adjacent_find(names.begin(), names.end());
    LOOM_CHECK(dup == names.end(), path, ": tensor '", *dup, "': duplicate tensor name");
  }

  Json header = Json::object();
  Json meta = Json::object();
  for (const auto& [k, v] : metadata) meta[k] = Json(v);
  uint64_t offset = 0;
  for (size_t i : order) {
    const NamedTensor& nt = tensors[i];
    Json e = Json::object();
    e["dtype"] = Json(safetensors_dtype_name(nt.tensor.dtype()));
    e["shape"] = shape_json(nt.tensor.shape());
    const uint64_t n = nt.tensor.nbytes();
    e["data_offsets"] = Json(Json::Array{Json(offset), Json(offset + n)});
    offset += n;
    header[nt.name] = std::move(e);
    if (!nt.shard.is_default())
      meta[kShardPrefix + nt.name] = Json(shard_json(nt.shard, nt.tensor.shape()));
  }
  if (meta.size() > 0) header["__metadata__"] = std::move(meta);

  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int b = 0; b < 8; ++b) len[b] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * b));

  AtomicFile out(path);
  text.insert(0, reinterpret_cast<const char*>(len), 8);
  out.write(text);
  if (digest) {
    *digest = {};
    digest->header = xxh64(text.data(), text.size());
  }
  std::vector<uint8_t> scratch;
  for (size_t i : order) {
    const Tensor& t = tensors[i].tensor;
    const void* bytes = t.raw();
    if (tensors[i].fill) {
      scratch.resize(t.nbytes());
      tensors[i].fill(scratch.data());
      bytes = scratch.data();
    } else if (!t.is_contiguous()) {
      scratch.resize(t.nbytes());
      gather_bytes(t, scratch.data());
      bytes = scratch.data();
    }
    out.write(bytes, t.nbytes());
    // The buffer just written (for a strided tensor, its gathered copy).
    if (digest) digest->tensors[tensors[i].name] = xxh64(bytes, t.nbytes());
  }
  LOOM_CHECK(out.bytes_written() == text.size() + offset, path, ": wrote ", out.bytes_written(),
             " bytes, expected ", text.size() + offset);
  out.commit();
  if (digest) digest->bytes = out.bytes_written();
}

// Element sizes of the safetensors dtypes Loom has no type for (read past when asked to).
static size_t foreign_dtype_size(const std::string& name) {
  if (name == "BOOL" || name == "I8") return 1;
  if (name == "I16") return 2;
  if (name == "U32") return 4;
  if (name == "U64" || name == "F64") return 8;
  return 0;
}

SafetensorsReader::SafetensorsReader(const std::string& path, bool skip_foreign)
    : file_(std::make_shared<MappedFile>(path)) {
  const uint64_t size = file_->size();
  LOOM_CHECK(size >= 8, path, ": ", size,
             " bytes is too short for a safetensors file (needs an 8-byte header length)");
  uint64_t n = 0;
  std::memcpy(&n, file_->data(), 8);
  LOOM_CHECK(n <= kMaxHeaderBytes, path, ": header length ", n,
             " is implausibly large (not a safetensors file?)");
  LOOM_CHECK(n <= size - 8, path, ": header length ", n, " runs past the end of the ", size,
             "-byte file (truncated?)");
  data_start_ = 8 + n;
  const uint64_t buffer = size - data_start_;

  std::string_view text(reinterpret_cast<const char*>(file_->data() + 8), n);
  Json header = Json::parse(text, path + " (header)");
  LOOM_CHECK(header.is_object(), path, ": header is not a JSON object");

  std::map<std::string, std::string> shard_meta;
  std::vector<Entry> skipped_ranges;
  for (const auto& [name, v] : header.as_object()) {
    if (name == "__metadata__") {
      LOOM_CHECK(v.is_object(), path, ": __metadata__ is not an object");
      for (const auto& [k, mv] : v.as_object()) {
        LOOM_CHECK(mv.is_string(), path, ": __metadata__ '", k, "' is not a string");
        if (k.rfind(kShardPrefix, 0) == 0)
          shard_meta[k.substr(std::strlen(kShardPrefix))] = mv.as_string();
        else
          metadata_[k] = mv.as_string();
      }
      continue;
    }
    const std::string what = cat(path, ": tensor '", name, "'");
    LOOM_CHECK(v.is_object(), what, ": entry is not an object");
    Entry e;
    e.name = name;
    LOOM_CHECK(v.contains("dtype") && v.at("dtype").is_string(), what,
               ": missing or non-string 'dtype'");
    const std::string& dt = v.at("dtype").as_string();
    const bool known = safetensors_dtype_from_name(dt, &e.dtype);
    const size_t foreign_size = known || !skip_foreign ? 0 : foreign_dtype_size(dt);
    LOOM_CHECK(known || foreign_size > 0, what, ": unsupported dtype '", dt,
               "' (Loom reads F32, BF16, F16, F8_E4M3, F8_E5M2, I32, I64, U8, U16)");
    LOOM_CHECK(v.contains("shape"), what, ": missing 'shape'");
    e.shape = shape_from_json(v.at("shape"), what + ": shape");
    LOOM_CHECK(v.contains("data_offsets"), what, ": missing 'data_offsets'");
    Shape off = shape_from_json(v.at("data_offsets"), what + ": data_offsets");
    LOOM_CHECK(off.size() == 2, what, ": data_offsets must be [begin, end], got ", shape_str(off));
    e.begin = static_cast<uint64_t>(off[0]);
    e.end = static_cast<uint64_t>(off[1]);
    LOOM_CHECK(e.begin <= e.end, what, ": data_offsets [", e.begin, ", ", e.end,
               ") end before they begin");
    LOOM_CHECK(e.end <= buffer, what, ": data_offsets [", e.begin, ", ", e.end,
               ") run past the end of the ", buffer, "-byte data buffer (truncated file?)");
    uint64_t want = 0;
    LOOM_CHECK(byte_size(e.shape, known ? dtype_size(e.dtype) : foreign_size, &want), what,
               ": shape ", shape_str(e.shape), " overflows");
    LOOM_CHECK(want == e.end - e.begin, what, ": shape ", shape_str(e.shape), " of ", dt, " needs ",
               want, " bytes but data_offsets [", e.begin, ", ", e.end, ") hold ", e.end - e.begin);
    if (!known) {
      skipped_.push_back({e.name, dt, e.shape});
      skipped_ranges.push_back(std::move(e));  // still part of the buffer's tiling below
      continue;
    }
    entries_.push_back(std::move(e));
  }

  for (const auto& [name, text_json] : shard_meta) {
    // Not [&]: clang 14 (the sanitizer build) cannot capture a structured binding.
    auto it = std::find_if(entries_.begin(), entries_.end(),
                           [&name = name](const Entry& e) { return e.name == name; });
    LOOM_CHECK(it != entries_.end(), path, ": __metadata__ 'shard.", name,
               "' names no tensor in the file");
    it->shard = shard_from_json(text_json, cat(path, ": __metadata__ 'shard.", name, "'"));
    check_shard(it->shard, it->shape, cat(path, ": tensor '", name, "'"));
  }

  // The buffer must be exactly tiled by the tensors: no overlaps, no gaps, no trailing bytes.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries_) by_offset.push_back(&e);
  for (const Entry& e : skipped_ranges) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : by_offset) {
    LOOM_CHECK(e->begin >= pos, path, ": tensor '", e->name, "' bytes [", e->begin, ", ", e->end,
               ") overlap tensor '", prev ? prev->name : "", "' bytes [", prev ? prev->begin : 0,
               ", ", pos, ")");
    LOOM_CHECK(e->begin == pos, path, ": gap of ", e->begin - pos, " bytes before tensor '",
               e->name, "' (tensors must be packed)");
    pos = e->end;
    prev = e;
  }
  LOOM_CHECK(pos == buffer, path, ": data buffer is ", buffer, " bytes but the tensors cover ", pos,
             " (", buffer - pos, " trailing bytes)");
  // entries_ came from a std::map, so they are already sorted by name.
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.name);
  return out;
}

bool SafetensorsReader::contains(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const Entry& e, const std::string& n) { return e.name < n; });
  return it != entries_.end() && it->name == name;
}

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const Entry& e, const std::string& n) { return e.name < n; });
  LOOM_CHECK(it != entries_.end() && it->name == name, path(), ": no tensor named '", name, "'");
  return *it;
}

Tensor SafetensorsReader::view(const std::string& name) const {
  const Entry& e = entry(name);
  const uint8_t* p = data_of(e);
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) != 0) return load(name);
  return Tensor::view_of(const_cast<uint8_t*>(p), e.shape, e.dtype);
}

void SafetensorsReader::release(const std::string& name) const {
  const Entry& e = entry(name);
  file_->release(data_start_ + e.begin, e.end - e.begin);
}

Tensor SafetensorsReader::load(const std::string& name) const {
  const Entry& e = entry(name);
  Tensor t = Tensor::zeros(e.shape, e.dtype);
  if (e.end > e.begin) std::memcpy(t.raw(), data_of(e), e.end - e.begin);
  return t;
}

NamedTensor SafetensorsReader::load_named(const std::string& name) const {
  return {name, load(name), entry(name).shard};
}

TensorMap SafetensorsReader::load_all() const {
  TensorMap out;
  for (const Entry& e : entries_) out[e.name] = load(e.name);
  return out;
}

TensorList SafetensorsReader::load_list() const {
  TensorList out;
  for (const Entry& e : entries_) out.push_back(load_named(e.name));
  return out;
}

SafetensorsDigest SafetensorsReader::digest(int workers) const {
  SafetensorsDigest d;
  d.bytes = file_->size();
  d.header = xxh64(file_->data(), data_start_);
  std::vector<uint64_t> sums(entries_.size());
  // Largest first, so that one big tensor does not start last and leave the others idle.
  std::vector<size_t> order(entries_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return entries_[a].end - entries_[a].begin > entries_[b].end - entries_[b].begin;
  });
  parallel_for(order.size(), workers, [&](size_t k) {
    const Entry& e = entries_[order[k]];
    sums[order[k]] = xxh64(data_of(e), e.end - e.begin);
  });
  for (size_t i = 0; i < entries_.size(); ++i) d.tensors[entries_[i].name] = sums[i];
  return d;
}

}  // namespace loom::ckpt
