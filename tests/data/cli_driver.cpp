// Runs the real `loom tokenize` / `loom tokenizer` entry points (src/cli/*_cmd.cpp) the way
// loom's main() does, so CLI tests need not link the whole trainer.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli/command.h"
#include "core/error.h"

namespace loom::cli {
int run_tokenize(const Args& args);
int run_tokenizer(const Args& args);
}  // namespace loom::cli

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  loom::cli::Args rest(argv + 2, argv + argc);
  try {
    if (!std::strcmp(argv[1], "tokenize")) return loom::cli::run_tokenize(rest);
    if (!std::strcmp(argv[1], "tokenizer")) return loom::cli::run_tokenizer(rest);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom %s: error: %s\n", argv[1], e.what());
    return 1;
  }
  return 2;
}
