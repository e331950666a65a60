// loom score: a reward model's scores of conversations (train.mode = "reward" checkpoints):
// reads JSONL lines {"prompt", "completion"} (strings, or message lists as DPO's prompt and
// reply), or {"messages": [...]}, renders each with the run's chat template and writes the line
// back with "reward": its score (the value head at the conversation's last token), in order.
// With --min-reward only the lines scoring at least that are written (a filter of synthetic
// data). Lines are scored a micro-batch at a time (--batch), each conversation its own sequence.
// Rejection sampling (--policy CKPT --n N): each line is a prompt ({"prompt"}); the policy
// samples N completions of it (the serving engine, --temperature, --tokens, seeded by --seed and
// the line), the reward model scores each, and the best is written as SFT data:
// {"prompt", "completion", "reward", "rewards": [all N]} (ties: the first).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "cli/command.h"
#include "cli/options.h"
#include "cli/serving_setup.h"
#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/jsonl.h"
#include "core/log.h"
#include "data/chat.h"
#include "infer/engine.h"
#include "infer/generator.h"
#include "infer/model_runner.h"
#include "infer/request_sampling.h"
#include "train/reward_recipe.h"

namespace loom::cli {
namespace {

// Rejection sampling: --n completions of each prompt from --policy, the best by the reward
// model written as {"prompt", "completion", "reward", "rewards"}.
template <class Score>
int best_of_n(const Options& o, const data::ChatTemplate& rm_chat, Score& score, int n,
              int max_tokens, double temperature, uint64_t seed, int rm_max_seq) {
  auto policy = load_model_from_checkpoint(o.get("policy"));
  auto ptok = checkpoint_tokenizer(o.get("policy"), "", *policy);
  LOOM_CHECK(ptok, o.get("policy"), ": the policy needs its tokenizer (chat prompts)");
  const ckpt::Checkpoint pc(o.get("policy"));
  const Config prun = Config::parse(pc.state().config_text, pc.dir() + "/state.json:config_text");
  data::ChatTemplate pchat(prun.get_string("data.chat_template", "chatml"), *ptok);
  infer::DecoderRunner runner(*policy);
  infer::EngineConfig ec;
  set_text_codec(ec, ptok.get(), &pchat);
  infer::LoomEngine engine(runner, ec);
  std::vector<Json> lines;
  std::vector<std::vector<data::ChatMessage>> prompts;
  for_each_jsonl(o.get("input"), [&](const Json& j, const std::string& where) {
    LOOM_CHECK(j.is_object() && j.contains("prompt"), where, ": expected 'prompt'");
    prompts.push_back(data::chat_messages_of(j.at("prompt"), "user", where, "prompt"));
    lines.push_back(j);
  });
  std::ofstream out(o.get("output"));
  LOOM_CHECK(out, "cannot write ", o.get("output"));
  infer::SamplingParams sp;
  sp.n = n;
  sp.max_tokens = max_tokens;
  sp.temperature = static_cast<float>(temperature);
  infer::validate(sp, policy->config().vocab);
  const size_t chunk = 256;  // prompts in the engine at once (its queue holds 1024 requests)
  for (size_t i0 = 0; i0 < lines.size(); i0 += chunk) {
    const size_t i1 = std::min(lines.size(), i0 + chunk);
    std::vector<std::vector<std::string>> text(i1 - i0, std::vector<std::string>(size_t(n)));
    for (size_t i = i0; i < i1; ++i) {
      infer::SamplingParams p = sp;
      p.seed = seed + uint64_t(i);
      std::vector<int32_t> ids = pchat.prompt_ids(prompts[i]);
      LOOM_CHECK(int(ids.size()) + max_tokens <= policy->config().max_seq, o.get("input"), " line ",
                 i + 1, ": the prompt's ", ids.size(), " tokens and --tokens ", max_tokens,
                 " exceed the policy's context (", policy->config().max_seq, ")");
      engine.submit(std::move(ids), p, [&, i](const infer::TokenEvent& e) {
        text[i - i0][size_t(e.index)] += e.text;
      });
    }
    engine.run_until_idle();
    std::vector<std::vector<int32_t>> convs;
    for (size_t i = i0; i < i1; ++i)
      for (int k = 0; k < n; ++k) {
        std::vector<data::ChatMessage> conv = prompts[i];
        conv.push_back({"assistant", text[i - i0][size_t(k)]});
        convs.push_back(rm_chat.render(conv).ids);
        LOOM_CHECK(int(convs.back().size()) <= rm_max_seq, o.get("input"), " line ", i + 1,
                   ": a completion renders past the reward model's context (", rm_max_seq, ")");
      }
    const std::vector<double> r = score(convs);
    for (size_t i = i0; i < i1; ++i) {
      size_t best = 0;
      Json all = Json::array();
      for (int k = 0; k < n; ++k) {
        const double x = r[(i - i0) * size_t(n) + size_t(k)];
        all.push_back(x);
        if (x > r[(i - i0) * size_t(n) + best]) best = size_t(k);
      }
      Json j = Json::object();
      j["prompt"] = lines[i].at("prompt");
      j["completion"] = text[i - i0][best];
      j["reward"] = r[(i - i0) * size_t(n) + best];
      j["rewards"] = std::move(all);
      out << j.dump() << "\n";
    }
  }
  out.close();
  LOOM_CHECK(out, "writing ", o.get("output"), " failed");
  log_info("best of ", n, " for ", lines.size(), " prompts of ", o.get("input"), " -> ",
           o.get("output"));
  return 0;
}

}  // namespace

int run_score(const Args& args) {
  Options o("loom score --ckpt PATH --input IN.jsonl --output OUT.jsonl [--min-reward R]",
            "Scores conversations with a reward model (a train.mode = \"reward\" checkpoint):\n"
            "each line {\"prompt\", \"completion\"} or {\"messages\"} is written back with\n"
            "\"reward\", its score; with --min-reward only the lines scoring at least that.");
  o.value("ckpt", "", "a reward model's checkpoint (step directory or checkpoints root)", true)
      .value("input", "", "JSONL lines to score", true)
      .value("output", "", "JSONL lines written with \"reward\"", true)
      .value("min-reward", "", "write only the lines whose reward is at least this")
      .value("batch", "8", "conversations per forward pass")
      .value("chat-template", "", "chatml | llama3 | hf:PATH (default: the run's)")
      .value("tokenizer", "", "tokenizer spec (default: the checkpoint's)")
      .value("policy", "", "rejection sampling: the checkpoint that samples --n completions")
      .value("n", "4", "--policy: completions sampled per prompt")
      .value("tokens", "64", "--policy: tokens per completion at most")
      .value("temperature", "1.0", "--policy: sampling temperature (> 0)")
      .value("seed", "0", "--policy: sampling seed");
  if (!o.parse(args)) return 0;
  const bool best_of = !o.get("policy").empty();
  const int best_n = static_cast<int>(o.get_int("n", 1, 1024));
  const int max_tokens = static_cast<int>(o.get_int("tokens", 1, 1 << 20));
  const double temperature = o.get_double("temperature");
  LOOM_CHECK(temperature > 0 && temperature <= 100, "--temperature must lie in (0, 100], got ",
             temperature);
  const uint64_t seed = static_cast<uint64_t>(o.get_int("seed", 0, INT64_MAX));
  LOOM_CHECK(!best_of || o.get("min-reward").empty(),
             "--min-reward filters scored lines; with --policy the best of --n is written");
  for (const char* k : {"n", "tokens", "temperature", "seed"})
    LOOM_CHECK(best_of || !o.has(k), "--", k, " needs --policy (rejection sampling)");
  const int batch = static_cast<int>(o.get_int("batch", 1, 4096));
  const bool filter = !o.get("min-reward").empty();
  const double min_reward = filter ? o.get_double("min-reward") : 0;
  auto model = load_model_from_checkpoint(o.get("ckpt"));
  LOOM_CHECK(model->config().value_head, o.get("ckpt"),
             ": not a reward model (no value head: train it with train.mode = \"reward\")");
  auto tok = checkpoint_tokenizer(o.get("ckpt"), o.get("tokenizer"), *model);
  LOOM_CHECK(tok, o.get("ckpt"), ": scoring renders chat text and needs the run's tokenizer");
  std::string tmpl = o.get("chat-template");
  if (tmpl.empty()) {
    const ckpt::Checkpoint c(o.get("ckpt"));
    const Config run = Config::parse(c.state().config_text, c.dir() + "/state.json:config_text");
    tmpl = run.get_string("data.chat_template", "chatml");
  }
  data::ChatTemplate chat(tmpl, *tok);
  const int max_seq = model->config().max_seq;

  // The scores of rendered conversations, --batch at a time.
  auto score = [&](const std::vector<std::vector<int32_t>>& convs) {
    std::vector<double> r;
    for (size_t i0 = 0; i0 < convs.size(); i0 += size_t(batch)) {
      const size_t i1 = std::min(convs.size(), i0 + size_t(batch));
      Batch b;
      b.cu_seqlens.push_back(0);
      for (size_t i = i0; i < i1; ++i) {
        for (size_t t = 0; t < convs[i].size(); ++t) {
          b.tokens.push_back(convs[i][t]);
          b.targets.push_back(-1);
          b.positions.push_back(int32_t(t));
        }
        b.cu_seqlens.push_back(int32_t(b.tokens.size()));
        b.lengths.push_back(int32_t(convs[i].size()));
      }
      b.B = 1;
      b.T = int(b.tokens.size());
      ModelInput in = b.input();
      const std::vector<int32_t> rows = last_token_rows(b);
      in.value_rows = rows.data();
      in.n_values = int(rows.size());
      StepOutputs so;
      model->forward_loss(in, &so);
      r.insert(r.end(), so.values.begin(), so.values.end());
    }
    return r;
  };
  if (best_of) return best_of_n(o, chat, score, best_n, max_tokens, temperature, seed, max_seq);

  struct Line {
    Json json;
    std::vector<int32_t> ids;
  };
  std::vector<Line> lines;
  for_each_jsonl(o.get("input"), [&](const Json& j, const std::string& where) {
    LOOM_CHECK(j.is_object(), where, ": expected an object");
    std::vector<data::ChatMessage> conv;
    if (j.contains("messages")) {
      conv = data::chat_messages_of(j.at("messages"), "user", where, "messages");
    } else {
      LOOM_CHECK(j.contains("prompt") && j.contains("completion"), where,
                 ": expected 'prompt' and 'completion', or 'messages'");
      conv = data::chat_messages_of(j.at("prompt"), "user", where, "prompt");
      for (auto& m : data::chat_messages_of(j.at("completion"), "assistant", where, "completion"))
        conv.push_back(m);
    }
    Line l;
    l.json = j;
    l.ids = chat.render(conv).ids;
    LOOM_CHECK(!l.ids.empty(), where, ": renders to no tokens");
    LOOM_CHECK(int(l.ids.size()) <= max_seq, where, ": ", l.ids.size(),
               " tokens, more than the model's context (model.max_seq ", max_seq, ")");
    lines.push_back(std::move(l));
  });
  std::ofstream out(o.get("output"));
  LOOM_CHECK(out, "cannot write ", o.get("output"));
  int64_t written = 0;
  std::vector<std::vector<int32_t>> convs;
  for (const Line& l : lines) convs.push_back(l.ids);
  const std::vector<double> rewards = score(convs);
  for (size_t i = 0; i < lines.size(); ++i) {
    const double r = rewards[i];
    if (filter && !(r >= min_reward)) continue;
    Json j = lines[i].json;
    j["reward"] = r;
    out << j.dump() << "\n";
    ++written;
  }
  out.close();
  LOOM_CHECK(out, "writing ", o.get("output"), " failed");
  log_info("scored ", lines.size(), " lines of ", o.get("input"), " -> ", o.get("output"),
           filter ? cat(" (", written, " at or above ", min_reward, ")") : std::string());
  return 0;
}

}  // namespace loom::cli
