#include "infer/model_runner.h"

#include "core/error.h"
#include "infer/decode_profile.h"
#include "infer/embeddings.h"

namespace loom::infer {
namespace {

// Layer by layer: write the chunks' new keys and values into the cache, then let every new
// query attend to its sequence's cached positions; both are Backend ops over the model's
// buffers and the step's chunk table.
struct PagedAttention : ForwardAttention {
  Backend* be = nullptr;
  const KvCacheView* cache = nullptr;
  const int32_t* table = nullptr;  // a PagedChunkTable in the backend's memory
  int nchunks = 0, rows = 0;
  double positions = 0;  // keys and values read: every cached and new position of a chunk
  void forward(int layer, const float* qkv, int ld, int Hq, int Hkv, int D, float scale, int window,
               float softcap, float* out) override {
    const bool fp8 = cache->spec.dtype == DType::F8E4M3;
    // Bytes per row of D: fp8's scale byte besides its codes.
    ProfileScope profile(DecodeProfile::kAttention,
                         positions * 2 * Hkv * (D * dtype_size(cache->spec.dtype) + (fp8 ? 1 : 0)));
    PagedKvBuffers kv;
    kv.k = cache->k[size_t(layer)];
    kv.v = cache->v[size_t(layer)];
    if (fp8) {
      kv.k_scale = cache->k_scale[size_t(layer)];
      kv.v_scale = cache->v_scale[size_t(layer)];
    }
    kv.dtype = cache->spec.dtype;
    kv.num_blocks = cache->num_blocks;
    kv.block_size = cache->block_size;
    kv.n_kv_head = Hkv;
    kv.head_dim = D;
    be->paged_kv_write(kv, qkv + Hq * D, qkv + (Hq + Hkv) * D, ld, table, nchunks, rows);
    if (window > 0 || softcap > 0)
      be->paged_attention_variant(out, qkv, ld, kv, table, nchunks, rows, Hq, scale, window,
                                  softcap);
    else
      be->paged_attention(out, qkv, ld, kv, table, nchunks, rows, Hq, scale);
  }
};

}  // namespace

DecoderRunner::DecoderRunner(Decoder& model) : model_(model) {
  LOOM_CHECK(model.pipeline_stage().whole(), "serving runs the whole model, not a pipeline stage");
  LOOM_CHECK(!model.tensor_parallel().sequence_parallel,
             "serving under tensor parallelism runs without sequence parallelism");
}

Backend* DecoderRunner::cache_backend() const {
  return model_.backend().host_accessible() ? nullptr : &model_.backend();
}

KvSpec DecoderRunner::kv_spec() const {
  const ModelConfig& c = model_.config();
  KvSpec s;
  s.n_layer = c.n_layer;
  s.n_kv_head = c.n_kv_head / model_.tensor_parallel().size;  // this rank's heads (TP)
  s.head_dim = c.head_dim;
  s.dtype = model_.act_dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  return s;
}

void DecoderRunner::forward(const std::vector<SeqChunk>& batch, const KvCacheView& cache,
                            float* logits) {
  ProfileScope profile(DecodeProfile::kForward);
  LOOM_CHECK(!batch.empty(), "an empty batch");
  tokens_.clear();
  positions_.clear();
  cu_.assign(1, 0);
  std::vector<int> rows;
  for (const SeqChunk& c : batch) {
    LOOM_CHECK(c.n > 0 && c.start_pos >= 0 && c.start_pos + c.n <= max_seq(), "sequence chunk ",
               "of ", c.n, " tokens at position ", c.start_pos, " exceeds the model's ", max_seq());
    LOOM_CHECK(int64_t(c.num_blocks) * cache.block_size >= c.start_pos + c.n, "a block table of ",
               c.num_blocks, " blocks for ", c.start_pos + c.n, " positions");
    for (int i = 0; i < c.n; ++i) {
      tokens_.push_back(c.tokens[i]);
      positions_.push_back(c.start_pos + i);
    }
    cu_.push_back(static_cast<int32_t>(tokens_.size()));
    LOOM_CHECK(!c.want_logits || (c.logits_rows >= 1 && c.logits_rows <= c.n), "logits of ",
               c.logits_rows, " rows of a chunk of ", c.n, " tokens");
    if (c.want_logits)
      for (int r = c.logits_rows; r >= 1; --r) rows.push_back(static_cast<int>(tokens_.size()) - r);
  }
  ModelInput in;
  in.tokens = tokens_.data();
  in.positions = positions_.data();
  in.cu_seqlens = cu_.data();
  in.N = static_cast<int>(tokens_.size());
  in.nseq = static_cast<int>(batch.size());
  // The chunk table (block tables: only the entries each chunk reaches), built once per step
  // and read by every layer: in place on the host, else uploaded in one copy.
  table_.clear(static_cast<int>(batch.size()));
  for (const SeqChunk& c : batch)
    table_.add(c.n, c.start_pos, c.block_table,
               (c.start_pos + c.n + cache.block_size - 1) / cache.block_size);
  Backend& be = model_.backend();
  PagedAttention att;
  att.be = &be;
  att.cache = &cache;
  att.nchunks = table_.chunks();
  att.rows = table_.rows();
  for (const SeqChunk& c : batch) att.positions += c.start_pos + c.n;
  const std::vector<int32_t>& ints = table_.ints();
  if (be.host_accessible()) {
    att.table = ints.data();
  } else {
    int32_t* dev = table_dev_.ensure_n<int32_t>(be, ints.size(), "kv_chunk_table");
    be.copy_h2d(dev, ints.data(), ints.size() * sizeof(int32_t));
    att.table = dev;
  }
  model_.forward_logits(in, rows, logits, &att);
  // A device records bad block indices instead of throwing: surface them with this step.
  if (!be.host_accessible()) be.sync();
}

std::vector<std::vector<float>> DecoderRunner::embed(
    const std::vector<std::vector<int32_t>>& inputs, const EmbeddingOptions& opt) {
  return infer::embed(model_, inputs, opt);
}

}  // namespace loom::infer
