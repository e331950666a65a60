// Test-side reader of TensorBoard event files, independent of the writer: TFRecord framing with
// both checksums verified (gtest expectations), and the Event fields the writer may use.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/fs.h"
#include "core/tfevents.h"

namespace loom::test {

struct Reader {
  std::string_view s;
  size_t p = 0;
  bool done() const { return p >= s.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      unsigned char b = static_cast<unsigned char>(s.at(p++));
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  template <typename T>
  T fixed() {
    T v;
    std::memcpy(&v, s.substr(p, sizeof(T)).data(), sizeof(T));
    p += sizeof(T);
    return v;
  }
  std::string_view bytes() {
    size_t n = varint();
    std::string_view b = s.substr(p, n);
    p += n;
    return b;
  }
};

struct Event {
  double wall_time = 0;
  int64_t step = -1;
  std::string file_version;
  std::map<std::string, float> scalars;
};

inline Event decode_event(std::string_view data) {
  Event e;
  for (Reader r{data}; !r.done();) {
    uint64_t key = r.varint();
    switch (key) {
      case 1 << 3 | 1:
        e.wall_time = r.fixed<double>();
        break;
      case 2 << 3 | 0:
        e.step = static_cast<int64_t>(r.varint());
        break;
      case 3 << 3 | 2:
        e.file_version = std::string(r.bytes());
        break;
      case 5 << 3 | 2:
        for (Reader summary{r.bytes()}; !summary.done();) {
          EXPECT_EQ(summary.varint(), 1u << 3 | 2);  // Summary.value
          std::string tag;
          float v = NAN;
          for (Reader value{summary.bytes()}; !value.done();) {
            uint64_t k = value.varint();
            if (k == (1 << 3 | 2))
              tag = std::string(value.bytes());
            else if (k == (2 << 3 | 5))
              v = value.fixed<float>();
            else
              ADD_FAILURE() << "unexpected Summary.Value field key " << k;
          }
          e.scalars[tag] = v;
        }
        break;
      default:
        ADD_FAILURE() << "unexpected Event field key " << key;
        return e;
    }
  }
  return e;
}

// Every record of a TFRecord file, with both checksums verified.
inline std::vector<Event> read_events(const std::string& path) {
  std::string all = read_file(path);
  std::vector<Event> out;
  for (Reader r{all}; !r.done();) {
    std::string_view len_bytes = r.s.substr(r.p, 8);
    uint64_t len = r.fixed<uint64_t>();
    EXPECT_EQ(r.fixed<uint32_t>(), masked_crc32c(len_bytes));
    std::string_view data = r.s.substr(r.p, len);
    r.p += len;
    EXPECT_EQ(r.fixed<uint32_t>(), masked_crc32c(data));
    out.push_back(decode_event(data));
  }
  return out;
}

}  // namespace loom::test
