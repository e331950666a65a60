// The Decoder as the serving engine's ModelRunner: a batch of sequence chunks runs as one packed
// forward-only pass (Decoder::forward_logits), with each layer's attention core replaced by
// attention over the paged KV cache (the chunk's new keys and values written into its blocks
// first). Keys and values are cached in the type of the engine's cache (KvCacheView::spec: the
// model's compute type unless --kv-cache-dtype says otherwise), which the paged ops read as
// stored.
// Everything runs through the model's Backend (Backend::paged_kv_write / paged_attention): on
// a device the KV pool and the step's chunk table (block tables included, uploaded once per
// step) are device buffers, and the logits come back in one copy per step.
#pragma once

#include <vector>

#include "infer/engine_api.h"
#include "kernels/buffer.h"
#include "kernels/paged_kv.h"
#include "model/decoder.h"

namespace loom::infer {

class DecoderRunner : public ModelRunner {
 public:
  explicit DecoderRunner(Decoder& model);
  int vocab() const override { return model_.config().vocab; }
  int max_seq() const override { return model_.config().max_seq; }
  KvSpec kv_spec() const override;
  // The model's backend when the host cannot address its memory; else the host pool.
  Backend* cache_backend() const override;
  bool scores_many_rows() const override { return true; }
  void forward(const std::vector<SeqChunk>& batch, const KvCacheView& cache,
               float* logits) override;
  bool embeds() const override { return true; }
  std::vector<std::vector<float>> embed(const std::vector<std::vector<int32_t>>& inputs,
                                        const EmbeddingOptions& opt) override;

 private:
  Decoder& model_;
  std::vector<int32_t> tokens_, positions_, cu_;
  PagedChunkTable table_;
  BackendBuffer table_dev_;  // the table on a device backend (grow-only)
};

}  // namespace loom::infer
