// `loom bench serve`: serving latency and throughput under a Poisson load (as `vllm bench
// serve`), against a running server over HTTP (--url) or the engine in-process; a sweep that
// finds the saturation rate and then runs at 80% of it; and single-stream decode against the
// memory-bandwidth roofline, with many concurrent streams beside it.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>

#include "cli/command.h"
#include "cli/options.h"
#include "cli/serving_setup.h"
#include "core/bench_util.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "infer/decode_bench.h"
#include "infer/engine.h"
#include "infer/generator.h"
#include "infer/load_gen.h"
#include "infer/model_runner.h"
#include "infer/weight_quant.h"
#include "kernels/backend.h"
#include "model/decoder.h"
#ifdef LOOM_HAVE_SERVE
#include "serve/http_load.h"
#endif

namespace loom::cli {
namespace {

double parse_rate(const std::string& s) {
  if (s == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double r = std::strtod(s.c_str(), &end);
  LOOM_CHECK(!s.empty() && end && *end == 0 && std::isfinite(r) && r > 0, "--rate ", s,
             ": expected a number of requests per second > 0, or inf");
  return r;
}

double parse_positive(const Options& o, const std::string& name) {
  if (!o.has(name)) return 0;
  const double v = o.get_double(name);
  LOOM_CHECK(v > 0, "--", name, " ", v, ": must be > 0");
  return v;
}

}  // namespace

int run_bench_serve(const Args& args) {
  Options o("loom bench serve [--url http://HOST:PORT | --preset P | --ckpt PATH] [options]",
            "Sends --num-prompts random-token prompts (greedy, ignore_eos) at Poisson arrivals\n"
            "of --rate requests/s (inf: all at once) to a running `loom serve` (--url, streamed\n"
            "over HTTP) or to the engine in-process (a --preset with random weights, or --ckpt),\n"
            "and prints request and token throughput with mean/median/p99 TTFT, TPOT, ITL and\n"
            "end-to-end latency, as `vllm bench serve` does. --sweep first runs at rate inf to\n"
            "find the saturation rate, then at 80% of it, next to one request alone (unloaded\n"
            "TPOT). --decode (in-process) times single-stream decode against the roofline\n"
            "(bytes of weights and KV cache per token / a measured streaming-read bandwidth) and\n"
            "--streams concurrent streams. The load average is printed; --json writes all.");
  o.value("url", "", "a running server (http://host:port); default: in-process")
      .value("model", "", "model name sent over HTTP (default: the server's)")
      .value("preset", "gpt2-124m", "in-process model preset (random weights)")
      .value("ckpt", "", "in-process: a checkpoint instead of a preset")
      .value("num-prompts", "32", "requests in a load run")
      .value("input-len", "128", "prompt tokens")
      .value("output-len", "64", "tokens generated per request")
      .value("vocab", "0",
             "prompt ids are drawn from [0, vocab) (default: the model's; 256 "
             "over HTTP)")
      .value("rate", "inf", "requests per second (Poisson), or inf")
      .value("seed", "0", "dataset and arrival seed")
      .flag("sweep", "saturation run, then a run at 80% of the saturation rate")
      .flag("decode", "single-stream decode vs roofline and --streams streams (in-process)")
      .flag("no-load", "skip the load run (with --decode: decode figures only)")
      .value("streams", "16", "concurrent streams of --decode")
      .value("threads", "2", "threads (OpenMP and BLAS) of the in-process engine")
      .value("timeout", "600", "seconds a load run may take")
      .value("torch-single", "", "bench/torch_decode_baseline.py's single-stream tok/s: ratios")
      .value("torch-batch", "", "its batch-16 tok/s: ratio of --streams aggregate decode")
      .value("json", "", "write the figures here as one JSON object");
  declare_engine_options(o);  // the in-process engine's
  if (!o.parse(args)) return 0;
  infer::LoadSpec spec;
  spec.num_prompts = o.get_int32("num-prompts", 1, 100000);
  spec.input_len = o.get_int32("input-len", 1, 1 << 20);
  spec.output_len = o.get_int32("output-len", 1, 1 << 20);
  spec.rate = parse_rate(o.get("rate"));
  spec.seed = static_cast<uint64_t>(o.get_int("seed", 0));
  spec.timeout_seconds = static_cast<double>(o.get_int("timeout", 1, 86400));
  const std::string url = o.get("url");
  const bool http = !url.empty();
  const bool decode = o.has("decode"), load = !o.has("no-load");
  LOOM_CHECK(decode || load, "--no-load without --decode leaves nothing to run");
  const double torch_single = parse_positive(o, "torch-single");
  const double torch_batch = parse_positive(o, "torch-batch");
  const std::string weights = o.get("weights");
  const infer::WeightType wtype = engine_weights_from(o);

  // The in-process model and engine (for the load without --url, and for --decode).
  std::unique_ptr<Decoder> model;
  std::unique_ptr<infer::QuantizedWeights> quant;
  std::unique_ptr<infer::DecoderRunner> runner;
  std::unique_ptr<DraftSetup> draft;
  infer::EngineConfig ec = engine_config_from(o);
  const int threads = o.get_int32("threads", 1, 1024);
  if (!http || decode) {
    set_num_threads(threads);
    if (!o.get("ckpt").empty()) {
      model = load_model_from_checkpoint(o.get("ckpt"));
    } else {
      model = std::make_unique<Decoder>(model_preset(o.get("preset")), cpu_backend());
      model->params().init(1);
    }
    quant = std::make_unique<infer::QuantizedWeights>(*model, wtype);
    runner = std::make_unique<infer::DecoderRunner>(*model);
    draft = load_draft_model(o, *model, cpu_backend(), wtype);
  }
  spec.vocab = o.get_int32("vocab", 0, 1 << 30);
  if (spec.vocab == 0) spec.vocab = runner ? runner->vocab() : 256;

  Json out = Json::object();
  out["load_average_before"] = load_average();
  out["mode"] = http ? "http" : "in-process";
  out["input_len"] = spec.input_len;
  out["output_len"] = spec.output_len;
  out["num_prompts"] = spec.num_prompts;
  if (runner) {
    out["model_params"] = model->config().num_params();
    out["weights"] = weights;
    // The low-precision copies (weights and per-channel scales) against bf16's 2 bytes a weight.
    int64_t linear = 0;
    for (const Decoder::LinearInfo& l : model->linears()) linear += int64_t(l.in) * l.out;
    out["stored_weight_bytes"] = quant->stored_bytes();
    out["bf16_weight_bytes"] = 2 * linear;
    out["threads"] = threads;
  }
  std::printf("loom bench serve: %s, %d prompts of %d tokens, %d output tokens, load %.2f\n",
              http ? url.c_str() : "in-process engine", spec.num_prompts, spec.input_len,
              spec.output_len, load_average());

  // One load run: over HTTP, or against a fresh in-process engine.
  auto run = [&](const infer::LoadSpec& s, const std::string& title) {
    std::vector<infer::RequestRecord> rec;
    double duration = 0;
    if (http) {
#ifdef LOOM_HAVE_SERVE
      serve::HttpTarget t = serve::parse_url(url);
      t.model = o.get("model");
      rec = serve::run_load_http(t, s, &duration);
#else
      fail("--url needs the HTTP client (this build has no cpp-httplib)");
#endif
    } else {
      infer::LoomEngine engine(*runner, ec, draft ? draft->runner.get() : nullptr);
      engine.start();
      rec = infer::run_load_in_process(engine, s, &duration);
      engine.stop(0);
    }
    infer::LoadSummary sum = infer::summarize(rec, duration);
    std::printf("%s", sum.table(title).c_str());
    std::printf("load average: %.2f\n", load_average());
    if (sum.failed > 0) std::printf("first failure: %s\n", sum.first_error.c_str());
    Json j = sum.to_json();
    j["request_rate"] = std::isinf(s.rate) ? Json("inf") : Json(s.rate);
    j["load_average_after"] = load_average();
    return std::make_pair(sum, j);
  };

  int failed = 0;
  if (load && !o.has("sweep")) {
    auto [sum, j] = run(spec, cat("Serving Benchmark Result (rate ", o.get("rate"), ")"));
    out["load"] = j;
    failed += sum.failed;
  } else if (load) {
    infer::LoadSpec alone = spec;
    alone.num_prompts = 1;
    alone.rate = std::numeric_limits<double>::infinity();
    auto [unloaded, ju] = run(alone, "One request alone (unloaded)");
    infer::LoadSpec sat = spec;
    sat.rate = std::numeric_limits<double>::infinity();
    auto [saturated, js] = run(sat, "Saturation (all requests at once)");
    const double rate = 0.8 * saturated.request_throughput;
    LOOM_CHECK(rate > 0, "the saturation run completed no request: ", saturated.first_error);
    infer::LoadSpec at80 = spec;
    at80.rate = rate;
    auto [loaded, jl] = run(at80, cat("Poisson at 80% of saturation (", rate, " req/s)"));
    const double ratio = unloaded.tpot.mean > 0 ? loaded.tpot.p99 / unloaded.tpot.mean : 0;
    std::printf(
        "saturation %.3f req/s; at 80%% (%.3f req/s): p99 TPOT %.2f ms = %.2fx the "
        "unloaded TPOT (%.2f ms); %d failed\n",
        saturated.request_throughput, rate, loaded.tpot.p99, ratio, unloaded.tpot.mean,
        loaded.failed);
    Json sw = Json::object();
    sw["unloaded"] = ju;
    sw["saturation"] = js;
    sw["saturation_rate"] = saturated.request_throughput;
    sw["at_80_percent"] = jl;
    sw["p99_tpot_over_unloaded_tpot"] = ratio;
    out["sweep"] = sw;
    failed += unloaded.failed + saturated.failed + loaded.failed;
  }

  if (decode) {
    LOOM_CHECK(ec.speculative.method != infer::SpeculativeMethod::Draft,
               "--decode measures one model's decode; --speculative draft runs in the load runs "
               "(without --decode) or in loom generate");
    infer::DecodeBenchOptions d;
    d.input_len = spec.input_len;
    d.output_len = std::max(2, spec.output_len);
    d.streams = o.get_int32("streams", 0, 4096);
    d.seed = spec.seed;
    const infer::DecodeBenchResult r =
        infer::run_decode_bench(*runner, ec, quant->bytes_per_token(), d);
    std::printf(
        "decode (%s weights, %s KV cache of %d blocks, %d threads): single stream %.2f tok/s; "
        "roofline %.2f tok/s "
        "(%.1f MB/token at %.2f GB/s read) -> %.1f%% of roofline; %d streams %.2f tok/s "
        "aggregate (%.3f ms CPU per token); prefill of %d tokens %.3f s; load %.2f\n",
        weights.c_str(), r.kv_cache_dtype.c_str(), r.kv_blocks, threads, r.single_tokens_per_s,
        r.roofline_tokens_per_s, r.bytes_per_token / 1e6, r.read_bandwidth_gbs,
        100 * r.roofline_ratio, r.streams, r.batch_tokens_per_s,
        r.batch_cpu_seconds_per_token * 1e3, spec.input_len, r.prefill_seconds, load_average());
    std::printf("%s", r.profile_text().c_str());
    Json j = r.to_json();
    if (torch_single > 0) {
      j["torch_single_tokens_per_s"] = torch_single;
      j["ratio_to_torch_single"] = r.single_tokens_per_s / torch_single;
      std::printf("vs PyTorch eager KV-cache decode: single stream %.2fx (%.2f vs %.2f tok/s)\n",
                  r.single_tokens_per_s / torch_single, r.single_tokens_per_s, torch_single);
    }
    if (torch_batch > 0) {
      j["torch_batch_tokens_per_s"] = torch_batch;
      j["ratio_to_torch_batch"] = r.batch_tokens_per_s / torch_batch;
      std::printf("vs PyTorch eager KV-cache decode: %d streams %.2fx (%.2f vs %.2f tok/s)\n",
                  r.streams, r.batch_tokens_per_s / torch_batch, r.batch_tokens_per_s, torch_batch);
    }
    j["load_average_after"] = load_average();
    out["decode"] = j;
  }
  out["load_average_after"] = load_average();
  const std::string js = out.dump();
  std::printf("%s\n", js.c_str());
  if (!o.get("json").empty()) write_file_atomic(o.get("json"), js + "\n");
  // Failed requests are a failed benchmark: the figures above describe an unhealthy server.
  return failed > 0 ? 1 : 0;
}

}  // namespace loom::cli
