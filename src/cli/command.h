// A subcommand of `loom`: its name, a one-line summary for `loom --help`, and its entry point.
// Entry points receive the arguments after the subcommand name and return the exit code.
#pragma once

#include <string>
#include <vector>

namespace loom::cli {

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args& args);
};

// Every subcommand, in the order `loom --help` lists them (commands.cpp).
const std::vector<Command>& commands();

}  // namespace loom::cli
