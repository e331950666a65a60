// Shared by the Hugging Face import tests: tiny model shapes and a safetensors writer for
// dtypes Loom has no type for (the Hub's BOOL attention-mask buffers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/hf_export.h"
#include "ckpt/test_util.h"
#include "core/fs.h"
#include "core/json.h"

namespace loom::ckpt::testing {

inline HfModelShape tiny_llama3() {
  HfModelShape s;
  s.family = "llama";
  s.n_layer = 2;
  s.d_model = 8;
  s.n_head = 2;
  s.n_kv_head = 1;
  s.head_dim = 4;
  s.d_ff = 12;
  s.vocab = 13;
  s.max_seq = 64;
  s.rope_theta = 500000.f;
  s.rope_scaling = {8.f, 1.f, 4.f, 16};
  s.tied = false;
  s.bos_token_id = 11;
  s.eos_token_id = 12;
  return s;
}

inline TensorMap random_params_of(const HfModelShape& s, uint32_t seed) {
  TensorMap m;
  for (const auto& [name, shape] : loom_param_shapes(s))
    m[name] = random_tensor(shape, DType::F32, seed++);
  return m;
}

// `tensors` plus extra entries of any dtype name given as raw bytes, in one safetensors file.
struct RawTensor {
  std::string name, dtype;
  Shape shape;
  std::string bytes;
};
inline void write_safetensors_with(const std::string& path, const TensorMap& tensors,
                                   const std::vector<RawTensor>& raw) {
  Json header = Json::object();
  std::string data;
  auto add = [&](const std::string& name, const std::string& dtype, const Shape& shape,
                 std::string_view bytes) {
    Json e = Json::object();
    e["dtype"] = dtype;
    Json dims = Json::array();
    for (int64_t d : shape) dims.push_back(Json(d));
    e["shape"] = dims;
    e["data_offsets"] =
        Json(Json::Array{Json(uint64_t(data.size())), Json(uint64_t(data.size() + bytes.size()))});
    header[name] = e;
    data.append(bytes);
  };
  for (const auto& [name, t] : tensors)
    add(name, "F32", t.shape(),
        std::string_view(reinterpret_cast<const char*>(t.raw()), size_t(t.nbytes())));
  for (const RawTensor& r : raw) add(r.name, r.dtype, r.shape, r.bytes);
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  for (int b = 0; b < 8; ++b) file[size_t(b)] = char(uint64_t(h.size()) >> (8 * b));
  write_file_atomic(path, file + h + data);
}

}  // namespace loom::ckpt::testing
