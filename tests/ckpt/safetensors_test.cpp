#include "ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "ckpt/test_util.h"
#include "core/error.h"
#include "core/json.h"

namespace loom::ckpt {
namespace {

using testing::error_of;
using testing::random_tensor;
using testing::same_tensor;
using testing::ScratchDir;

const DType kAll[] = {DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2,
                      DType::I32, DType::I64,  DType::U8,  DType::U16};

// A file assembled byte by byte from a header text and a data buffer, independent of the writer.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>(n >> (8 * b));
  return out + header + data;
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  ScratchDir dir;
  TensorMap in;
  uint32_t seed = 1;
  for (DType t : kAll) in[cat("t_", safetensors_dtype_name(t))] = random_tensor({3, 5}, t, seed++);
  in["scalar"] = random_tensor({}, DType::F32, 99);
  in["empty"] = Tensor::zeros({0, 4}, DType::BF16);
  const Metadata meta = {{"format", "pt"}, {"note", "quote \" and newline \n"}};
  write_safetensors(dir / "a.safetensors", in, meta);

  SafetensorsReader r(dir / "a.safetensors");
  EXPECT_EQ(r.metadata(), meta);
  ASSERT_EQ(r.names().size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(r.contains(name)) << name;
    EXPECT_TRUE(same_tensor(r.load(name), t)) << name;
    EXPECT_TRUE(same_tensor(r.view(name), t)) << name;
    EXPECT_TRUE(r.entry(name).shard.is_default());
  }
  TensorMap all = r.load_all();
  EXPECT_EQ(all.size(), in.size());
}

TEST(Safetensors, FileLayoutFollowsTheFormat) {
  ScratchDir dir;
  TensorMap in = {{"w", random_tensor({2, 3}, DType::F32, 1)},
                  {"b", random_tensor({3}, DType::U8, 2)},
                  {"h", random_tensor({5}, DType::BF16, 3)}};
  write_safetensors(dir / "x.safetensors", in, {{"k", "v"}});
  const std::string bytes = read_file(dir / "x.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ(n % 8, 0u) << "header must be padded to 8 bytes";
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  Json h = Json::parse(header);
  EXPECT_EQ(h.at("__metadata__").at("k").as_string(), "v");
  EXPECT_EQ(h.at("w").at("dtype").as_string(), "F32");
  EXPECT_EQ(h.at("h").at("dtype").as_string(), "BF16");
  EXPECT_EQ(h.at("b").at("dtype").as_string(), "U8");
  // Largest element size first, packed with no gaps: w [0,24), h [24,34), b [34,37).
  auto offs = [&](const char* name) {
    auto& a = h.at(name).at("data_offsets").as_array();
    return std::make_pair(a[0].as_int(), a[1].as_int());
  };
  EXPECT_EQ(offs("w"), std::make_pair(int64_t{0}, int64_t{24}));
  EXPECT_EQ(offs("h"), std::make_pair(int64_t{24}, int64_t{34}));
  EXPECT_EQ(offs("b"), std::make_pair(int64_t{34}, int64_t{37}));
  EXPECT_EQ(bytes.size(), 8 + n + 37);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, in["w"].raw(), 24), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + 34, in["b"].raw(), 3), 0);
}

TEST(Safetensors, ReadsAHandBuiltFile) {
  ScratchDir dir;
  // Header without padding and with keys in file order; data: two floats then an int64.
  const std::string header =
      R"({"b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"m":"1"}})";
  float fs[2] = {1.5f, -2.25f};
  int64_t iv = -7;
  std::string data(reinterpret_cast<char*>(fs), 8);
  data += std::string(reinterpret_cast<char*>(&iv), 8);
  write_file_atomic(dir / "h.safetensors", raw_file(header, data));
  SafetensorsReader r(dir / "h.safetensors");
  Tensor a = r.load("a"), b = r.load("b");
  EXPECT_EQ(a.shape(), Shape({2}));
  EXPECT_EQ(a.data<float>()[0], 1.5f);
  EXPECT_EQ(a.data<float>()[1], -2.25f);
  EXPECT_EQ(b.dtype(), DType::I64);
  EXPECT_EQ(b.data<int64_t>()[0], -7);
  EXPECT_EQ(r.metadata().at("m"), "1");
}

TEST(Safetensors, WritesNonContiguousTensorsInLogicalOrder) {
  ScratchDir dir;
  Tensor m = random_tensor({4, 6}, DType::BF16, 5);
  Tensor t = m.transpose(0, 1);  // [6, 4] view
  ASSERT_FALSE(t.is_contiguous());
  write_safetensors(dir / "t.safetensors", TensorMap{{"t", t}});
  Tensor back = SafetensorsReader(dir / "t.safetensors").load("t");
  ASSERT_EQ(back.shape(), Shape({6, 4}));
  const uint16_t* src = m.data<uint16_t>();
  const uint16_t* dst = back.data<uint16_t>();
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(dst[i * 4 + j], src[j * 6 + i]);
}

// A tensor made as it is written (NamedTensor::fill: no memory of its own) is stored as the
// same tensor held in memory is, byte for byte, next to ordinary ones.
TEST(Safetensors, FilledTensorsAreWrittenAsHeldOnes) {
  ScratchDir dir;
  const Tensor a = random_tensor({3, 5}, DType::F32, 1), b = random_tensor({7}, DType::F32, 2);
  const Tensor c = random_tensor({2, 2}, DType::BF16, 3);
  write_safetensors(dir / "held.safetensors", TensorList{{"a", a}, {"b", b}, {"c", c}});
  int fills = 0;
  const auto fill_from = [&fills](const Tensor& t) {
    return [&fills, t](void* dst) {
      ++fills;
      std::memcpy(dst, t.raw(), t.nbytes());
    };
  };
  write_safetensors(
      dir / "filled.safetensors",
      TensorList{{"a", Tensor::view_of(nullptr, a.shape(), DType::F32), {}, fill_from(a)},
                 {"b", b},
                 {"c", Tensor::view_of(nullptr, c.shape(), DType::BF16), {}, fill_from(c)}});
  EXPECT_EQ(fills, 2);
  EXPECT_EQ(read_file(dir / "filled.safetensors"), read_file(dir / "held.safetensors"));
}

TEST(Safetensors, ShardInfoRoundTrips) {
  ScratchDir dir;
  TensorList in = {
      {"a", random_tensor({2, 3}, DType::F32, 1), {{8, 3}, {4, 0}, 0}},
      {"b", random_tensor({5}, DType::F32, 2), {{}, {}, 3}},  // unsharded replica 3
      {"c", random_tensor({5}, DType::F32, 3), {}},
  };
  write_safetensors(dir / "s.safetensors", in, {{"user", "x"}});
  SafetensorsReader r(dir / "s.safetensors");
  EXPECT_EQ(r.metadata(), (Metadata{{"user", "x"}})) << "shard keys must not leak into metadata";
  EXPECT_EQ(r.entry("a").shard.global_shape, Shape({8, 3}));
  EXPECT_EQ(r.entry("a").shard.global_offset, Shape({4, 0}));
  EXPECT_EQ(r.entry("a").shard.replica_id, 0);
  EXPECT_EQ(r.entry("b").shard.global_shape, Shape({5}));  // written explicitly
  EXPECT_EQ(r.entry("b").shard.replica_id, 3);
  EXPECT_TRUE(r.entry("c").shard.is_default());
  TensorList back = r.load_list();
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].name, "a");
  EXPECT_EQ(back[0].shard, in[0].shard);
  EXPECT_TRUE(same_tensor(back[0].tensor, in[0].tensor));
}

TEST(Safetensors, RejectsInconsistentShardInfo) {
  ScratchDir dir;
  TensorList bad = {{"a", random_tensor({2, 3}, DType::F32, 1), {{8, 3}, {7, 0}, 0}}};
  std::string e = error_of([&] { write_safetensors(dir / "s.safetensors", bad); });
  EXPECT_NE(e.find("'a'"), std::string::npos) << e;
  EXPECT_NE(e.find("does not fit"), std::string::npos) << e;
  EXPECT_FALSE(file_exists(dir / "s.safetensors"));
  // The same inconsistency in a file written by someone else is caught on read.
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"__metadata__":)"
      R"({"shard.a":"{\"global_shape\":[3],\"global_offset\":[2],\"replica_id\":0}"}})";
  write_file_atomic(dir / "r.safetensors", raw_file(header, "xy"));
  e = error_of([&] { SafetensorsReader r(dir / "r.safetensors"); });
  EXPECT_NE(e.find("r.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("does not fit"), std::string::npos) << e;
}

TEST(Safetensors, WriterRejectsBadInputWithoutTouchingTheFile) {
  ScratchDir dir;
  const std::string path = dir / "keep.safetensors";
  write_safetensors(path, TensorMap{{"x", random_tensor({4}, DType::F32, 1)}});
  const std::string before = read_file(path);
  TensorList dup = {{"x", random_tensor({4}, DType::F32, 1)},
                    {"x", random_tensor({4}, DType::U8, 2)}};
  EXPECT_NE(error_of([&] { write_safetensors(path, dup); }).find("duplicate"), std::string::npos);
  TensorList undef = {{"y", Tensor()}};
  EXPECT_NE(error_of([&] { write_safetensors(path, undef); }).find("'y'"), std::string::npos);
  TensorList reserved = {{"__metadata__", random_tensor({1}, DType::F32, 1)}};
  EXPECT_NE(error_of([&] { write_safetensors(path, reserved); }).find("reserved"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_safetensors(path, TensorMap{}, {{"shard.x", "{}"}});
            }).find("reserved"),
            std::string::npos);
  EXPECT_EQ(read_file(path), before);
  int files = 0;
  for (auto& de : std::filesystem::directory_iterator(dir.path())) {
    (void)de;
    ++files;
  }
  EXPECT_EQ(files, 1) << "no temporary files may be left behind";
}

struct BadFile {
  const char* label;
  std::string bytes;
  std::vector<std::string> expect;  // substrings of the error
};

TEST(Safetensors, ReaderRejectsCorruptFilesNamingFileAndTensor) {
  ScratchDir dir;
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data8(8, '\x01');
  std::string too_long = raw_file(ok_header, data8);
  too_long[0] = '\xff';
  too_long[1] = '\x10';
  std::vector<BadFile> cases = {
      {"short", "abc", {"too short"}},
      {"header_past_end", too_long, {"runs past the end"}},
      {"truncated_data", raw_file(ok_header, std::string(7, 'a')), {"'w'", "past the end"}},
      {"trailing", raw_file(ok_header, data8 + "zz"), {"trailing"}},
      {"bad_json", raw_file(R"({"w": {"dtype": )", data8), {"(header)"}},
      {"not_object", raw_file("[1, 2]", ""), {"not a JSON object"}},
      {"unknown_dtype",
       raw_file(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", data8),
       {"'w'", "unsupported dtype 'F64'"}},
      {"size_mismatch",
       raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8),
       {"'w'", "needs 12 bytes"}},
      {"negative_dim",
       raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8),
       {"'w'", "non-negative"}},
      {"missing_offsets",
       raw_file(R"({"w":{"dtype":"F32","shape":[2]}})", data8),
       {"'w'", "data_offsets"}},
      {"reversed",
       raw_file(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", data8),
       {"'w'", "end before"}},
      {"overlap",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                data8),
       {"'b'", "overlap", "'a'"}},
      {"gap",
       raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8),
       {"gap", "'a'"}},
      {"metadata_not_string",
       raw_file(R"({"__metadata__":{"k":1},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                data8),
       {"__metadata__ 'k'"}},
      {"shard_for_missing_tensor",
       raw_file(R"({"__metadata__":{"shard.zz":"{}"},"w":{"dtype":"F32","shape":[2],)"
                R"("data_offsets":[0,8]}})",
                data8),
       {"shard.zz", "names no tensor"}},
  };
  for (const BadFile& c : cases) {
    const std::string path = dir / (std::string(c.label) + ".safetensors");
    write_file_atomic(path, c.bytes);
    std::string e = error_of([&] { SafetensorsReader r(path); });
    EXPECT_NE(e.find(path), std::string::npos) << c.label << ": " << e;
    for (const std::string& s : c.expect)
      EXPECT_NE(e.find(s), std::string::npos) << c.label << ": '" << s << "' not in: " << e;
  }
  std::string e = error_of([&] { SafetensorsReader r(dir / "missing.safetensors"); });
  EXPECT_NE(e.find("missing.safetensors"), std::string::npos) << e;
}

TEST(Safetensors, TruncatingAValidFileIsAlwaysDetected) {
  ScratchDir dir;
  const std::string path = dir / "v.safetensors";
  write_safetensors(path, TensorMap{{"a", random_tensor({3, 3}, DType::F32, 1)},
                                    {"b", random_tensor({7}, DType::U8, 2)}});
  const std::string bytes = read_file(path);
  for (size_t cut : {size_t{0}, size_t{5}, size_t{8}, size_t{20}, bytes.size() - 1}) {
    write_file_atomic(dir / "cut.safetensors", bytes.substr(0, cut));
    std::string e = error_of([&] { SafetensorsReader r(dir / "cut.safetensors"); });
    EXPECT_NE(e.find("cut.safetensors"), std::string::npos) << "cut at " << cut << ": " << e;
  }
}

TEST(Safetensors, LookupOfAnUnknownNameNamesFileAndTensor) {
  ScratchDir dir;
  write_safetensors(dir / "a.safetensors", TensorMap{{"x", random_tensor({1}, DType::F32, 1)}});
  SafetensorsReader r(dir / "a.safetensors");
  EXPECT_FALSE(r.contains("y"));
  std::string e = error_of([&] { r.load("y"); });
  EXPECT_NE(e.find("a.safetensors"), std::string::npos);
  EXPECT_NE(e.find("'y'"), std::string::npos);
}

TEST(Safetensors, ViewOfMisalignedDataFallsBackToACopy) {
  ScratchDir dir;
  // One byte of U8 first puts the F32 tensor at an odd offset.
  const std::string header = R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("f":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  float v = 3.25f;
  write_file_atomic(
      dir / "m.safetensors",
      raw_file(padded, std::string("\x07") + std::string(reinterpret_cast<char*>(&v), 4)));
  SafetensorsReader r(dir / "m.safetensors");
  Tensor f = r.view("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.raw()) % 4, 0u);
  EXPECT_EQ(f.data<float>()[0], 3.25f);
}

}  // namespace
}  // namespace loom::ckpt
