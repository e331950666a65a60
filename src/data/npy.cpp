#include "data/npy.h"

#include <charconv>
#include <cstring>

#include "core/error.h"
#include "core/fs.h"

namespace loom::data {

namespace {

std::string header(const char* descr, const std::vector<int64_t>& shape) {
  std::string sh = "(";  // numpy's spelling: (3,) and (3, 2)
  for (size_t i = 0; i < shape.size(); ++i) {
    sh += std::to_string(shape[i]);
    if (shape.size() == 1)
      sh += ",";
    else if (i + 1 < shape.size())
      sh += ", ";
  }
  sh += ")";
  std::string dict =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + sh;
  dict += ", }";
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string h = "\x93NUMPY";
  h += char(1);
  h += char(0);
  uint16_t len = uint16_t(dict.size());
  h.append(reinterpret_cast<const char*>(&len), 2);
  return h + dict;
}

template <typename T>
void write_impl(const std::string& path, const std::vector<T>& data, std::vector<int64_t> shape,
                const char* descr) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  LOOM_CHECK(n == int64_t(data.size()), path, ": shape does not match data size");
  AtomicFile f(path);
  f.write(header(descr, shape));
  f.write(data.data(), data.size() * sizeof(T));
  f.commit();
}

template <typename T>
std::vector<T> read_impl(const std::string& path, std::vector<int64_t>* shape, const char* descr) {
  std::string s = read_file(path);
  LOOM_CHECK(s.size() >= 10 && s.compare(0, 6, "\x93NUMPY") == 0 && s[6] == 1, path,
             ": not a version 1 .npy file");
  uint16_t len;
  std::memcpy(&len, s.data() + 8, 2);
  LOOM_CHECK(s.size() >= 10u + len, path, ": truncated header");
  std::string dict = s.substr(10, len);
  LOOM_CHECK(dict.find(std::string("'descr': '") + descr + "'") != std::string::npos &&
                 dict.find("'fortran_order': False") != std::string::npos,
             path, ": expected dtype ", descr, " in C order");
  size_t open = dict.find("'shape': ("), close = dict.find(')', open);
  LOOM_CHECK(open != std::string::npos && close != std::string::npos, path, ": no shape");
  shape->clear();
  int64_t n = 1;
  for (size_t p = open + 10; p < close;) {
    size_t q = dict.find_first_of(",)", p);
    LOOM_CHECK(q != std::string::npos && q <= close, path, ": malformed shape");
    std::string num = dict.substr(p, q - p);
    const size_t first = num.find_first_not_of(' '), last = num.find_last_not_of(' ');
    if (first != std::string::npos) {
      // A dimension is a non-negative integer whose product with the others still counts
      // elements of a file that fits in memory (the size check below then compares exactly).
      int64_t d = -1;
      const char* b = num.data() + first;
      const char* e = num.data() + last + 1;
      auto [end, ec] = std::from_chars(b, e, d);
      LOOM_CHECK(ec == std::errc() && end == e && d >= 0, path, ": shape dimension '",
                 num.substr(first, last + 1 - first), "' is not a non-negative integer");
      LOOM_CHECK(d == 0 || n <= (int64_t(1) << 40) / d, path, ": shape ",
                 dict.substr(open + 9, close - open - 8), " holds more than 2^40 elements");
      shape->push_back(d);
      n *= d;
    }
    p = q + 1;
  }
  const size_t body = 10u + len;
  LOOM_CHECK(s.size() - body == size_t(n) * sizeof(T), path, ": size does not match shape");
  std::vector<T> out(static_cast<size_t>(n));
  std::memcpy(out.data(), s.data() + body, out.size() * sizeof(T));
  return out;
}

}  // namespace

void write_npy(const std::string& path, const std::vector<int32_t>& data,
               std::vector<int64_t> shape) {
  write_impl(path, data, std::move(shape), "<i4");
}
void write_npy(const std::string& path, const std::vector<int64_t>& data,
               std::vector<int64_t> shape) {
  write_impl(path, data, std::move(shape), "<i8");
}
std::vector<int32_t> read_npy_i32(const std::string& path, std::vector<int64_t>* shape) {
  return read_impl<int32_t>(path, shape, "<i4");
}
std::vector<int64_t> read_npy_i64(const std::string& path, std::vector<int64_t>* shape) {
  return read_impl<int64_t>(path, shape, "<i8");
}

}  // namespace loom::data
