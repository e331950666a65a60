// `loom generate`: samples text from a checkpoint through the serving engine (paged KV cache,
// continuous batching), encoding prompts and decoding the output with the tokenizer the run was
// trained with (byte-level models use raw bytes). One prompt streams to stdout; a JSONL file of
// prompts runs at full batch into a JSONL file (synthetic data), resumable and with progress.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>

#include "ckpt/checkpoint.h"
#include "cli/command.h"
#include "cli/options.h"
#include "cli/results_file.h"
#include "cli/serving_setup.h"
#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/jsonl.h"
#include "core/log.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "infer/engine.h"
#include "infer/generator.h"
#include "infer/model_runner.h"
#include "infer/request_sampling.h"
#include "infer/weight_quant.h"
#include "train/device.h"

namespace loom::cli {

int run_generate(const Args& args) {
  Options o("loom generate --ckpt PATH (--prompt TEXT | --input PROMPTS.jsonl --output OUT.jsonl)",
            "Samples continuations from a trained checkpoint through the serving engine.\n"
            "With --input, every line ({\"prompt\": ...} or {\"messages\": [...]}, optional\n"
            "\"max_tokens\") runs at full batch; results go to --output in input order, and a\n"
            "rerun skips the lines already written. Lines with an \"answer\" are scored: exact\n"
            "match of the trimmed text, reported at the end (a synthetic-task evaluation).");
  o.value("ckpt", "", "checkpoint: a step directory or a checkpoints root (uses latest)", true)
      .value("prompt", "\n", "prompt text")
      .value("input", "", "JSONL file of prompts (batch generation)")
      .value("output", "", "JSONL file of results (with --input)")
      .value("tokens", "200",
             "tokens to generate at most (max_tokens; at most the model's context)")
      .value("temperature", "0.8", "softmax temperature; 0 = greedy")
      .value("top-k", "40", "sample among the k most likely tokens; 0 = all")
      .value("top-p", "0.95", "nucleus: smallest set with this much probability; 1 = all")
      .value("min-p", "0", "drop tokens less likely than min-p times the most likely")
      .value("repetition-penalty", "1", "divides the logits of tokens seen before")
      .multi("stop", "stop string (repeatable)")
      .value("seed", "0", "sampling seed")
      .flag("ignore-eos", "keep going past the end-of-text token")
      .value("chat-template", "",
             "chatml, llama3 or hf:PATH: prompts are user messages in this template")
      .value("tokenizer", "", "tokenizer spec (default: the run's data.tokenizer, else bytes)")
      .value("device", "cpu", "cpu, cuda or auto (a GPU when there is one, else the CPU)");
  declare_engine_options(o);
  if (!o.parse(args)) return 0;
  // The engine runs where the model does (cuda: weights, KV cache and attention on the GPU,
  // the scheduler and sampling on the host). cuda without a CUDA build or a GPU is an error
  // naming --device, before any file is read; auto falls back to the CPU with a notice.
  const DeviceChoice dev = select_serving_device(o.get("device"), "--device", "generating");
  const infer::WeightType weights = engine_weights_from(o);
  check_serving_weights(o.get("weights"), "--weights", dev);
  infer::EngineConfig ec = engine_config_from(o);
  check_serving_kv_cache(ec, dev);
  // Options first, in the names the user typed, before any file is read.
  const double temperature = o.get_double("temperature"), top_p = o.get_double("top-p"),
               min_p = o.get_double("min-p"), rep = o.get_double("repetition-penalty");
  LOOM_CHECK(temperature >= 0 && temperature <= 100, "--temperature must lie in [0, 100], got ",
             temperature);
  LOOM_CHECK(top_p > 0 && top_p <= 1, "--top-p must lie in (0, 1], got ", top_p);
  LOOM_CHECK(min_p >= 0 && min_p <= 1, "--min-p must lie in [0, 1], got ", min_p);
  LOOM_CHECK(rep > 0 && rep <= 10, "--repetition-penalty must lie in (0, 10], got ", rep);
  auto model = load_model_from_checkpoint(o.get("ckpt"), *dev.backend);
  // Decode streams every weight once per token: narrower copies make it faster (on the CPU; on
  // a GPU the model decodes with the weights it holds).
  std::unique_ptr<infer::QuantizedWeights> quant;
  if (!dev.cuda) quant = std::make_unique<infer::QuantizedWeights>(*model, weights);
  auto tok = checkpoint_tokenizer(o.get("ckpt"), o.get("tokenizer"), *model);
  std::unique_ptr<data::ChatTemplate> chat;
  if (!o.get("chat-template").empty()) {
    LOOM_CHECK(tok, "--chat-template needs a tokenizer with the template's special tokens");
    chat = std::make_unique<data::ChatTemplate>(o.get("chat-template"), *tok);
  }

  infer::SamplingParams sp;
  // The defaults fit any model (a 32-token model refused the default --tokens 200); a value
  // the user gave is checked against the model as given.
  const int max_seq = model->config().max_seq, vocab = model->config().vocab;
  sp.max_tokens =
      o.has("tokens") ? static_cast<int>(o.get_int("tokens", 0, max_seq)) : std::min(200, max_seq);
  sp.temperature = static_cast<float>(temperature);
  sp.top_k = o.has("top-k") ? static_cast<int>(o.get_int("top-k", 0, vocab)) : std::min(40, vocab);
  sp.top_p = static_cast<float>(top_p);
  sp.min_p = static_cast<float>(min_p);
  sp.repetition_penalty = static_cast<float>(rep);
  sp.stop = o.all("stop");
  sp.seed = static_cast<uint64_t>(o.get_int("seed", 0, INT64_MAX));
  sp.ignore_eos = o.has("ignore-eos");
  infer::validate(sp, model->config().vocab);

  set_text_codec(ec, tok.get(), chat.get());
  auto encode = [&](const Json& line, const std::string& where) {
    std::vector<int32_t> ids;
    if (line.is_object() && line.contains("messages")) {
      LOOM_CHECK(chat, where, ": a 'messages' prompt needs --chat-template");
      std::vector<data::ChatMessage> ms;
      for (const Json& m : line.at("messages").as_array())
        ms.push_back({m.at("role").as_string(), m.at("content").as_string()});
      return chat->prompt_ids(ms);
    }
    const std::string text = line.is_string() ? line.as_string() : line.at("prompt").as_string();
    LOOM_CHECK(!text.empty(), where, ": empty prompt");
    if (chat) return chat->prompt_ids({{"user", text}});
    if (tok) {
      tok->encode(text, ids);
    } else {
      for (unsigned char ch : text) ids.push_back(ch);
    }
    return ids;
  };

  infer::DecoderRunner runner(*model);
  const auto draft = load_draft_model(o, *model, *dev.backend, weights);
  infer::LoomEngine engine(runner, ec, draft ? draft->runner.get() : nullptr);

  if (o.get("input").empty()) {
    const std::string prompt = o.get("prompt");
    LOOM_CHECK(!prompt.empty(), "--prompt must not be empty");
    // A prompt that cannot fit (prompt + --tokens past the context) is an error naming the
    // option; uncaught, RequestRejected (no std::exception) ended the process in std::terminate.
    std::vector<int32_t> ids = encode(Json(prompt), "--prompt");
    // Without --tokens, as many as the context leaves after the prompt (at most 200).
    if (!o.has("tokens"))
      sp.max_tokens = std::max(0, std::min(sp.max_tokens, max_seq - static_cast<int>(ids.size())));
    try {
      engine.submit(std::move(ids), sp, [](const infer::TokenEvent& e) {
        std::fwrite(e.text.data(), 1, e.text.size(), stdout);
        std::fflush(stdout);
      });
    } catch (const infer::RequestRejected& r) {
      fail("--prompt with --tokens ", sp.max_tokens, ": ", r.message);
    }
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);  // tokens stream only from here on
    engine.run_until_idle();
    std::fputc('\n', stdout);
    return 0;
  }

  // Batch generation: results in input order; lines already in the output are skipped.
  LOOM_CHECK(!o.get("output").empty(), "--input needs --output");
  std::vector<std::pair<Json, std::string>> lines;
  for_each_jsonl(o.get("input"), [&](const Json& j, const std::string& where) {
    lines.push_back({j, where});
  });
  ResultsFile out(o.get("output"));
  const size_t done = out.done();
  LOOM_CHECK(done <= lines.size(), o.get("output"), " has ", done, " results for ", lines.size(),
             " prompts: not this input's output");
  struct Result {
    std::string text, reason, answer;
    bool scored = false;
    infer::Usage usage;
    bool finished = false;
  };
  std::map<size_t, Result> results;
  size_t next_write = done;
  int64_t scored = 0, correct = 0;
  auto trim = [](std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    size_t i = 0;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    return s.substr(i);
  };
  const double t0 = now_seconds();
  int64_t generated = 0;
  auto flush = [&] {
    while (results.count(next_write) && results[next_write].finished) {
      const Result& r = results[next_write];
      Json j = Json::object();
      j["index"] = static_cast<int64_t>(next_write);
      j["text"] = r.text;
      j["finish_reason"] = r.reason;
      j["prompt_tokens"] = r.usage.prompt_tokens;
      j["completion_tokens"] = r.usage.completion_tokens;
      if (r.scored) {
        const bool ok = trim(r.text) == trim(r.answer);
        j["answer"] = r.answer;
        j["exact_match"] = ok;
        ++scored;
        correct += ok;
      }
      out.write_line(j.dump());
      results.erase(next_write++);
    }
    out.flush();
  };
  for (size_t i = done; i < lines.size(); ++i) {
    infer::SamplingParams p = sp;
    if (lines[i].first.is_object() && lines[i].first.contains("max_tokens"))
      p.max_tokens =
          static_cast<int>(lines[i].first.at("max_tokens").as_int(0, model->config().max_seq));
    try {
      if (lines[i].first.is_object() && lines[i].first.contains("answer")) {
        results[i].scored = true;
        results[i].answer = lines[i].first.at("answer").as_string();
      }
      engine.submit(encode(lines[i].first, lines[i].second), p, [&, i](const infer::TokenEvent& e) {
        Result& r = results[i];
        r.text += e.text;
        generated += static_cast<int64_t>(e.tokens.size());
        if (e.finished) {
          r.finished = true;
          r.reason = e.finish_reason;
          r.usage = e.usage;
        }
      });
    } catch (const infer::RequestRejected& r) {
      fail(lines[i].second, ": ", r.message);
    }
  }
  double last = 0;
  while (engine.step()) {
    flush();
    const double t = now_seconds() - t0;
    if (t - last >= 2) {
      last = t;
      const double rate = (next_write - done) / std::max(t, 1e-9);
      log_info("generated ", next_write, "/", lines.size(), " prompts, ", generated / t,
               " tokens/s, ETA ", rate > 0 ? (lines.size() - next_write) / rate : 0.0, " s");
    }
  }
  engine.run_until_idle();
  flush();
  log_info("wrote ", next_write - done, " results to ", o.get("output"), " (", generated,
           " tokens in ", now_seconds() - t0, " s)");
  if (ec.speculative.method != infer::SpeculativeMethod::None) {
    const infer::EngineStats st = engine.stats();
    log_info("speculative decoding: acceptance ",
             st.spec_draft_tokens_total
                 ? double(st.spec_accepted_tokens_total) / double(st.spec_draft_tokens_total)
                 : 0.0,
             " (", st.spec_accepted_tokens_total, " of ", st.spec_draft_tokens_total,
             " guesses kept, in ", st.spec_drafts_total, " verification passes)");
  }
  if (scored > 0)
    std::printf("exact match: %lld/%lld (%.1f%%)\n", static_cast<long long>(correct),
                static_cast<long long>(scored), 100.0 * correct / scored);
  return 0;
}

}  // namespace loom::cli
