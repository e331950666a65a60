#include "infer/weight_quant.h"

#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "infer/decode_bench.h"
#include "infer/decode_profile.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/gemm_lowp.h"
#include "kernels/cpu/gemm_lowp_pages.h"

namespace loom::infer {

// One linear layer's low-precision copy, as the GEMM recipe the model calls instead of its own
// fp32 matmul (the fp32 weight it is handed is ignored).
class QuantizedWeights::Layer : public GemmRecipe {
 public:
  // `amax`: each output row's largest magnitude over every tensor-parallel shard of the row
  // (nullptr: the rows here are whole). Leaves ok() false, the copy unusable, when a row holds
  // a NaN or an infinity: no scale (nor meaning) for it. `dst`: room for the in * out copied
  // weights (QuantizedWeights's one allocation; unused for F32).
  Layer(WeightType t, const float* w, int in, int out, const float* amax, void* dst)
      : type_(t), in_(in), out_(out), q_(dst) {
    const size_t n = size_t(in) * size_t(out);
    if (t == WeightType::F32) return;  // the model's own weights, read in place
    if (t == WeightType::BF16) {
      cpu::f32_to_bf16_array(w, static_cast<uint16_t*>(q_), n);
    } else if (t == WeightType::FP8) {
      scale_.resize(size_t(out));
      ok_ = cpu::quantize_fp8_rows(w, out, in, static_cast<uint8_t*>(q_), scale_.data(), amax);
    } else {
      scale_.resize(size_t(out));
      ok_ = cpu::quantize_int8_rows(w, out, in, static_cast<int8_t*>(q_), scale_.data(), amax);
    }
  }
  bool ok() const { return ok_; }
  void forward(Backend& be, float* y, ActIn x_in, const float* w, const float* b, int N, int in,
               int out) override {
    LOOM_CHECK(in == in_ && out == out_, "a quantised linear layer of [", in_, ", ", out_,
               "] called as [", in, ", ", out, "]");
    // (Bytes: the weights and scales, read once for all N rows.)
    ProfileScope profile(DecodeProfile::kGemv,
                         double(in) * out * weight_bytes(type_) + double(scale_.size()) * 4);
    const float* x = x_in.widened(be, int64_t(N) * in, x32_);
    if (type_ == WeightType::F32) {
      if (N <= cpu::kLowpGemvRows)
        cpu::gemv_f32w(y, x, w, b, N, in, out);
      else
        be.matmul_forward(y, x, w, b, N, in, out);
    } else if (type_ == WeightType::BF16)
      cpu::linear_bf16w(y, x, static_cast<const uint16_t*>(q_), b, N, in, out);
    else if (type_ == WeightType::FP8)
      cpu::linear_fp8w(y, x, static_cast<const uint8_t*>(q_), scale_.data(), b, N, in, out);
    else
      cpu::linear_int8w(y, x, static_cast<const int8_t*>(q_), scale_.data(), b, N, in, out);
  }
  void backward(Backend&, float*, float*, float*, const float*, ActIn, const float*, int, int,
                int) override {
    fail("weight-only ", weight_type_name(type_), " weights are for serving (forward only)");
  }
  int64_t bytes() const {
    return type_ == WeightType::F32
               ? 0
               : int64_t(in_) * out_ * weight_bytes(type_) + int64_t(scale_.size()) * 4;
  }
  static int weight_bytes(WeightType t) {
    return t == WeightType::F32 ? 4 : t == WeightType::BF16 ? 2 : 1;
  }

 private:
  WeightType type_;
  int in_, out_;
  bool ok_ = true;
  void* q_;  // bf16 words, int8 values or E4M3 codes (not F32)
  std::vector<float> scale_;
  std::vector<float> x32_;  // x widened from bf16 storage
};

WeightType weight_type_from_name(const std::string& name) {
  if (name == "fp32") return WeightType::F32;
  if (name == "bf16") return WeightType::BF16;
  if (name == "int8") return WeightType::INT8;
  if (name == "fp8") return WeightType::FP8;
  fail("unknown weight type '", name, "' (known: fp32, bf16, int8, fp8)");
}

const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::F32:
      return "fp32";
    case WeightType::BF16:
      return "bf16";
    case WeightType::INT8:
      return "int8";
    case WeightType::FP8:
      return "fp8";
  }
  return "?";
}

namespace {

// The row-parallel linear layers of the tensor-parallel layout (model/decoder.h): the attention
// output and the MLP's second projection hold a slice of every weight row's columns (their
// input is split over the ranks); the others hold whole rows of their own (column-parallel:
// qkv, the MLP's first projection; the head by vocabulary).
bool row_parallel(const std::string& linear) {
  const auto ends = [&](const std::string& s) {
    return linear.size() >= s.size() && linear.compare(linear.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".attn.proj") || ends(".mlp.proj");
}

}  // namespace

QuantizedWeights::QuantizedWeights(Decoder& model, WeightType type) : model_(model), type_(type) {
  // Under tensor parallelism every rank quantises its own shard. Rows of a column-parallel
  // layer are whole on one rank, so their per-channel scales are the one-process model's. A
  // row-parallel shard sees part of each row: the row's largest magnitude is the maximum over
  // the ranks (an all-reduce), so every rank scales its part as the whole row is scaled, and the
  // partial products sum to the one-process result up to summation order.
  const TensorParallel& tp = model.tensor_parallel();
  const bool scaled = type == WeightType::INT8 || type == WeightType::FP8;
  const std::vector<Decoder::LinearInfo> linears = model.linears();
  ParamSet& p = model.params();
  // Decode reads every weight once per token: the copies lie in one allocation on huge pages
  // (kernels/cpu/gemm_lowp_pages.h), each layer's at a 64-byte boundary; fp32 weights are read
  // where the model keeps them, whose pages are collapsed into huge ones in place.
  std::vector<size_t> offset;
  size_t total = 0;
  for (const Decoder::LinearInfo& l : linears) {
    offset.push_back(total);
    total += (size_t(l.in) * size_t(l.out) * size_t(Layer::weight_bytes(type)) + 63) / 64 * 64;
  }
  if (type == WeightType::F32)
    cpu::use_huge_pages(p.host_data("decode weights"), size_t(p.total()) * sizeof(float));
  else
    store_ = cpu::HugeBuffer(total);
  int bad = -1;  // the first layer holding a NaN or an infinity
  std::vector<float> amax;
  for (size_t i = 0; i < linears.size(); ++i) {
    const Decoder::LinearInfo& l = linears[i];
    const std::string w = l.name == "head" ? (p.has("head.weight") ? "head.weight" : "embed.wte")
                                           : l.name + ".weight";
    LOOM_CHECK(p.has(w), "linear layer ", l.name, " has no parameter ", w);
    LOOM_CHECK(p.info(w).numel == int64_t(l.in) * l.out, "parameter ", w, " has ", p.info(w).numel,
               " elements, not the [", l.out, ", ", l.in, "] of ", l.name);
    const bool across = scaled && tp.size > 1 && row_parallel(l.name);
    if (across) {
      LOOM_CHECK(tp.comm, "a tensor-parallel model without its communicator");
      amax.resize(size_t(l.out));
      cpu::row_amax(p.host_ptr(w, "weight quantisation"), l.out, l.in,
                    amax.data());  // +inf marks a NaN, on every rank
      tp.comm->all_reduce(amax.data(), l.out, DType::F32, comm::ReduceOp::Max);
    }
    layers_.push_back(std::make_unique<Layer>(
        type, p.host_ptr(w, "weight quantisation"), l.in, l.out, across ? amax.data() : nullptr,
        type == WeightType::F32 ? nullptr : store_.as<uint8_t>() + offset[i]));
    if (bad < 0 && !layers_.back()->ok()) bad = int(i);
  }
  // A NaN or infinite weight is refused, naming the layer, on every rank together (no rank
  // left waiting in a collective): the lowest bad layer index over the ranks.
  int64_t key = bad < 0 ? 0 : int64_t(linears.size()) - bad;
  if (scaled && tp.size > 1) key = tp.comm->all_reduce_scalar(key, comm::ReduceOp::Max);
  LOOM_CHECK(key == 0, "linear layer ", linears[linears.size() - size_t(key)].name,
             ": a weight row holds NaN or infinity; it cannot be stored as ",
             weight_type_name(type), tp.size > 1 ? " (on one of the tensor-parallel ranks)" : "");
  for (size_t i = 0; i < linears.size(); ++i)
    model.attach_recipe(linears[i].name, layers_[i].get());
}

QuantizedWeights::~QuantizedWeights() {
  if (layers_.empty()) return;
  for (const Decoder::LinearInfo& l : model_.linears()) model_.attach_recipe(l.name, nullptr);
}

double QuantizedWeights::bytes_per_token() const {
  switch (type_) {
    case WeightType::BF16:
      return decode_weight_bytes(model_, 2);
    case WeightType::INT8:
    case WeightType::FP8:
      return decode_weight_bytes(model_, 1, 4);
    default:
      return decode_weight_bytes(model_, 4);
  }
}

int64_t QuantizedWeights::stored_bytes() const {
  int64_t n = 0;
  for (const auto& l : layers_) n += l->bytes();
  return n;
}

}  // namespace loom::infer
