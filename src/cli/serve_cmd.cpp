// `loom serve`: loads a checkpoint into the serving engine and answers OpenAI-compatible HTTP
// requests (src/serve). SIGTERM or SIGINT: stop taking requests, let those in flight finish for
// up to --drain-timeout seconds, then exit.
#include <csignal>
#include <cstdio>
#include <thread>

#include "ckpt/checkpoint.h"
#include "cli/command.h"
#include "cli/options.h"
#include "cli/serving_setup.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "data/chat.h"
#include "infer/engine.h"
#include "infer/generator.h"
#include "infer/model_runner.h"
#include "infer/weight_quant.h"
#include "serve/server.h"

namespace loom::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

}  // namespace

int run_serve(const Args& args) {
  Options o("loom serve --ckpt PATH [--host 127.0.0.1] [--port 8080] [options]",
            "Serves a checkpoint over an OpenAI-compatible HTTP API: /v1/completions,\n"
            "/v1/chat/completions (streaming with server-sent events), /v1/models, /health,\n"
            "/metrics (Prometheus), /tokenize, /detokenize.");
  o.value("ckpt", "", "checkpoint: a step directory or a checkpoints root (uses latest)", true)
      .value("host", "127.0.0.1", "address to listen on")
      .value("port", "8080", "port (0: any free port, printed)")
      .value("model-name", "loom", "the model's name in the API")
      .value("tokenizer", "", "tokenizer spec (default: the run's data.tokenizer, else bytes)")
      .value("chat-template", "chatml", "chatml, llama3, or none (no chat completions)")
      .value("max-num-seqs", "64", "sequences batched at once")
      .value("max-batched-tokens", "512", "tokens per engine step (decodes first, then prefill)")
      .value("kv-cache-mb", "512", "KV cache size")
      .value("max-queue", "256", "requests waiting or running; more get 503")
      .value("max-tokens", "256", "default max_tokens of a request")
      .value("drain-timeout", "30", "seconds to let requests finish on SIGTERM")
      .value("weights", "fp32",
             "linear weights read as fp32, bf16, int8 or fp8 (e4m3; int8 and fp8 with per-channel "
             "scales); fp32 compute");
  if (!o.parse(args)) return 0;
  serve::ServerOptions so;
  so.host = o.get("host");
  so.port = static_cast<int>(o.get_int("port", 0, 65535));
  so.model_name = o.get("model-name");
  so.default_max_tokens = static_cast<int>(o.get_int("max-tokens", 1, 1 << 20));
  const double drain = static_cast<double>(o.get_int("drain-timeout", 0, 3600));
  const infer::WeightType weights = infer::weight_type_from_name(o.get("weights"));

  auto model = load_model_from_checkpoint(o.get("ckpt"));
  so.max_seq = model->config().max_seq;
  auto tok = checkpoint_tokenizer(o.get("ckpt"), o.get("tokenizer"), *model);
  std::unique_ptr<data::ChatTemplate> chat;
  const std::string tpl = o.get("chat-template");
  if (tpl != "none" && tok) {
    try {
      chat = std::make_unique<data::ChatTemplate>(tpl, *tok);
    } catch (const Error& e) {
      log_warn("chat completions off: ", e.what());
    }
  }
  infer::EngineConfig ec;
  ec.scheduler.max_num_seqs = static_cast<int>(o.get_int("max-num-seqs", 1, 4096));
  ec.scheduler.max_batched_tokens = static_cast<int>(o.get_int("max-batched-tokens", 1, 1 << 20));
  ec.kv_cache_bytes = o.get_int("kv-cache-mb", 1, 1 << 20) << 20;
  ec.max_queue = static_cast<int>(o.get_int("max-queue", 1, 1 << 20));
  set_text_codec(ec, tok.get(), chat.get());
  // Decode streams every weight once per token: narrower copies make it faster.
  infer::QuantizedWeights quant(*model, weights);
  infer::DecoderRunner runner(*model);
  infer::LoomEngine engine(runner, ec);
  engine.start();
  serve::Server server(engine, tok.get(), chat.get(), so);
  const int port = server.bind();
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::thread http([&] { server.run(); });
  server.set_ready(true);
  log_info("serving ", so.model_name, " (", model->config().num_params(), " parameters, ",
           infer::weight_type_name(weights), " weights, ", engine.cache().num_blocks(),
           " KV blocks of ", engine.cache().block_size(), " tokens) on http://", so.host, ":",
           port);
  std::printf("listening on http://%s:%d\n", so.host.c_str(), port);
  std::fflush(stdout);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  log_info("stopping: draining requests for up to ", drain, " s");
  server.set_ready(false);
  engine.stop(drain);  // in-flight requests finish (or are cancelled at the deadline)
  server.stop();
  http.join();
  return 0;
}

}  // namespace loom::cli
