// BPE encoding throughput with the GPT-2 vocabulary on English text: MB/s per thread for each
// thread count (each thread encodes its own copy of the corpus), the ratio to the 10 MB/s
// per-thread target, and the scaling against one thread (1.00 = linear); then one JSON line.
//
//   bench_tokenizer [--vocab DIR|FILE] [--text FILE] [--mb N] [--reps N] [--threads 1,2,4]
//
// Default text: every licence in /usr/share/common-licenses concatenated (plain English),
// repeated up to --mb megabytes. Wall-clock scaling is only meaningful on idle cores, so each
// thread's CPU time is measured too: MB per CPU-second per thread staying flat as threads are
// added shows the encoder itself scales linearly (no shared state or contention).
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/fs.h"
#include "core/log.h"
#include "data/bpe.h"

#ifndef LOOM_GPT2_VOCAB
#define LOOM_GPT2_VOCAB "tests/data/fixtures/tokenizers/gpt2"
#endif

int main(int argc, char** argv) {
  std::string vocab = LOOM_GPT2_VOCAB, text_path, thread_list = "1,2";
  double mb = 16;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--vocab") {
      vocab = argv[i + 1];
    } else if (a == "--text") {
      text_path = argv[i + 1];
    } else if (a == "--mb") {
      mb = std::atof(argv[i + 1]);
    } else if (a == "--reps") {
      reps = std::max(1, std::atoi(argv[i + 1]));
    } else if (a == "--threads") {
      thread_list = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  try {
    std::vector<int> counts;
    for (size_t p = 0; p < thread_list.size();) {
      size_t q = thread_list.find(',', p);
      if (q == std::string::npos) q = thread_list.size();
      counts.push_back(std::max(1, std::atoi(thread_list.substr(p, q - p).c_str())));
      p = q + 1;
    }
    auto tok = loom::data::load_tokenizer(vocab);
    std::string base;
    if (!text_path.empty()) {
      base = loom::read_file(text_path);
    } else {
      for (auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses"))
        if (e.is_regular_file()) base += loom::read_file(e.path().string()) + "\n";
    }
    if (base.empty()) {
      std::fprintf(stderr, "bench_tokenizer: no text to encode\n");
      return 1;
    }
    std::string text;
    while (text.size() < size_t(mb * 1e6)) text += base;
    const double text_mb = double(text.size()) / 1e6;
    std::printf("text: %.1f MB (%.2f MB of distinct source text repeated), vocab: %s, %u cores\n",
                text_mb, double(base.size()) / 1e6, vocab.c_str(),
                std::thread::hardware_concurrency());

    size_t n_tokens = 0;
    auto thread_cpu = [] {
      timespec ts;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
    };
    // Best of reps: {MB/s per thread (wall), MB per CPU-second per thread}.
    auto run = [&](int threads) {
      double best = 1e30, best_cpu = 1e30;
      for (int r = 0; r < reps; ++r) {
        std::vector<size_t> got(static_cast<size_t>(threads));
        std::vector<double> cpu(static_cast<size_t>(threads));
        double t0 = loom::now_seconds();
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            double c0 = thread_cpu();
            std::vector<int32_t> ids;
            ids.reserve(text.size() / 3);
            tok->encode(text, ids);
            got[size_t(t)] = ids.size();
            cpu[size_t(t)] = thread_cpu() - c0;
          });
        for (auto& th : pool) th.join();
        best = std::min(best, loom::now_seconds() - t0);
        best_cpu = std::min(best_cpu, *std::max_element(cpu.begin(), cpu.end()));
        n_tokens = got[0];
      }
      return std::pair<double, double>{text_mb / best, text_mb / best_cpu};
    };
    const double target = 10.0;
    std::vector<double> rates, cpu_rates;
    for (int n : counts) {
      auto [wall, cpu] = run(n);
      rates.push_back(wall);
      cpu_rates.push_back(cpu);
    }
    std::printf("tokens: %zu (%.2f bytes/token)\n", n_tokens, double(text.size()) / n_tokens);
    std::string json =
        "{\"bench\":\"tokenizer\",\"vocab\":\"gpt2\",\"text_mb\":" + std::to_string(text_mb) +
        ",\"target_mbps_per_thread\":10";
    for (size_t k = 0; k < counts.size(); ++k) {
      double scaling = rates[k] / rates[0], cpu_scaling = cpu_rates[k] / cpu_rates[0];
      std::printf(
          "%2d thread(s): %7.2f MB/s per thread (%.2fx the %.0f MB/s target; %.2f of "
          "linear) | %7.2f MB per CPU-second per thread (%.2f of 1 thread)\n",
          counts[k], rates[k], rates[k] / target, target, scaling, cpu_rates[k], cpu_scaling);
      std::string n = std::to_string(counts[k]);
      json += ",\"mbps_per_thread_" + n + "\":" + std::to_string(rates[k]);
      json += ",\"ratio_to_target_" + n + "\":" + std::to_string(rates[k] / target);
      json += ",\"scaling_" + n + "\":" + std::to_string(scaling);
      json += ",\"mb_per_cpu_s_" + n + "\":" + std::to_string(cpu_rates[k]);
      json += ",\"cpu_scaling_" + n + "\":" + std::to_string(cpu_scaling);
    }
    std::printf("%s}\n", json.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
