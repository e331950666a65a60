#include "core/tfevents.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "core/error.h"
#include "core/fs.h"

namespace loom {

namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1 ? 0x82F63B78u : 0u);  // reflected poly
    t[i] = c;
  }
  return t;
}

// Protocol buffer wire format: what the three messages below need of it.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>(v | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

template <typename T>
void fixed(std::string& out, T v) {  // little-endian fixed32 / fixed64
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void bytes_field(std::string& out, int field, std::string_view s) {
  varint(out, static_cast<uint64_t>(field) << 3 | 2);
  varint(out, s.size());
  out.append(s);
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
// summary = 5 (Summary { repeated Value value = 1 }, Value { tag = 1, simple_value = 2 }).
std::string event_header(int64_t step, double wall_time) {
  std::string e;
  varint(e, 1 << 3 | 1);
  fixed(e, wall_time);
  varint(e, 2 << 3 | 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t masked_crc32c(std::string_view data) {
  uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

TfEventsWriter::TfEventsWriter(const std::string& dir) {
  make_dirs(dir);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = cat(dir, "/events.out.tfevents.", static_cast<int64_t>(std::time(nullptr)), ".", host,
              ".", static_cast<int64_t>(getpid()));
  f_ = std::fopen(path_.c_str(), "wb");
  LOOM_CHECK(f_, path_, ": cannot create TensorBoard event file (", std::strerror(errno), ")");
  std::string e = event_header(0, static_cast<double>(std::time(nullptr)));
  bytes_field(e, 3, "brain.Event:2");
  record(e);
}

TfEventsWriter::~TfEventsWriter() {
  if (f_) std::fclose(f_);
}

void TfEventsWriter::scalars(int64_t step, double wall_time,
                             const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);
    varint(value, 2 << 3 | 5);
    fixed(value, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  std::string e = event_header(step, wall_time);
  bytes_field(e, 5, summary);
  record(e);
}

void TfEventsWriter::record(const std::string& event) {
  std::string r;
  fixed(r, static_cast<uint64_t>(event.size()));
  fixed(r, masked_crc32c(r));
  r += event;
  fixed(r, masked_crc32c(event));
  LOOM_CHECK(std::fwrite(r.data(), 1, r.size(), f_) == r.size() && std::fflush(f_) == 0, path_,
             ": cannot write TensorBoard event (", std::strerror(errno), ")");
}

}  // namespace loom
