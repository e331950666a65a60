#include "ckpt/reshard.h"

#include <cstring>
#include <vector>

#include "core/error.h"

namespace loom::ckpt {

void extract_local(const ParamInfo& p, const float* whole, int64_t begin, int64_t n, float* out) {
  for_each_global_run(p, begin, n, [&](int64_t local, int64_t global, int64_t len) {
    std::memcpy(out + (local - begin), whole + global, sizeof(float) * len);
  });
}

bool flat_range(const ShardInfo& shard, const Shape& local, int64_t* global, int64_t* offset) {
  const Shape& g = shard.global_shape;
  const Shape off = shard.global_offset.empty() ? Shape(g.size(), 0) : shard.global_offset;
  if (g.size() != local.size() || off.size() != g.size()) return false;
  int64_t inner = 1;
  for (size_t d = 1; d < g.size(); ++d) {
    if (g[d] != local[d] || off[d] != 0) return false;
    inner *= g[d];
  }
  *global = numel_of(g);
  *offset = g.empty() ? 0 : off[0] * inner;
  return true;
}

namespace {

// One destination piece and the whole tensor it is extracted from.
struct Copy {
  const ParamInfo* param;
  Tensor whole;    // a view into the mapping (or, unaligned, a copy)
  int64_t offset;  // within the local parameter
  Tensor dst;
};

// The whole tensor `name` of `file` as the source of local parameter `p`, checked.
Tensor whole_source(const SafetensorsReader& file, const std::string& name, const ParamInfo& p,
                    const std::string& what) {
  LOOM_CHECK(file.contains(name), file.path(), ": no tensor '", name, "' for ", what);
  const auto& e = file.entry(name);
  LOOM_CHECK(e.dtype == DType::F32, file.path(), ": tensor '", name, "' is ", dtype_name(e.dtype),
             ", expected F32");
  LOOM_CHECK(!e.shard.sharded(), file.path(), ": tensor '", name,
             "' is a shard: not a one-process checkpoint");
  const Shape want = p.sharded() ? p.global_shape : p.shape;
  LOOM_CHECK(e.shape == want, file.path(), ": tensor '", name, "' has shape ", shape_str(e.shape),
             ", the model's whole tensor has ", shape_str(want));
  // A view into the mapping: only the pages of the rows copied are read.
  return file.view(name);
}

// The destination piece `t` of local parameter `param` as a flat range, checked.
Copy plan(const NamedTensor& t, const ParamInfo& param, Tensor whole) {
  const int64_t n = t.tensor.numel();
  int64_t local = n, offset = 0;
  if (t.shard.sharded())
    LOOM_CHECK(flat_range(t.shard, t.tensor.shape(), &local, &offset), "init_from: '", t.name,
               "' is not a contiguous range of its flattened local parameter");
  LOOM_CHECK(local == param.numel && offset >= 0 && offset + n <= local, "init_from: '", t.name,
             "' covers [", offset, ", ", offset + n, ") of ", local,
             " elements; the local parameter has ", param.numel);
  LOOM_CHECK(t.tensor.dtype() == DType::F32, "init_from: '", t.name, "' is not F32");
  return {&param, whole, offset, t.tensor};
}

}  // namespace

void fill_from_whole(const Checkpoint& whole, const ParamSet& local, const TensorList& model,
                     const TensorList& optim) {
  std::vector<Copy> copies;
  for (const NamedTensor& t : model) {
    LOOM_CHECK(local.has(t.name), "init_from: '", t.name, "' is not a parameter of this model");
    const ParamInfo& p = local.info(t.name);
    copies.push_back(plan(t, p, whole_source(whole.model(), t.name, p, "the weights")));
  }
  for (const NamedTensor& t : optim) {
    const size_t dot = t.name.find('.');
    LOOM_CHECK(dot != std::string::npos && local.has(t.name.substr(dot + 1)), "init_from: '",
               t.name, "' is not the state of a parameter of this model");
    const std::string prefix = t.name.substr(0, dot + 1), param = t.name.substr(dot + 1);
    const ParamInfo& p = local.info(param);
    // fp32 master weights the one-process optimizer does not keep equal its weights.
    const bool from_model = prefix == "master." && !whole.optim().contains(t.name);
    Tensor src = from_model ? whole_source(whole.model(), param, p, t.name)
                            : whole_source(whole.optim(), t.name, p, "the optimizer");
    copies.push_back(plan(t, p, src));
  }
  for (const Copy& c : copies)
    extract_local(*c.param, c.whole.data<float>(), c.offset, c.dst.numel(), c.dst.data<float>());
}

}  // namespace loom::ckpt
