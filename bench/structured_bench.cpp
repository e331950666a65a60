// Structured outputs' cost: decode steps of one or more streams through the engine, free
// against constrained by a JSON Schema (GPT-2's vocabulary, random weights), greedy. The
// constrained run is timed twice: cold (each automaton state's token mask computed on first
// use) and warm (masks cached). Also the mask and the masked draw alone, per token. Figures,
// not assertions.
//   build/bench_structured [--preset gpt2-124m|tiny] [--tokens 64] [--streams 1]
//                          [--tokenizer tests/data/fixtures/tokenizers/gpt2]
#include <cstdio>
#include <string>
#include <vector>

#include "core/bench_util.h"
#include "core/json.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/bpe.h"
#include "infer/constrain/json_schema.h"
#include "infer/constrain/token_constraint.h"
#include "infer/engine.h"
#include "infer/model_runner.h"
#include "infer/request_sampling.h"
#include "model/decoder.h"

using namespace loom;
namespace cs = loom::infer::constrain;

namespace {

// An array of records without a bound on its length: generation runs to max_tokens through
// many automaton states (numbers, enums, strings, separators).
const char* kSchema = R"({"type":"array","items":{"type":"object","properties":{
  "id":{"type":"integer"},"name":{"type":"string","maxLength":12},
  "tags":{"type":"array","items":{"enum":["red","green","blue"]},"maxItems":3},
  "score":{"type":"number"}},"required":["id","name","tags"]}})";

struct Timing {
  double seconds = 0;
  int64_t tokens = 0;
};

Timing decode(infer::ModelRunner& runner, const infer::SamplingParams& p, int streams,
              const data::BpeTokenizer& tok) {
  infer::EngineConfig cfg;
  cfg.eos_ids = {tok.eot_id()};
  infer::LoomEngine e(runner, cfg);
  Timing t;
  std::vector<int32_t> prompt = tok.encode("A list of records as JSON:");
  for (int s = 0; s < streams; ++s)
    e.submit(prompt, p,
             [&](const infer::TokenEvent& ev) { t.tokens += int64_t(ev.tokens.size()); });
  e.step();  // prefill, not timed
  const double t0 = now_seconds();
  e.run_until_idle();
  t.seconds = now_seconds() - t0;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "gpt2-124m", tok_dir = "tests/data/fixtures/tokenizers/gpt2";
  int tokens = 64, streams = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--preset") preset = argv[i + 1];
    if (k == "--tokens") tokens = std::stoi(argv[i + 1]);
    if (k == "--streams") streams = std::stoi(argv[i + 1]);
    if (k == "--tokenizer") tok_dir = argv[i + 1];
  }
  const double load_before = load_average();
  const data::BpeTokenizer tok = data::load_gpt2_tokenizer(tok_dir);
  ModelConfig mc = model_preset(preset);
  mc.vocab = tok.vocab_size();
  Decoder model(mc, cpu_backend());
  model.params().init(1);
  infer::DecoderRunner runner(model);

  std::vector<std::string> bytes;
  for (int32_t i = 0; i < tok.vocab_size(); ++i)
    bytes.push_back(size_t(i) < tok.n_ordinary() ? tok.token_bytes(i) : std::string());
  double t0 = now_seconds();
  auto vocab = std::make_shared<const cs::TokenVocabulary>(bytes);
  const double trie_s = now_seconds() - t0;
  t0 = now_seconds();
  auto con = std::make_shared<const cs::TokenConstraint>(
      cs::ByteDfa::build(cs::json_schema_rx(Json::parse(kSchema))), vocab);
  const double compile_s = now_seconds() - t0;

  infer::SamplingParams free;
  free.temperature = 0;
  free.max_tokens = tokens;
  free.ignore_eos = true;
  infer::SamplingParams constrained = free;
  constrained.ignore_eos = false;
  constrained.constraint = con;
  const Timing f = decode(runner, free, streams, tok);
  const Timing cold = decode(runner, constrained, streams, tok);
  const Timing warm = decode(runner, constrained, streams, tok);

  // The sampling step alone, on one row of logits: free argmax against mask + masked argmax.
  std::vector<float> logits(size_t(mc.vocab));
  for (size_t j = 0; j < logits.size(); ++j) logits[j] = float(uniform_at(3, 1, j));
  const int reps = 2000;
  std::vector<float> x(logits);
  t0 = now_seconds();
  for (int r = 0; r < reps; ++r) {
    x = logits;
    infer::sample(x.data(), mc.vocab, free, {}, 0, 1, 0, uint64_t(r));
  }
  const double sample_free_us = (now_seconds() - t0) / reps * 1e6;
  const std::vector<uint64_t>& mask = con->allowed(con->start());
  t0 = now_seconds();
  for (int r = 0; r < reps; ++r) {
    x = logits;
    infer::sample(x.data(), mc.vocab, free, {}, 0, 1, 0, uint64_t(r), mask.data());
  }
  const double sample_masked_us = (now_seconds() - t0) / reps * 1e6;

  Json j = Json::object();
  j["model"] = preset;
  j["threads"] = num_threads();
  j["streams"] = streams;
  j["tokenizer_trie_seconds"] = trie_s;
  j["schema_compile_seconds"] = compile_s;
  j["automaton_states"] = con->dfa().num_states();
  j["free_ms_per_step"] = f.seconds / double(f.tokens / streams) * 1e3;
  j["constrained_cold_ms_per_step"] = cold.seconds / double(cold.tokens / streams) * 1e3;
  j["constrained_warm_ms_per_step"] = warm.seconds / double(warm.tokens / streams) * 1e3;
  j["constrained_tokens"] = warm.tokens;
  j["sample_free_us"] = sample_free_us;
  j["sample_masked_us"] = sample_masked_us;
  j["load_average_before"] = load_before;
  j["load_average_after"] = load_average();
  std::printf("%s\n", j.dump(2).c_str());
  std::printf("constrained step %.2f ms (warm; %.2f ms cold) against a free step %.2f ms\n",
              j["constrained_warm_ms_per_step"].as_double(),
              j["constrained_cold_ms_per_step"].as_double(), j["free_ms_per_step"].as_double());
  return 0;
}
