#include "serve/http_load.h"

#include <httplib.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/json.h"
#include "core/open_files.h"

namespace loom::serve {
namespace {

double clock_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string request_body(const infer::LoadSpec& spec, const HttpTarget& t,
                         const std::vector<int32_t>& prompt) {
  Json ids = Json::array();
  for (int32_t x : prompt) ids.push_back(int64_t(x));
  Json j = Json::object();
  if (!t.model.empty()) j["model"] = t.model;
  j["prompt"] = ids;
  j["max_tokens"] = spec.output_len;
  j["temperature"] = 0.0;
  j["ignore_eos"] = true;
  j["stream"] = true;
  // One event per token: with logprobs every token is sent as it is made, even when its text is
  // held back (an incomplete UTF-8 character), so chunk times are token times.
  j["logprobs"] = 0;
  Json so = Json::object();
  so["include_usage"] = true;
  j["stream_options"] = so;
  return j.dump();
}

// One streamed request, timed; runs on its own thread.
void one_request(const HttpTarget& t, const infer::LoadSpec& spec, int i, double t0,
                 infer::RequestRecord& r) {
  const std::vector<int32_t> prompt = infer::random_prompt(spec, i);
  r.prompt_tokens = static_cast<int>(prompt.size());
  httplib::Client cli(t.host, t.port);
  cli.set_connection_timeout(10, 0);
  cli.set_read_timeout(static_cast<time_t>(spec.timeout_seconds), 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = request_body(spec, t, prompt);
  req.set_header("Content-Type", "application/json");
  std::string buf;
  int usage_tokens = -1;
  std::string finish;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const double now = clock_now() - t0;
    buf.append(data, n);
    size_t end;
    while ((end = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      const std::string payload = ev.substr(6);
      if (payload == "[DONE]") continue;
      Json j;
      try {
        j = Json::parse(payload, "server-sent event");
      } catch (const Error& e) {
        r.error = cat("unparsable event: ", e.what());
        return false;  // ends the request (reported as failed)
      }
      if (j.contains("error")) {
        r.error = payload;
        return false;
      }
      if (j.contains("usage") && j.at("usage").is_object())
        usage_tokens = static_cast<int>(j.at("usage").at("completion_tokens").as_int());
      for (const Json& c : j.at("choices").as_array()) {
        if (c.contains("finish_reason") && c.at("finish_reason").type() == Json::Type::String)
          finish = c.at("finish_reason").as_string();
        if (!c.contains("logprobs") || !c.at("logprobs").is_object()) continue;
        const int k = static_cast<int>(c.at("logprobs").at("tokens").as_array().size());
        if (k == 0) continue;
        if (r.chunk_times.empty()) r.first = now;
        r.chunk_times.push_back(now);
        r.output_tokens += k;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  r.sent = clock_now() - t0;
  bool sent = false;
  try {
    sent = cli.send(req, res, err);
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  r.done = clock_now() - t0;
  if (!r.error.empty()) return;
  if (!sent) {
    r.error = cat("HTTP error: ", httplib::to_string(err));
  } else if (res.status != 200) {
    r.error = cat("HTTP ", res.status, ": ", res.body.substr(0, 300));
  } else if (finish != "length" || r.output_tokens != spec.output_len ||
             (usage_tokens >= 0 && usage_tokens != r.output_tokens)) {
    r.error = cat("finish_reason '", finish, "' after ", r.output_tokens,
                  " streamed tokens (usage ", usage_tokens, "), expected ", spec.output_len);
  } else {
    r.ok = true;
  }
}

}  // namespace

HttpTarget parse_url(const std::string& url) {
  HttpTarget t;
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  LOOM_CHECK(rest.find("://") == std::string::npos, "URL ", url, ": only http:// is supported");
  rest = rest.substr(0, rest.find('/'));
  const size_t colon = rest.rfind(':');
  LOOM_CHECK(colon != std::string::npos && colon > 0, "URL ", url, ": expected http://host:port");
  t.host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  LOOM_CHECK(!port.empty() && port.size() <= 5 &&
                 port.find_first_not_of("0123456789") == std::string::npos,
             "URL ", url, ": port '", port, "' is not a number");
  t.port = std::stoi(port);
  LOOM_CHECK(t.port > 0 && t.port < 65536, "URL ", url, ": port ", t.port, " out of range");
  return t;
}

std::vector<infer::RequestRecord> run_load_http(const HttpTarget& target,
                                                const infer::LoadSpec& spec, double* duration) {
  raise_open_file_limit();  // a connection per request in flight
  const std::vector<double> arrivals = infer::poisson_arrivals(spec);
  std::vector<infer::RequestRecord> rec(size_t(spec.num_prompts));
  std::vector<std::thread> threads;
  const double t0 = clock_now();
  for (size_t i = 0; i < rec.size(); ++i) {
    const double wait = arrivals[i] - (clock_now() - t0);
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    threads.emplace_back(one_request, std::cref(target), std::cref(spec), int(i), t0,
                         std::ref(rec[i]));
  }
  // Every client has a read timeout, so these joins end.
  for (std::thread& t : threads) t.join();
  *duration = clock_now() - t0;
  return rec;
}

}  // namespace loom::serve
