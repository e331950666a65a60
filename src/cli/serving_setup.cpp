#include "cli/serving_setup.h"

#include "ckpt/checkpoint.h"
#include "ckpt/tokenizer_copy.h"
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "infer/generator.h"

namespace loom::cli {

void declare_engine_options(Options& o) {
  o.value("max-num-seqs", "64", "engine: sequences batched at once")
      .value("max-batched-tokens", "512",
             "engine: tokens per step (decodes first, then prefill chunks)")
      .value("kv-cache-mb", "512", "engine: KV cache size")
      .value("kv-cache-dtype", "auto",
             "engine: what the KV cache stores: auto (the model's compute type), fp32, bf16 or "
             "fp8 (e4m3, a power-of-two scale per row of a head; CPU only); narrower types fit "
             "more tokens in --kv-cache-mb")
      .value("weights", "fp32",
             "engine: linear weights read as fp32, bf16, int8 or fp8 (e4m3; int8 and fp8 with "
             "per-channel scales); fp32 compute; bf16, int8 and fp8 on the CPU only")
      .value("speculative", "none",
             "engine: speculative decoding, none, ngram (prompt lookup: guesses copied from "
             "the prompt and output where their last tokens occurred before) or draft (the "
             "greedy guesses of --speculative-model)")
      .value("speculative-model", "",
             "engine: --speculative draft's model, a smaller Loom checkpoint with the same "
             "vocabulary (a step directory or a checkpoints root)")
      .value("num-speculative-tokens", "4", "engine: guesses per sequence per step (1-64)")
      .value("ngram-prompt-lookup-max", "4", "engine: longest suffix ngram lookup matches")
      .value("ngram-prompt-lookup-min", "1", "engine: shortest suffix ngram lookup matches");
}

infer::EngineConfig engine_config_from(const Options& o) {
  infer::EngineConfig ec;
  ec.scheduler.max_num_seqs = o.get_int32("max-num-seqs", 1, 4096);
  ec.scheduler.max_batched_tokens = o.get_int32("max-batched-tokens", 1, 1 << 20);
  ec.kv_cache_bytes = o.get_int("kv-cache-mb", 1, 1 << 20) << 20;
  try {
    ec.kv_cache_dtype = infer::kv_cache_dtype_from_name(o.get("kv-cache-dtype"));
  } catch (const Error& e) {
    fail("--kv-cache-dtype: ", e.what());
  }
  infer::SpeculativeConfig& sc = ec.speculative;
  try {
    sc.method = infer::speculative_method_from_name(o.get("speculative"));
  } catch (const Error& e) {
    fail("--speculative: ", e.what());
  }
  sc.num_speculative_tokens = o.get_int32("num-speculative-tokens", 1, 64);
  sc.prompt_lookup_max = o.get_int32("ngram-prompt-lookup-max", 1, 64);
  sc.prompt_lookup_min = o.get_int32("ngram-prompt-lookup-min", 1, 64);
  LOOM_CHECK(sc.prompt_lookup_min <= sc.prompt_lookup_max, "--ngram-prompt-lookup-min (",
             sc.prompt_lookup_min, ") must not exceed --ngram-prompt-lookup-max (",
             sc.prompt_lookup_max, ")");
  LOOM_CHECK((sc.method == infer::SpeculativeMethod::Draft) == !o.get("speculative-model").empty(),
             sc.method == infer::SpeculativeMethod::Draft
                 ? "--speculative draft needs --speculative-model PATH"
                 : "--speculative-model is the model of --speculative draft; give both");
  return ec;
}

std::unique_ptr<DraftSetup> load_draft_model(const Options& o, const Decoder& target,
                                             Backend& backend, infer::WeightType weights) {
  const std::string path = o.get("speculative-model");
  if (path.empty()) return nullptr;
  auto d = std::make_unique<DraftSetup>();
  d->model = load_model_from_checkpoint(path, backend);
  LOOM_CHECK(d->model->config().vocab == target.config().vocab, "--speculative-model ", path,
             ": its vocabulary has ", d->model->config().vocab, " tokens, the target's ",
             target.config().vocab, " (the draft must share the target's tokenizer)");
  if (backend.host_accessible())
    d->quant = std::make_unique<infer::QuantizedWeights>(*d->model, weights);
  d->runner = std::make_unique<infer::DecoderRunner>(*d->model);
  return d;
}

infer::WeightType engine_weights_from(const Options& o) {
  return infer::weight_type_from_name(o.get("weights"));
}

std::unique_ptr<data::BpeTokenizer> checkpoint_tokenizer(const std::string& ckpt,
                                                         const std::string& spec_opt,
                                                         const Decoder& model) {
  std::string spec = spec_opt;
  if (spec.empty()) {
    ckpt::Checkpoint c(ckpt);
    spec = ckpt::checkpoint_tokenizer_spec(c.dir(), c.state().config_text);
  }
  if (spec.empty()) {
    LOOM_CHECK(model.config().vocab == 256, "the checkpoint names no data.tokenizer and its ",
               "vocabulary (", model.config().vocab, ") is not byte-level: pass --tokenizer");
    return nullptr;
  }
  auto tok = data::load_tokenizer(spec);
  LOOM_CHECK(tok->vocab_size() <= model.config().vocab, "tokenizer ", spec, " has ",
             tok->vocab_size(), " tokens, more than the model's vocabulary of ",
             model.config().vocab);
  return tok;
}

void set_text_codec(infer::EngineConfig& cfg, const data::BpeTokenizer* tok,
                    const data::ChatTemplate* chat) {
  if (!tok) {
    cfg.detokenize = [](const std::vector<int32_t>& ids) {
      std::string s;
      for (int32_t t : ids)
        if (t >= 0 && t < 256) s.push_back(static_cast<char>(t));
      return s;
    };
    return;
  }
  if (tok->eot_id() >= 0) cfg.eos_ids.push_back(tok->eot_id());
  if (chat) cfg.eos_ids.push_back(chat->end_of_turn());
  cfg.detokenize = [tok](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids)
      if (t >= 0 && t < tok->vocab_size()) tok->decode_append(t, s);
    return s;
  };
}

DeviceChoice select_serving_device(const std::string& device, const std::string& key,
                                   const std::string& doing) {
  // select_device's own notice only says which device: this one names what runs. GPU 0 of those
  // visible (CUDA_VISIBLE_DEVICES picks it), not the launcher's local rank: `loom serve` steps
  // its engine on a thread of its own, whose current CUDA device is the default, 0.
  const DeviceChoice dev = select_device(device, key, /*quiet=*/true, /*gpu=*/0);
  if (device == "auto")
    log_info(key, " auto: ", doing, " on ", dev.describe,
             dev.cuda ? ""
                      : (cuda_built() ? " (no CUDA device is visible)"
                                      : " (this build has no CUDA backend)"));
  return dev;
}

void check_serving_kv_cache(const infer::EngineConfig& ec, const DeviceChoice& dev) {
  if (dev.cuda && ec.kv_cache_dtype == infer::KvCacheDtype::FP8)
    fail("--kv-cache-dtype fp8 on ", dev.describe,
         ": the fp8 KV cache's kernels are CPU ones; on the GPU use --kv-cache-dtype auto, fp32 "
         "or bf16, or --device cpu");
}

void check_serving_weights(const std::string& weights, const std::string& key,
                           const DeviceChoice& dev) {
  if (!dev.cuda || weights == "fp32") return;
  const std::string why =
      " decode runs on the CPU only (its kernels read host copies of the "
      "weights); on the GPU use ";
  fail(key, " ", weights, " on ", dev.describe, ": weight-only ", weights, why, key,
       " fp32 (a bf16 checkpoint keeps its bf16 weights and KV cache), or --device cpu");
}

}  // namespace loom::cli
