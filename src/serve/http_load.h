// The HTTP driver of `loom bench serve`: sends the load spec's requests to a running
// OpenAI-compatible server (`/v1/completions`, streamed, token-id prompts, ignore_eos) at their
// Poisson arrival times, one client thread per request in flight, and timestamps every
// server-sent event. Figures come from infer::summarize, as for the in-process driver.
#pragma once

#include <string>
#include <vector>

#include "infer/load_gen.h"

namespace loom::serve {

struct HttpTarget {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string model;  // empty: the server's default
};

// Parses "http://host:port" (a path after it is ignored); throws naming the URL.
HttpTarget parse_url(const std::string& url);

std::vector<infer::RequestRecord> run_load_http(const HttpTarget& target,
                                                const infer::LoadSpec& spec, double* duration);

}  // namespace loom::serve
