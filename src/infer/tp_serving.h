// Tensor-parallel serving: one model split over the ranks of a tensor-parallel group (the
// trainer's layout, parallel/tensor_parallel.h), driven by the engine on rank 0.
//
// Each engine step rank 0 broadcasts the step's batch (every chunk's tokens, positions and block
// table) to the other ranks; every rank then runs the same forward over its shard, keeping its
// own KV cache for its heads (the same block numbers on every rank: only rank 0 allocates), and
// Decoder::forward_logits all-gathers the vocabulary slices so that rank 0 samples from whole
// logits. Rank 0 also sends a keep-alive while idle and a stop message at shutdown, so that no
// wait on either side is unbounded: a rank that hears nothing for `timeout_s` stops with an
// error naming what it waited for. Start-up (each rank loading and quantising its shard) is
// bounded apart, by `startup_timeout_s`: rank 0 sends a ready message once its runner exists,
// and only then do the other ranks start the step clock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "infer/engine_api.h"
#include "infer/kv_cache.h"
#include "infer/model_runner.h"
#include "model/decoder.h"

namespace loom::infer {

// How long each side waits for the other to finish starting up, by default (serve's
// --tp-startup-timeout): loading a large checkpoint takes far longer than a step.
constexpr double kTpStartupTimeoutSeconds = 300;

// This rank's shard of the model of a one-process checkpoint (a training run's, or what `loom
// ckpt consolidate` or `loom ckpt import` of a Hugging Face directory wrote), cut as the trainer
// cuts a run started from such a checkpoint (train.init_from). Refuses, before reading weights,
// a layout the model does not split over (naming the field), a rank's checkpoint of a
// distributed run and a LoRA checkpoint (consolidate or merge them first).
std::unique_ptr<Decoder> load_model_shard(const std::string& path, const TensorParallel& tp);

// Rank 0's runner: forward() sends the batch to the other ranks, then runs its own shard.
class TpLeaderRunner : public ModelRunner {
 public:
  // `model` is rank 0's shard; `tp` its tensor-parallel group (rank 0 of it is this process).
  // Sends the ready message, waiting up to startup_timeout_s for the other ranks to take it.
  TpLeaderRunner(Decoder& model, comm::Communicator& tp, double timeout_s,
                 double startup_timeout_s = kTpStartupTimeoutSeconds);
  int vocab() const override { return local_.vocab(); }
  int max_seq() const override { return local_.max_seq(); }
  KvSpec kv_spec() const override { return local_.kv_spec(); }
  void forward(const std::vector<SeqChunk>& batch, const KvCacheView& cache,
               float* logits) override;
  // Call while idle: sends a keep-alive when nothing was sent for a second, so that the other
  // ranks' waits stay bounded however long no request comes.
  void keep_alive();
  // Tells the other ranks to return (once; later calls do nothing).
  void stop();

 private:
  // `flag` names the option that set timeout_s, for the error.
  void send(int64_t kind, const std::vector<int64_t>& header_rest,
            const std::vector<int32_t>& payload, double timeout_s,
            const char* flag = "--tp-timeout");
  DecoderRunner local_;
  comm::Communicator& tp_;
  double timeout_s_;
  double last_send_ = 0;
  bool stopped_ = false;
  std::vector<int32_t> payload_;
};

// Ranks 1.. of the group: runs the steps rank 0 broadcasts, against this rank's own KV cache of
// `num_blocks` blocks of `block_size` tokens (rank 0's engine must have the same number), until
// rank 0 says stop; the cache stores `kv_dtype` (rank 0's engine config's). Throws when rank 0's
// ready message does not come within startup_timeout_s, when nothing comes for timeout_s seconds
// after it (rank 0 gone or stuck), or when a step does not fit this rank's cache.
void run_tp_worker(Decoder& model, comm::Communicator& tp, int block_size, int num_blocks,
                   double timeout_s, double startup_timeout_s = kTpStartupTimeoutSeconds,
                   KvCacheDtype kv_dtype = KvCacheDtype::Auto);

}  // namespace loom::infer
