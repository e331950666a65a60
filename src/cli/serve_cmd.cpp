// `loom serve`: loads a checkpoint into the serving engine and answers OpenAI-compatible HTTP
// requests (src/serve). SIGTERM or SIGINT: stop taking requests, let those in flight finish for
// up to --drain-timeout seconds, then exit. Over several ranks the model is split over them
// (infer/tp_serving.h): rank 0 serves HTTP and runs the engine, the others follow its steps.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "ckpt/checkpoint.h"
#include "ckpt/tokenizer_copy.h"
#include "cli/command.h"
#include "cli/options.h"
#include "cli/serving_setup.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/open_files.h"
#include "data/chat.h"
#include "infer/embeddings.h"
#include "infer/engine.h"
#include "infer/generator.h"
#include "infer/model_runner.h"
#include "infer/tp_serving.h"
#include "infer/weight_quant.h"
#include "parallel/tensor_parallel.h"
#include "serve/server.h"

namespace loom::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

// Under tensor parallelism the engine steps on this thread, the one that talks MPI (the
// communicators are initialised for one calling thread): until SIGTERM, then the drain, then
// the other ranks are told to stop.
void serve_tensor_parallel(infer::LoomEngine& engine, infer::TpLeaderRunner& runner,
                           serve::Server& server, double drain) {
  const auto idle = [&] {
    runner.keep_alive();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  while (!g_stop)
    if (!engine.step()) idle();
  log_info("stopping: draining requests for up to ", drain, " s");
  server.set_draining();
  engine.refuse_new();
  const double until = now_seconds() + drain;
  while (engine.in_flight() > 0 && now_seconds() < until)
    if (!engine.step()) idle();
  engine.stop(0);  // no thread: cancels what is left
  runner.stop();
}

int run_serve_here(const Args& args) {
  Options o(
      "loom serve --ckpt PATH [--host 127.0.0.1] [--port 8080] [options]\n"
      "  loom launch -n N -- serve --ckpt PATH ... (tensor parallel over N ranks)",
      "Serves a checkpoint over an OpenAI-compatible HTTP API: /v1/completions,\n"
      "/v1/chat/completions (streaming with server-sent events), /v1/models, /v1/embeddings,\n"
      "/health, /metrics (Prometheus), /tokenize, /detokenize. Started as several ranks (loom\n"
      "launch, mpirun), the model is split over them (tensor parallel) and rank 0 serves.");
  o.value("ckpt", "", "checkpoint: a step directory or a checkpoints root (uses latest)", true)
      .value("host", "127.0.0.1", "address to listen on")
      .value("port", "8080", "port (0: any free port, printed)")
      .value("model-name", "loom", "the model's name in the API (--served-model-name's)")
      .values("served-model-name",
              "the names a request's model may give; the first is what responses report "
              "(default: --model-name)")
      .value("embedding-pooling", "last",
             "/v1/embeddings: last (the last token's final hidden state: in a causal model the "
             "only one that saw the whole input) or mean (over every token)")
      .flag("embedding-raw", "/v1/embeddings: vectors as pooled, not scaled to unit L2 norm")
      .value("tokenizer", "", "tokenizer spec (default: the run's data.tokenizer, else bytes)")
      .value("chat-template", "chatml",
             "chatml, llama3, hf:PATH (a model's own), or none (no chat completions); unset, the "
             "one the checkpoint's tokenizer copy records, else chatml")
      .value("max-queue", "4096", "requests waiting or running; more get 429 with Retry-After")
      .value("max-tokens", "0",
             "max_tokens of a request that gives none: the context left after its prompt, "
             "capped by this when > 0")
      .value("max-body-mb", "16", "largest request body accepted (413 past it)")
      .value("read-timeout", "30",
             "seconds for a client to send a whole request (and to idle on a kept-alive "
             "connection)")
      .value("write-timeout", "30", "seconds for a client to take each write of its answer")
      .value("drain-timeout", "30", "seconds to let requests finish on SIGTERM")
      .value("device", "cpu",
             "cpu, cuda or auto (a GPU when there is one, else the CPU); one rank only")
      .value("tp", "0", "tensor-parallel ranks (0: every rank started; must equal that number)")
      .value("tp-timeout", "60",
             "seconds a rank waits for the others (a step, rank 0's next message) before failing")
      .value("tp-startup-timeout", "300",
             "seconds the ranks wait for each other to load their shards, before the steps");
  declare_engine_options(o);
  if (!o.parse(args)) return 0;
  serve::ServerOptions so;
  so.host = o.get("host");
  so.port = static_cast<int>(o.get_int("port", 0, 65535));
  so.model_name = o.get("model-name");
  if (o.has("served-model-name")) {
    const std::vector<std::string>& names = o.all("served-model-name");
    LOOM_CHECK(!o.has("model-name"), "--model-name and --served-model-name name the model twice; ",
               "give one");
    so.model_name = names.front();
    so.model_aliases.assign(names.begin() + 1, names.end());
  }
  so.default_max_tokens = static_cast<int>(o.get_int("max-tokens", 0, 1 << 20));
  so.max_body_bytes = size_t(o.get_int("max-body-mb", 1, 4096)) << 20;
  so.read_timeout_seconds = o.get_double("read-timeout");
  so.write_timeout_seconds = o.get_double("write-timeout");
  LOOM_CHECK(so.read_timeout_seconds > 0 && so.write_timeout_seconds > 0,
             "--read-timeout and --write-timeout must be positive");
  const double drain = static_cast<double>(o.get_int("drain-timeout", 0, 3600));
  const infer::WeightType weights = engine_weights_from(o);
  // cuda without a CUDA build or a GPU fails here, naming --device, before the port opens.
  const DeviceChoice dev = select_serving_device(o.get("device"), "--device", "serving");
  check_serving_weights(o.get("weights"), "--weights", dev);
  infer::EngineConfig ec = engine_config_from(o);
  check_serving_kv_cache(ec, dev);
  ec.max_queue = static_cast<int>(o.get_int("max-queue", 1, 1 << 20));

  comm::Communicator& world = comm::world();
  const int ranks = world.size();
  int tp = static_cast<int>(o.get_int("tp", 0, 4096));
  if (tp == 0) tp = ranks;
  LOOM_CHECK(tp == ranks, "--tp ", tp, " with ", ranks, " ranks: serving splits one model over ",
             "every rank started (start --tp ranks: loom launch -n ", tp, " -- serve ...)");
  const double tp_timeout = o.get_double("tp-timeout");
  LOOM_CHECK(tp_timeout > 1, "--tp-timeout must exceed 1 s (rank 0 sends a keep-alive every ",
             "second while idle), got ", tp_timeout);
  const double tp_startup_timeout = o.get_double("tp-startup-timeout");
  LOOM_CHECK(tp_startup_timeout > 0, "--tp-startup-timeout must be positive, got ",
             tp_startup_timeout);
  LOOM_CHECK(tp == 1 || !dev.cuda, "--device ", o.get("device"), " with --tp ", tp,
             ": tensor-parallel serving runs on the CPU only so far; use --device cpu");
  std::unique_ptr<comm::ProcessGroups> groups;
  std::unique_ptr<Decoder> model;
  if (tp == 1) {
    model = load_model_from_checkpoint(o.get("ckpt"), *dev.backend);
  } else {
    comm::ParallelDims dims;
    dims.tp = tp;
    groups = std::make_unique<comm::ProcessGroups>(world, dims);
    model =
        infer::load_model_shard(o.get("ckpt"), parallel::tensor_parallel_layout(*groups, false));
  }
  // Decode streams every weight once per token: narrower copies make it faster (every rank
  // reads its shard's copies).
  // On a GPU the model decodes with the weights it holds (check_serving_weights).
  std::unique_ptr<infer::QuantizedWeights> quant;
  if (!dev.cuda) quant = std::make_unique<infer::QuantizedWeights>(*model, weights);
  if (world.rank() != 0) {
    // The engine's cache on rank 0 has this many blocks too (the same config and spec).
    infer::DecoderRunner probe(*model);
    const int blocks = infer::KvCache::blocks_for_bytes(
        infer::kv_spec_with(probe.kv_spec(), ec.kv_cache_dtype), ec.block_size, ec.kv_cache_bytes);
    // SIGTERM reaches every rank under loom launch: rank 0 drains and then says stop.
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
    log_info("tensor-parallel rank ", world.rank(), " of ", tp, ": serving steps for rank 0");
    infer::run_tp_worker(*model, groups->tp(), ec.block_size, blocks, tp_timeout,
                         tp_startup_timeout, ec.kv_cache_dtype);
    return 0;
  }
  so.max_seq = model->config().max_seq;
  so.embedding_dimensions = model->config().d_model;
  so.embedding.pooling = infer::pooling_from_name(o.get("embedding-pooling"));
  so.embedding.normalize = !o.has("embedding-raw");
  auto tok = checkpoint_tokenizer(o.get("ckpt"), o.get("tokenizer"), *model);
  std::unique_ptr<data::ChatTemplate> chat;
  std::string tpl = o.get("chat-template");
  if (!o.has("chat-template") && !ckpt::checkpoint_chat_template(o.get("ckpt")).empty())
    tpl = ckpt::checkpoint_chat_template(o.get("ckpt"));
  if (tpl != "none" && tok) {
    try {
      chat = std::make_unique<data::ChatTemplate>(tpl, *tok);
    } catch (const Error& e) {
      log_warn("chat completions off: ", e.what());
    }
  }
  set_text_codec(ec, tok.get(), chat.get());
  std::unique_ptr<infer::ModelRunner> runner;
  infer::TpLeaderRunner* leader = nullptr;
  if (tp == 1) {
    runner = std::make_unique<infer::DecoderRunner>(*model);
  } else {
    auto l = std::make_unique<infer::TpLeaderRunner>(*model, groups->tp(), tp_timeout,
                                                     tp_startup_timeout);
    leader = l.get();
    runner = std::move(l);
  }
  LOOM_CHECK(tp == 1 || ec.speculative.method != infer::SpeculativeMethod::Draft,
             "--speculative draft with --tp ", tp,
             ": tensor-parallel serving runs without a draft model");
  const auto draft = load_draft_model(o, *model, *dev.backend, weights);
  infer::LoomEngine engine(*runner, ec, draft ? draft->runner.get() : nullptr);
  if (!leader) engine.start();
  raise_open_file_limit();  // every open connection is a descriptor
  serve::Server server(engine, tok.get(), chat.get(), so);
  const int port = server.bind();
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::thread http([&] { server.run(); });
  server.set_ready(true);
  log_info("serving ", so.model_name, " on ", dev.describe, " (", model->config().num_params(),
           " parameters, ", infer::weight_type_name(weights), " weights, ",
           engine.cache().num_blocks(), " KV blocks of ", engine.cache().block_size(),
           " tokens in ", infer::kv_stored_name(engine.cache().view().spec.dtype),
           tp > 1 ? cat(", tensor parallel over ", tp, " ranks") : std::string(), ") on http://",
           so.host, ":", port, " (pid ", ::getpid(), ": SIGTERM drains, then stops every rank)");
  std::printf("listening on http://%s:%d\n", so.host.c_str(), port);
  std::fflush(stdout);
  if (leader) {
    try {
      serve_tensor_parallel(engine, *leader, server, drain);
    } catch (const std::exception& e) {
      // The ranks are out of step (a timeout, a failed forward): end them all with the message
      // here, before unwinding would meet the HTTP thread still running.
      comm::abort_job(cat("tensor-parallel serving stopped: ", e.what()));
    }
  } else {
    while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    log_info("stopping: draining requests for up to ", drain, " s");
    server.set_draining();
    engine.stop(drain);  // in-flight requests finish (or are cancelled at the deadline)
  }
  server.stop(/*grace_seconds=*/5);  // the answers of cancelled requests are written first
  http.join();
  return 0;
}

}  // namespace

int run_serve(const Args& args) {
  try {
    return run_serve_here(args);
  } catch (const Error& e) {
    // Over several ranks one rank's error ends them all with the message (the others would
    // otherwise wait out --tp-timeout).
    if (comm::launched_distributed()) comm::abort_job(e.what());
    throw;
  }
}

}  // namespace loom::cli
