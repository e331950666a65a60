#include "train/finetune_bench.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/bench_util.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/bpe.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "optim/adamw.h"
#include "train/batch.h"
#include "train/chat_source.h"

namespace loom {

namespace {

// A fresh directory under $TMPDIR (or /tmp).
std::string make_temp_dir(const std::string& tag) {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/" + tag + ".XXXXXX";
  LOOM_CHECK(mkdtemp(templ.data()) != nullptr, "bench: cannot create a directory ", templ);
  return templ;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs f in a child process and returns the JSON it produced; the child's own peak RSS is
// added as "peak_rss_mb". Fails (naming `what`) when the child throws, dies or runs past the
// timeout (then it is killed).
template <typename F>
Json in_child(const std::string& what, double timeout_s, F&& f) {
  int fd[2];
  LOOM_CHECK(pipe(fd) == 0, "bench: pipe failed");
  std::fflush(stdout);
  const pid_t pid = fork();
  LOOM_CHECK(pid >= 0, "bench: fork failed");
  if (pid == 0) {
    close(fd[0]);
    std::string out;
    int rc = 0;
    try {
      Json j = f();
      j["peak_rss_mb"] = peak_rss_mb();
      out = j.dump();
    } catch (const std::exception& e) {
      out = e.what();
      rc = 1;
    }
    for (size_t at = 0; at < out.size();) {
      const ssize_t n = write(fd[1], out.data() + at, out.size() - at);
      if (n <= 0) break;
      at += size_t(n);
    }
    close(fd[1]);
    _exit(rc);
  }
  close(fd[1]);
  // Read until the child closes its end, then reap it; a child past the timeout is killed
  // (the read then ends too).
  std::string text;
  char buf[4096];
  const double deadline = now_seconds() + timeout_s;
  int status = 0;
  bool reaped = false, killed = false;
  for (;;) {
    if (!reaped) {
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) reaped = true;
    }
    if (!reaped && !killed && now_seconds() > deadline) {
      kill(pid, SIGKILL);
      killed = true;
    }
    fd_set set;
    FD_ZERO(&set);
    FD_SET(fd[0], &set);
    timeval tv{0, 200000};
    const int ready = select(fd[0] + 1, &set, nullptr, nullptr, &tv);
    if (ready > 0) {
      const ssize_t n = read(fd[0], buf, sizeof buf);
      if (n > 0) {
        text.append(buf, size_t(n));
        continue;
      }
      if (n == 0 || errno != EINTR) break;  // end of the child's output
    }
  }
  close(fd[0]);
  if (!reaped) waitpid(pid, &status, 0);
  LOOM_CHECK(!killed, "bench ", what, ": still running after ", timeout_s, " s; killed");
  LOOM_CHECK(WIFEXITED(status), "bench ", what, ": the child process died (signal ",
             WIFSIGNALED(status) ? WTERMSIG(status) : 0, ")");
  LOOM_CHECK(WEXITSTATUS(status) == 0, "bench ", what, ": ", text);
  return Json::parse(text, "bench " + what);
}

// One configuration's optimizer steps on synthetic tokens: full fine-tuning or LoRA.
Json time_steps(const FinetuneBenchOptions& o, bool lora) {
  set_num_threads(o.threads);
  ModelConfig mc = model_preset(o.preset);
  LOOM_CHECK(o.seq <= mc.max_seq, "--seq ", o.seq, " exceeds the preset's max_seq ", mc.max_seq);
  Decoder model(mc, cpu_backend());
  model.params().init(1);
  std::unique_ptr<Lora> adapters;
  if (lora) {
    LoraConfig lc;
    lc.rank = o.lora_rank;
    lc.alpha = o.lora_alpha;
    lc.targets = {o.lora_targets};
    lc.dropout = o.lora_dropout;
    lc.seed = 1;
    adapters = std::make_unique<Lora>(model, lc);
  }
  ParamSet& T = adapters ? adapters->params() : model.params();
  AdamW optim(T, AdamWConfig{}, DType::F32, cpu_backend());
  int64_t state_bytes = 0;
  for (auto& [name, t] : optim.state_tensors()) state_bytes += t.numel() * 4;
  Batch b = synthetic_batch(o.batch, o.seq, mc.vocab, 7);
  const double tokens = double(o.batch) * o.seq;
  std::vector<double> wall, cpu;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    const double t0 = now_seconds(), c0 = process_cpu_seconds();
    T.zero_grad();  // under LoRA the adapters only: the base's gradient pages stay untouched
    if (adapters) adapters->set_dropout_batch(uint64_t(s));  // as the trainer keys it
    model.forward_backward(b.input(), static_cast<float>(1.0 / tokens));
    optim.step(1e-4, 1.f);
    if (s >= o.warmup) {
      wall.push_back(now_seconds() - t0);
      cpu.push_back(process_cpu_seconds() - c0);
    }
  }
  Json j = Json::object();
  j["mode"] = lora ? "lora" : "full";
  if (adapters) j["lora"] = adapters->config().describe();
  j["trainable_params"] = T.total();
  j["optimizer_state_bytes"] = state_bytes;
  j["step_seconds_median"] = median(wall);
  j["step_cpu_seconds_median"] = median(cpu);
  j["tokens_per_s"] = tokens / median(wall);
  return j;
}

// Synthetic chat data for the SFT throughput: conversations of 1/8 to 1/2 of --seq tokens
// (byte tokens; a NUL byte never occurs, so token 0 marks padding), and a byte tokenizer.
void write_chat_data(const std::string& dir, const FinetuneBenchOptions& o) {
  data::save_loom_tokenizer(data::byte_chatml_tokenizer(), dir + "/tok");
  std::string text;
  const int template_tokens = 12;  // ChatML's markers and role names around two turns
  for (int i = 0; i < o.sft_examples; ++i) {
    const double u = uniform_at(11, uint64_t(i), 0);
    const int len = std::max(2, int(o.seq / 8 + u * (o.seq / 2 - o.seq / 8)) - template_tokens);
    std::string q(size_t(len / 2), 'a'), a(size_t(len - len / 2), 'b');
    for (size_t k = 0; k < q.size(); ++k) q[k] = char('a' + int(uniform_at(12, i, k) * 26));
    text += "{\"messages\": [{\"role\": \"user\", \"content\": \"" + q +
            "\"}, {\"role\": \"assistant\", \"content\": \"" + a + "\"}]}\n";
  }
  write_file_atomic(dir + "/chat.jsonl", text);
}

// Full fine-tuning steps on the chat source's batches, packed or one conversation per row:
// real (non-padding) tokens per second and the share of the batch they fill.
Json time_sft(const FinetuneBenchOptions& o, const std::string& dir, bool packed) {
  set_num_threads(o.threads);
  ModelConfig mc = model_preset(o.preset);
  LOOM_CHECK(o.seq <= mc.max_seq, "--seq ", o.seq, " exceeds the preset's max_seq ", mc.max_seq);
  // The byte tokenizer's ChatML markers are ids 256-258: a tiny preset's 256 grows by three.
  mc.vocab = std::max(mc.vocab, 259);
  Decoder model(mc, cpu_backend());
  model.params().init(1);
  AdamW optim(model.params(), AdamWConfig{}, DType::F32, cpu_backend());
  ChatSource src(dir + "/chat.jsonl", "loom:" + dir + "/tok", "chatml", o.batch, o.seq, packed, 3,
                 0.0, "train");
  std::vector<double> wall, cpu;
  double real = 0, total = 0;
  Batch b;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    src.next(b);
    const double t0 = now_seconds(), c0 = process_cpu_seconds();
    model.params().zero_grad();
    model.forward_backward(b.input(),
                           static_cast<float>(1.0 / std::max<int64_t>(1, b.valid_targets())));
    optim.step(1e-5, 1.f);
    if (s >= o.warmup) {
      wall.push_back(now_seconds() - t0);
      cpu.push_back(process_cpu_seconds() - c0);
      for (int32_t t : b.tokens) real += t != 0;
      total += double(b.tokens.size());
    }
  }
  Json j = Json::object();
  j["packed"] = packed;
  j["packing_efficiency"] = real / total;
  j["real_tokens_per_s"] = real / o.steps / median(wall);
  j["step_seconds_median"] = median(wall);
  j["step_cpu_seconds_median"] = median(cpu);
  j["real_tokens_per_cpu_s"] = real / o.steps / median(cpu);
  return j;
}

}  // namespace

Json run_finetune_bench(const FinetuneBenchOptions& o) {
  LOOM_CHECK(o.batch > 0 && o.seq >= 16 && o.steps > 0 && o.warmup >= 0 && o.threads > 0,
             "batch, steps and threads must be positive and seq at least 16");
  LOOM_CHECK(o.lora_rank > 0, "--lora-rank must be positive, got ", o.lora_rank);
  const double load_before = load_average();
  Json full = in_child("full fine-tuning", o.timeout_s, [&] { return time_steps(o, false); });
  Json lora = in_child("LoRA", o.timeout_s, [&] { return time_steps(o, true); });
  Json j = Json::object();
  j["preset"] = o.preset;
  j["batch"] = o.batch;
  j["seq"] = o.seq;
  j["threads"] = o.threads;
  j["full"] = full;
  j["lora"] = lora;
  const double mem_ratio = lora.at("peak_rss_mb").as_double() / full.at("peak_rss_mb").as_double();
  const double speedup =
      full.at("step_seconds_median").as_double() / lora.at("step_seconds_median").as_double();
  const double cpu_speedup = full.at("step_cpu_seconds_median").as_double() /
                             lora.at("step_cpu_seconds_median").as_double();
  j["lora_peak_memory_ratio"] = mem_ratio;
  j["lora_speedup_wall"] = speedup;
  j["lora_speedup_cpu"] = cpu_speedup;
  std::printf("loom bench finetune: %s, batch %d x %d tokens, %d threads, fp32\n", o.preset.c_str(),
              o.batch, o.seq, o.threads);
  std::printf("  %-6s %14s %12s %12s %14s %16s\n", "mode", "trainable", "step s", "CPU-s/step",
              "peak RSS MiB", "optim state MiB");
  for (const Json* m : {&full, &lora})
    std::printf("  %-6s %14lld %12.3f %12.3f %14.0f %16.2f\n", m->at("mode").as_string().c_str(),
                (long long)m->at("trainable_params").as_int(),
                m->at("step_seconds_median").as_double(),
                m->at("step_cpu_seconds_median").as_double(), m->at("peak_rss_mb").as_double(),
                m->at("optimizer_state_bytes").as_double() / 1048576.0);
  std::printf("  LoRA / full peak memory: %.1f%% (target < 40%%)\n", 100 * mem_ratio);
  std::printf("  LoRA speed-up: %.2fx wall, %.2fx CPU seconds (target >= 1.4x)\n", speedup,
              cpu_speedup);
  if (o.sft) {
    const std::string dir = make_temp_dir("loom_bench_sft");
    Json packed, unpacked;
    try {
      write_chat_data(dir, o);
      packed = in_child("SFT packed", o.timeout_s, [&] { return time_sft(o, dir, true); });
      unpacked = in_child("SFT unpacked", o.timeout_s, [&] { return time_sft(o, dir, false); });
    } catch (...) {
      remove_all(dir);
      throw;
    }
    remove_all(dir);
    j["sft_packed"] = packed;
    j["sft_unpacked"] = unpacked;
    std::printf("  SFT (full fine-tuning, %d synthetic conversations of %d-%d tokens):\n",
                o.sft_examples, o.seq / 8, o.seq / 2);
    for (const Json* m : {&packed, &unpacked})
      std::printf("    %-9s %8.1f real tokens/s (%.1f per CPU-s), packing efficiency %.1f%%\n",
                  m->at("packed").as_bool() ? "packed" : "unpacked",
                  m->at("real_tokens_per_s").as_double(),
                  m->at("real_tokens_per_cpu_s").as_double(),
                  100 * m->at("packing_efficiency").as_double());
    std::printf(
        "    packing speed-up: %.2fx real tokens/s\n",
        packed.at("real_tokens_per_s").as_double() / unpacked.at("real_tokens_per_s").as_double());
  }
  const double load_after = load_average();
  j["load_average_1m_before"] = load_before;
  j["load_average_1m_after"] = load_after;
  std::printf(
      "  load average (1 min): %.2f before, %.2f after (wall times are reliable only when it is "
      "below the thread count; CPU seconds are steadier)\n",
      load_before, load_after);
  return j;
}

}  // namespace loom
