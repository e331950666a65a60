// `loom`: parses the subcommand and hands the rest to it. Errors become one clear line on
// stderr and exit code 1 (2 for usage errors).
#include <cstdio>
#include <cstring>
#include <exception>

#include "cli/command.h"
#include "core/error.h"
#include "core/omp_wait.h"

static void usage(FILE* out) {
  std::fprintf(out,
               "loom: one native system for LLM training, from raw text to a served model\n\n"
               "usage: loom <command> [options]   (loom <command> --help for its options)\n\n"
               "commands:\n");
  for (auto& c : loom::cli::commands()) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
}

int main(int argc, char** argv) {
  loom::bound_omp_spin(argv);  // idle OpenMP threads spin briefly beside other work
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  for (auto& c : loom::cli::commands()) {
    if (std::strcmp(c.name, argv[1]) != 0) continue;
    try {
      return c.run(loom::cli::Args(argv + 2, argv + argc));
    } catch (const loom::Error& e) {
      std::fprintf(stderr, "loom %s: error: %s\n", c.name, e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "loom %s: internal error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "loom: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
