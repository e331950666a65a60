// The training stall of one checkpoint, synchronous vs asynchronous (train.ckpt_async), for a real
// model's parameters and AdamW state (default gpt2-124m, fp32: 124M parameters + 2 moments, about
// 1.5 GB per checkpoint). Synchronous: save() writes, fsyncs, verifies and commits before it
// returns. Asynchronous: save() copies into reused host buffers and returns; the write runs in
// the background and is waited for before the next save, as training would. Prints the load
// average: timings on a shared machine are noisy. Never asserts timings.
//
//   bench_ckpt [--model gpt2-124m] [--dir /tmp] [--saves 3]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/checkpoint_writer.h"
#include "core/bench_util.h"
#include "core/fs.h"
#include "core/log.h"
#include "model/decoder.h"
#include "model/model_config.h"
#include "optim/adamw.h"

using namespace loom;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Result {
  double first = 0;            // the first save (async: allocates the snapshot buffers)
  std::vector<double> rest;    // the saves after it
  std::vector<double> writes;  // background write times (async)
};

Result run(bool async, const std::string& root, int saves, const ckpt::TensorList& model,
           const ckpt::TensorList& optim) {
  ckpt::CheckpointWriterOptions o;
  o.async = async;
  o.keep_last = 1;
  o.quiet = true;
  ckpt::CheckpointWriter w(root, o);
  Result r;
  for (int i = 0; i < saves; ++i) {
    ckpt::TrainerState st;
    st.step = i + 1;
    w.save(st, model, optim);
    (i == 0 ? r.first : r.rest.emplace_back()) = w.last_stall_seconds();
    auto done = w.wait();  // training would run here; the next save waits for this anyway
    if (async && done) r.writes.push_back(done->write_seconds);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "gpt2-124m", dir = "/tmp";
  int saves = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model"))
      preset = argv[i + 1];
    else if (!std::strcmp(argv[i], "--dir"))
      dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--saves"))
      saves = std::max(2, std::atoi(argv[i + 1]));
  }
  try {
    const ModelConfig mc = model_preset(preset);
    Decoder dec(mc, cpu_backend());
    dec.params().init(1234);
    AdamW adam(dec.params(), AdamWConfig{}, DType::F32, cpu_backend());
    const ckpt::TensorList model = ckpt::to_list(dec.params().tensors());
    const ckpt::TensorList optim = ckpt::to_list(adam.state_tensors());
    double bytes = 0;
    for (const auto* l : {&model, &optim})
      for (const auto& nt : *l) bytes += double(nt.tensor.nbytes());
    const std::string base = dir + "/loom_bench_ckpt_" + std::to_string(::getpid());
    std::printf(
        "checkpoint stall, %s: %.0f MB per checkpoint (model + AdamW), %d saves each, "
        "under %s\nload average before: %.2f\n",
        preset.c_str(), bytes / 1e6, saves, dir.c_str(), loom::load_average());
    const Result s = run(false, base + "_sync", saves, model, optim);
    std::printf("  sync : first %.3f s, then median %.3f s   (load %.2f)\n", s.first,
                median(s.rest), loom::load_average());
    const Result a = run(true, base + "_async", saves, model, optim);
    std::printf(
        "  async: first %.3f s, then median %.3f s; background write median %.3f s   "
        "(load %.2f)\n",
        a.first, median(a.rest), median(a.writes), loom::load_average());
    std::printf("  async stall / sync stall: %.1f%% (steady state), %.1f%% (first save)\n",
                100 * median(a.rest) / median(s.rest), 100 * a.first / s.first);
    remove_all(base + "_sync");
    remove_all(base + "_async");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ckpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
