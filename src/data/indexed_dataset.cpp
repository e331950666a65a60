#include "data/indexed_dataset.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace loom::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

size_t dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::UInt8:
    case TokenDType::Int8:
      return 1;
    case TokenDType::Int16:
    case TokenDType::UInt16:
      return 2;
    case TokenDType::Int32:
    case TokenDType::Float32:
      return 4;
    case TokenDType::Int64:
    case TokenDType::Float64:
      return 8;
  }
  fail("unknown dtype code ", int(t));
}

const char* dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::UInt8:
      return "uint8";
    case TokenDType::Int8:
      return "int8";
    case TokenDType::Int16:
      return "int16";
    case TokenDType::Int32:
      return "int32";
    case TokenDType::Int64:
      return "int64";
    case TokenDType::Float64:
      return "float64";
    case TokenDType::Float32:
      return "float32";
    case TokenDType::UInt16:
      return "uint16";
  }
  return "unknown";
}

TokenDType dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::UInt16 : TokenDType::Int32;
}

// ---- writer --------------------------------------------------------------------------------

// An append-only list of int64 kept in memory up to a limit, then in an unlinked temp file.
struct IndexedDatasetWriter::Spill {
  explicit Spill(const std::filesystem::path& tmp_dir) : dir(tmp_dir.string()) {}
  ~Spill() {
    if (f) std::fclose(f);
  }
  void push(int64_t v) {
    mem.push_back(v);
    if (mem.size() >= (1u << 20)) flush();
  }
  void flush() {
    if (mem.empty()) return;
    if (!f) {
      std::string tmpl = dir + "/.loom-idx-spill-XXXXXX";
      int fd = ::mkstemp(tmpl.data());
      LOOM_CHECK(fd >= 0, tmpl, ": cannot create temp file (", std::strerror(errno), ")");
      ::unlink(tmpl.c_str());  // removed when closed, whatever happens
      f = ::fdopen(fd, "w+b");
    }
    LOOM_CHECK(std::fwrite(mem.data(), 8, mem.size(), f) == mem.size(), "spill write failed");
    spilled += mem.size();
    mem.clear();
  }
  // Calls f(value) for every value in order.
  template <typename F>
  void each(F&& fn) {
    if (f) {
      std::fflush(f);
      std::rewind(f);
      std::vector<int64_t> chunk(1 << 16);
      uint64_t left = spilled;
      while (left) {
        size_t n = std::fread(chunk.data(), 8, std::min<uint64_t>(left, chunk.size()), f);
        LOOM_CHECK(n > 0, "spill read failed");
        for (size_t k = 0; k < n; ++k) fn(chunk[k]);
        left -= n;
      }
    }
    for (int64_t v : mem) fn(v);
  }
  std::string dir;
  std::vector<int64_t> mem;
  FILE* f = nullptr;
  uint64_t spilled = 0;
};

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDType dtype)
    : prefix_(prefix), dtype_(dtype) {
  (void)dtype_size(dtype);
  bin_ = std::make_unique<AtomicFile>(prefix + ".bin");
  std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
  if (dir.empty()) dir = std::filesystem::path(".");
  lengths_ = std::make_unique<Spill>(dir);
  docs_ = std::make_unique<Spill>(dir);
  docs_->push(0);
}

IndexedDatasetWriter::~IndexedDatasetWriter() = default;

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  LOOM_CHECK(!finalized_, prefix_, ": add after finalize");
  const size_t es = dtype_size(dtype_);
  buf_.resize(tokens.size() * es);
  char* p = buf_.data();
  for (size_t k = 0; k < tokens.size(); ++k) {
    int32_t t = tokens[k];
    switch (dtype_) {
      case TokenDType::UInt16: {
        LOOM_CHECK(t >= 0 && t <= 0xFFFF, prefix_, ": token ", t, " does not fit uint16");
        uint16_t v = uint16_t(t);
        std::memcpy(p + k * 2, &v, 2);
        break;
      }
      case TokenDType::Int32:
        std::memcpy(p + k * 4, &t, 4);
        break;
      case TokenDType::Int64: {
        int64_t v = t;
        std::memcpy(p + k * 8, &v, 8);
        break;
      }
      case TokenDType::UInt8: {
        LOOM_CHECK(t >= 0 && t <= 0xFF, prefix_, ": token ", t, " does not fit uint8");
        p[k] = char(t);
        break;
      }
      default:
        fail(prefix_, ": writing dtype ", dtype_name(dtype_), " is not supported");
    }
  }
  bin_->write(buf_.data(), buf_.size());
  LOOM_CHECK(tokens.size() <= size_t(INT32_MAX), prefix_, ": sequence too long for int32 length");
  lengths_->push(int64_t(tokens.size()));
  ++n_sequences_;
  n_tokens_ += tokens.size();
}

void IndexedDatasetWriter::end_document() {
  docs_->push(n_sequences_);
  ++n_documents_;
}

void IndexedDatasetWriter::finalize() {
  LOOM_CHECK(!finalized_, prefix_, ": finalized twice");
  AtomicFile idx(prefix_ + ".idx");
  std::string head(kMagic, sizeof kMagic);
  put<uint64_t>(head, 1);
  head.push_back(char(uint8_t(dtype_)));
  put<uint64_t>(head, uint64_t(n_sequences_));
  put<uint64_t>(head, uint64_t(n_documents_ + 1));
  idx.write(head);
  std::string block;
  auto drain = [&](bool force) {
    if (force || block.size() >= (1 << 20)) {
      idx.write(block);
      block.clear();
    }
  };
  lengths_->each([&](int64_t len) {
    put<int32_t>(block, int32_t(len));
    drain(false);
  });
  int64_t pointer = 0;
  const int64_t es = int64_t(dtype_size(dtype_));
  lengths_->each([&](int64_t len) {
    put<int64_t>(block, pointer);
    pointer += len * es;
    drain(false);
  });
  docs_->each([&](int64_t d) {
    put<int64_t>(block, d);
    drain(false);
  });
  drain(true);
  bin_->commit();
  idx.commit();
  finalized_ = true;
}

// ---- reader --------------------------------------------------------------------------------

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string ip = prefix + ".idx", bp = prefix + ".bin";
  idx_ = std::make_unique<MappedFile>(ip);
  bin_ = std::make_unique<MappedFile>(bp);
  const uint8_t* p = idx_->data();
  const size_t n = idx_->size();
  LOOM_CHECK(n >= kHeaderBytes, ip, ": truncated header (", n, " bytes, need ", kHeaderBytes, ")");
  LOOM_CHECK(std::memcmp(p, kMagic, sizeof kMagic) == 0, ip,
             ": bad magic (not a Megatron MMIDIDX index)");
  uint64_t version = load<uint64_t>(p + 9);
  LOOM_CHECK(version == 1, ip, ": unsupported version ", version, " (expected 1)");
  uint8_t code = p[17];
  LOOM_CHECK(code >= 1 && code <= 8, ip, ": unknown dtype code ", int(code));
  dtype_ = TokenDType(code);
  LOOM_CHECK(dtype_ != TokenDType::Float32 && dtype_ != TokenDType::Float64, ip, ": dtype ",
             dtype_name(dtype_), " cannot hold token ids");
  uint64_t s = load<uint64_t>(p + 18), d = load<uint64_t>(p + 26);
  LOOM_CHECK(s < (uint64_t(1) << 40) && d >= 1 && d < (uint64_t(1) << 40), ip,
             ": implausible counts (sequences ", s, ", document indices ", d, ")");
  const uint64_t need = kHeaderBytes + s * 12 + d * 8;
  // Megatron may append one int8 "mode" per sequence (multimodal); nothing else may follow.
  LOOM_CHECK(n == need || n == need + s, ip, ": size ", n, " bytes does not match ", s,
             " sequences and ", d, " document indices (expected ", need, ")");
  n_sequences_ = int64_t(s);
  n_doc_indices_ = int64_t(d);
  lengths_ = p + kHeaderBytes;
  pointers_ = lengths_ + s * 4;
  doc_indices_ = pointers_ + s * 8;

  const uint64_t es = dtype_size(dtype_);
  for (int64_t i = 0; i < n_sequences_; ++i) {
    int32_t len = sequence_length(i);
    int64_t ptr = sequence_pointer(i);
    LOOM_CHECK(len >= 0, ip, ": sequence_lengths[", i, "] = ", len, " is negative");
    LOOM_CHECK(ptr >= 0 && uint64_t(ptr) + uint64_t(len) * es <= bin_->size(), ip, ": sequence ", i,
               " (pointer ", ptr, ", length ", len, ") lies outside ", bp, " (", bin_->size(),
               " bytes; truncated?)");
    n_tokens_ += uint64_t(len);
  }
  int64_t prev = 0;
  for (int64_t k = 0; k < n_doc_indices_; ++k) {
    int64_t v = document_index(k);
    LOOM_CHECK(v >= prev && v <= n_sequences_ && (k > 0 || v == 0), ip, ": document_indices[", k,
               "] = ", v, " is out of order or out of range");
    prev = v;
  }
  LOOM_CHECK(prev == n_sequences_, ip, ": last document index ", prev,
             " does not equal the sequence count ", n_sequences_);
}

int32_t IndexedDataset::sequence_length(int64_t i) const {
  return load<int32_t>(lengths_ + size_t(i) * 4);
}
int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  return load<int64_t>(pointers_ + size_t(i) * 8);
}
int64_t IndexedDataset::document_index(int64_t k) const {
  return load<int64_t>(doc_indices_ + size_t(k) * 8);
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t n, int32_t* out) const {
  LOOM_CHECK(
      i >= 0 && i < n_sequences_ && offset >= 0 && n >= 0 && offset + n <= sequence_length(i),
      prefix_, ": read of sequence ", i, " [", offset, ", ", offset + n, ") out of range");
  if (n == 0) return;  // an empty sequence: `out` may be null, and memcpy must not see it
  const uint8_t* src = bin_->data() + sequence_pointer(i) + offset * int64_t(dtype_size(dtype_));
  switch (dtype_) {
    case TokenDType::UInt16:
      for (int64_t k = 0; k < n; ++k) out[k] = load<uint16_t>(src + 2 * k);
      break;
    case TokenDType::Int32:
      std::memcpy(out, src, size_t(n) * 4);
      break;
    case TokenDType::Int16:
      for (int64_t k = 0; k < n; ++k) out[k] = load<int16_t>(src + 2 * k);
      break;
    case TokenDType::UInt8:
      for (int64_t k = 0; k < n; ++k) out[k] = src[k];
      break;
    case TokenDType::Int8:
      for (int64_t k = 0; k < n; ++k) out[k] = int8_t(src[k]);
      break;
    case TokenDType::Int64:
      for (int64_t k = 0; k < n; ++k) {
        int64_t v = load<int64_t>(src + 8 * k);
        LOOM_CHECK(v >= INT32_MIN && v <= INT32_MAX, prefix_, ": token ", v, " does not fit int32");
        out[k] = int32_t(v);
      }
      break;
    default:
      fail(prefix_, ": cannot read dtype ", dtype_name(dtype_));
  }
}

std::vector<int32_t> IndexedDataset::sequence(int64_t i) const {
  std::vector<int32_t> out(static_cast<size_t>(sequence_length(i)));
  read(i, 0, int64_t(out.size()), out.data());
  return out;
}

std::vector<int32_t> IndexedDataset::document(int64_t k) const {
  LOOM_CHECK(k >= 0 && k < num_documents(), prefix_, ": document ", k, " out of range");
  std::vector<int32_t> out;
  for (int64_t i = document_index(k); i < document_index(k + 1); ++i) {
    auto s = sequence(i);
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

}  // namespace loom::data
