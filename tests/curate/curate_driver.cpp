// A `loom` with only the curate command, for the CLI tests (same error handling as main.cpp).
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "core/error.h"

namespace loom::cli {
int run_curate(const Args& args);
}

int main(int argc, char** argv) {
  try {
    return loom::cli::run_curate(loom::cli::Args(argv + 1, argv + argc));
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom curate: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom curate: internal error: %s\n", e.what());
    return 1;
  }
}
