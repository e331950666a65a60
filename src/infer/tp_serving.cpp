#include "infer/tp_serving.h"

#include <chrono>
#include <string>
#include <thread>

#include "ckpt/model_loader.h"
#include "core/error.h"
#include "core/log.h"
#include "infer/kv_cache.h"

namespace loom::infer {
namespace {

// Message kinds, in the first of the header's int64 fields.
constexpr int64_t kStep = 0x4c53'0001, kKeepAlive = 0x4c53'0002, kStop = 0x4c53'0003,
                  kReady = 0x4c53'0004;
// kind, chunks, tokens, block-table entries, rank 0's cache blocks, payload length.
constexpr int kHeader = 6;
constexpr double kKeepAliveSeconds = 1.0;

// Waits for `w` polling (test() makes MPI progress), at most timeout_s seconds; `flag` names the
// option that sets the bound.
void wait_bounded(comm::Work& w, double timeout_s, const char* flag, const std::string& who,
                  const std::string& what) {
  const double deadline = now_seconds() + timeout_s;
  while (!w.test()) {
    LOOM_CHECK(now_seconds() < deadline, who, ": waited ", timeout_s, " s (", flag, ") for ", what);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

std::unique_ptr<Decoder> load_model_shard(const std::string& path, const TensorParallel& tp) {
  return load_model_from_checkpoint(path, cpu_backend(), tp);
}

TpLeaderRunner::TpLeaderRunner(Decoder& model, comm::Communicator& tp, double timeout_s,
                               double startup_timeout_s)
    : local_(model), tp_(tp), timeout_s_(timeout_s) {
  LOOM_CHECK(tp.rank() == 0, "the tensor-parallel leader is rank 0 of its group, not rank ",
             tp.rank());
  LOOM_CHECK(timeout_s > kKeepAliveSeconds, "--tp-timeout (", timeout_s, " s) must exceed the ",
             kKeepAliveSeconds, " s between keep-alive messages");
  // The other ranks may still be loading their shards: they take this under the start-up bound.
  send(kReady, {}, {}, startup_timeout_s, "--tp-startup-timeout");
}

void TpLeaderRunner::send(int64_t kind, const std::vector<int64_t>& rest,
                          const std::vector<int32_t>& payload, double timeout_s, const char* flag) {
  int64_t header[kHeader] = {kind, 0, 0, 0, 0, int64_t(payload.size())};
  for (size_t i = 0; i < rest.size() && i + 1 < kHeader - 1; ++i) header[i + 1] = rest[i];
  comm::Work h = tp_.broadcast_async(header, kHeader, DType::I64, 0);
  wait_bounded(h, timeout_s, flag, "tensor-parallel rank 0", "the other ranks to take a message");
  if (!payload.empty()) {
    comm::Work p = tp_.broadcast_async(const_cast<int32_t*>(payload.data()),
                                       int64_t(payload.size()), DType::I32, 0);
    wait_bounded(p, timeout_s, flag, "tensor-parallel rank 0", "the other ranks to take a step");
  }
  last_send_ = now_seconds();
}

void TpLeaderRunner::forward(const std::vector<SeqChunk>& batch, const KvCacheView& cache,
                             float* logits) {
  LOOM_CHECK(!stopped_, "the tensor-parallel ranks were stopped");
  // Chunk fields, then every chunk's tokens, then every chunk's block table.
  payload_.clear();
  int64_t tokens = 0, table = 0;
  for (const SeqChunk& c : batch) {
    payload_.insert(payload_.end(), {c.n, c.start_pos, c.num_blocks, c.want_logits ? 1 : 0});
    tokens += c.n;
    table += c.num_blocks;
  }
  for (const SeqChunk& c : batch) payload_.insert(payload_.end(), c.tokens, c.tokens + c.n);
  for (const SeqChunk& c : batch)
    payload_.insert(payload_.end(), c.block_table, c.block_table + c.num_blocks);
  send(kStep, {int64_t(batch.size()), tokens, table, cache.num_blocks}, payload_, timeout_s_);
  local_.forward(batch, cache, logits);
}

void TpLeaderRunner::keep_alive() {
  if (!stopped_ && now_seconds() - last_send_ >= kKeepAliveSeconds)
    send(kKeepAlive, {}, {}, timeout_s_);
}

void TpLeaderRunner::stop() {
  if (stopped_) return;
  stopped_ = true;
  send(kStop, {}, {}, timeout_s_);
}

void run_tp_worker(Decoder& model, comm::Communicator& tp, int block_size, int num_blocks,
                   double timeout_s, double startup_timeout_s, KvCacheDtype kv_dtype) {
  LOOM_CHECK(tp.rank() != 0, "rank 0 of the tensor-parallel group runs the engine, not a worker");
  DecoderRunner runner(model);
  KvCache cache(kv_spec_with(runner.kv_spec(), kv_dtype), block_size, num_blocks);
  const std::string me = cat("tensor-parallel rank ", tp.rank());
  std::vector<int32_t> payload;
  std::vector<SeqChunk> batch;
  std::vector<float> logits;
  int64_t h[kHeader] = {};
  // Rank 0 may still be loading its shard: the step clock starts at its ready message.
  comm::Work ready = tp.broadcast_async(h, kHeader, DType::I64, 0);
  wait_bounded(ready, startup_timeout_s, "--tp-startup-timeout", me,
               "rank 0 to finish starting up");
  LOOM_CHECK(h[0] == kReady, me, ": rank 0's first message is not its ready message (kind ", h[0],
             ")");
  for (int64_t steps = 0;; ++steps) {
    comm::Work hw = tp.broadcast_async(h, kHeader, DType::I64, 0);
    wait_bounded(hw, timeout_s, "--tp-timeout", me,
                 cat("rank 0's next message (after ", steps, " steps)"));
    if (h[0] == kStop) return;
    if (h[0] == kKeepAlive) continue;
    LOOM_CHECK(h[0] == kStep, me, ": an unknown message from rank 0 (kind ", h[0], ")");
    const int64_t nc = h[1], ntok = h[2], ntab = h[3];
    LOOM_CHECK(h[4] == num_blocks, me, " holds ", num_blocks, " KV blocks, rank 0 ", h[4],
               ": start every rank with the same --kv-cache-mb");
    LOOM_CHECK(nc > 0 && ntok > 0 && ntab >= 0 && h[5] == 4 * nc + ntok + ntab, me,
               ": a malformed step header from rank 0");
    payload.resize(size_t(h[5]));
    comm::Work pw = tp.broadcast_async(payload.data(), h[5], DType::I32, 0);
    wait_bounded(pw, timeout_s, "--tp-timeout", me, "the step's batch");
    batch.assign(size_t(nc), SeqChunk{});
    const int32_t* tok = payload.data() + 4 * nc;
    const int32_t* tab = tok + ntok;
    int want = 0;
    for (int64_t i = 0; i < nc; ++i) {
      SeqChunk& c = batch[size_t(i)];
      c.n = payload[size_t(4 * i)];
      c.start_pos = payload[size_t(4 * i + 1)];
      c.num_blocks = payload[size_t(4 * i + 2)];
      c.want_logits = payload[size_t(4 * i + 3)] != 0;
      LOOM_CHECK(c.n > 0 && c.num_blocks >= 0 && tok + c.n <= payload.data() + 4 * nc + ntok &&
                     tab + c.num_blocks <= payload.data() + payload.size(),
                 me, ": a step whose chunks overrun its payload");
      for (int b = 0; b < c.num_blocks; ++b)
        LOOM_CHECK(tab[b] >= 0 && tab[b] < num_blocks, me, ": block ", tab[b], " outside the ",
                   num_blocks, " of the cache");
      c.tokens = tok;
      c.block_table = tab;
      tok += c.n;
      tab += c.num_blocks;
      want += c.want_logits;
    }
    logits.resize(size_t(want) * size_t(runner.vocab()));
    runner.forward(batch, cache.view(), logits.data());  // logits are rank 0's to use
  }
}

}  // namespace loom::infer
