#include "infer/embeddings.h"

#include <cmath>

#include "core/error.h"
#include "model/decoder.h"

namespace loom::infer {

Pooling pooling_from_name(const std::string& name) {
  if (name == "last") return Pooling::Last;
  if (name == "mean") return Pooling::Mean;
  throw Error(cat("unknown pooling '", name, "' (expected last or mean)"));
}

const char* pooling_name(Pooling p) {
  return p == Pooling::Mean ? "mean" : "last";
}

void check_embedding_inputs(const std::vector<std::vector<int32_t>>& inputs, int vocab,
                            int max_seq) {
  LOOM_CHECK(!inputs.empty(), "no inputs to embed");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int32_t>& in = inputs[i];
    LOOM_CHECK(!in.empty(), "input ", i, " is empty");
    LOOM_CHECK(int64_t(in.size()) <= max_seq, "input ", i, " has ", in.size(),
               " tokens; this model's maximum context length is ", max_seq, " tokens");
    for (int32_t t : in)
      LOOM_CHECK(t >= 0 && t < vocab, "input ", i, " holds token id ", t,
                 " outside the vocabulary [0, ", vocab, ")");
  }
}

void pool_hidden(const float* rows, int n, int d, const EmbeddingOptions& opt, float* out) {
  std::vector<double> acc(size_t(d), 0.0);
  const int first = opt.pooling == Pooling::Last ? n - 1 : 0;
  for (int r = first; r < n; ++r)
    for (int j = 0; j < d; ++j) acc[size_t(j)] += rows[int64_t(r) * d + j];
  const double count = n - first;
  double norm2 = 0;
  for (double& v : acc) {
    v /= count;
    norm2 += v * v;
  }
  const double scale = opt.normalize && norm2 > 0 ? 1.0 / std::sqrt(norm2) : 1.0;
  for (int j = 0; j < d; ++j) out[j] = static_cast<float>(acc[size_t(j)] * scale);
}

std::vector<std::vector<float>> embed(Decoder& model,
                                      const std::vector<std::vector<int32_t>>& inputs,
                                      const EmbeddingOptions& opt) {
  const ModelConfig& cfg = model.config();
  check_embedding_inputs(inputs, cfg.vocab, cfg.max_seq);
  LOOM_CHECK(opt.max_batch_tokens > 0, "max_batch_tokens must be positive");
  const int C = cfg.d_model;
  std::vector<std::vector<float>> out(inputs.size(), std::vector<float>(size_t(C)));
  std::vector<int32_t> tokens, positions, cu;
  std::vector<int> rows;
  std::vector<float> hidden;
  size_t next = 0;
  while (next < inputs.size()) {
    // Inputs side by side up to the token budget (at least one).
    const size_t begin = next;
    tokens.clear();
    positions.clear();
    cu.assign(1, 0);
    while (next < inputs.size() && (next == begin || int64_t(tokens.size() + inputs[next].size()) <=
                                                         int64_t(opt.max_batch_tokens))) {
      const std::vector<int32_t>& in = inputs[next++];
      for (size_t i = 0; i < in.size(); ++i) {
        tokens.push_back(in[i]);
        positions.push_back(static_cast<int32_t>(i));
      }
      cu.push_back(static_cast<int32_t>(tokens.size()));
    }
    // Mean pooling reads every row, last pooling each input's last.
    rows.clear();
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
      const int from = opt.pooling == Pooling::Mean ? cu[s] : cu[s + 1] - 1;
      for (int r = from; r < cu[s + 1]; ++r) rows.push_back(r);
    }
    ModelInput mi;
    mi.tokens = tokens.data();
    mi.positions = positions.data();
    mi.cu_seqlens = cu.data();
    mi.N = static_cast<int>(tokens.size());
    mi.nseq = static_cast<int>(cu.size() - 1);
    hidden.resize(rows.size() * size_t(C));
    model.forward_hidden(mi, rows, hidden.data());
    const float* h = hidden.data();
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
      const int n = opt.pooling == Pooling::Mean ? cu[s + 1] - cu[s] : 1;
      pool_hidden(h, n, C, opt, out[begin + s].data());
      h += int64_t(n) * C;
    }
  }
  return out;
}

std::vector<std::vector<float>> ModelRunner::embed(const std::vector<std::vector<int32_t>>&,
                                                   const EmbeddingOptions&) {
  throw Error("this model runner computes no embeddings");
}

}  // namespace loom::infer
