#include "cli/command.h"

namespace loom::cli {

int run_train(const Args& args);
int run_generate(const Args& args);
int run_bench(const Args& args);
int run_ckpt(const Args& args);
int run_plan(const Args& args);
int run_tokenize(const Args& args);
int run_tokenizer(const Args& args);
int run_launch(const Args& args);
int run_supervise(const Args& args);
int run_rl(const Args& args);
int run_score(const Args& args);
#ifdef LOOM_HAVE_CURATE
int run_curate(const Args& args);
#endif
#ifdef LOOM_HAVE_SERVE
int run_serve(const Args& args);
#endif

const std::vector<Command>& commands() {
  static const std::vector<Command> all = {
      {"train", "train a GPT-2 or Llama-style model from a config file", run_train},
      {"generate", "sample text from a checkpoint, or a JSONL file of prompts at full batch",
       run_generate},
      {"bench",
       "benchmarks: 'loom bench train' (training throughput), 'loom bench serve' (serving)",
       run_bench},
      {"ckpt", "inspect checkpoints; export/import Hugging Face safetensors", run_ckpt},
      {"plan", "predict memory, step time, MFU and goodput at scale; search layouts", run_plan},
      {"tokenize", "JSONL -> Megatron-compatible token files (.bin/.idx)", run_tokenize},
      {"rl", "GRPO on a verifiable task (sync or asynchronous, rollout ranks over MPI)", run_rl},
      {"score", "score JSONL conversations with a reward model (filter with --min-reward)",
       run_score},
      {"launch", "run N ranks of a loom command (mpirun), supervised and restarted", run_launch},
      {"supervise", "supervise and restart a job started by srun or mpirun", run_supervise},
      {"tokenizer", "train a BPE vocabulary; encode/decode (GPT-2, tiktoken, Loom)", run_tokenizer},
#ifdef LOOM_HAVE_SERVE
      {"serve", "OpenAI-compatible HTTP server (continuous batching, paged KV cache)", run_serve},
#endif
#ifdef LOOM_HAVE_CURATE
      {"curate", "clean, filter and deduplicate raw text into training JSONL + report", run_curate},
#endif
  };
  return all;
}

}  // namespace loom::cli
