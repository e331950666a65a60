#include "data/tokenize_job.h"

#include <signal.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/parallel.h"
#include "data/indexed_dataset.h"
#include "data/line_reader.h"
#include "data/unicode.h"

namespace loom::data {

namespace {

struct LineError {
  int64_t line;
  std::string message;
};

// What a worker makes of one block.
struct BlockResult {
  std::vector<int32_t> tokens;     // all documents back to back
  std::vector<int64_t> doc_sizes;  // tokens per document
  std::vector<LineError> errors;
  int64_t lines = 0;
};

// Returns the document text of a JSONL line, or an error message.
bool document_text(std::string_view line, const std::string& field, std::string* text,
                   std::string* error) {
  Json j;
  try {
    j = Json::parse(line, "line");
  } catch (const Error& e) {
    *error = cat("bad JSON: ", e.what());
    return false;
  }
  if (!j.is_object()) {
    *error = "not a JSON object";
    return false;
  }
  if (!j.contains(field)) {
    *error = cat("missing field '", field, "'");
    return false;
  }
  const Json& v = j.at(field);
  if (!v.is_string()) {
    *error = cat("field '", field, "' is not a string");
    return false;
  }
  size_t bad = 0;
  if (!utf8_valid(v.as_string(), &bad)) {
    *error = cat("field '", field, "' is not valid UTF-8 (byte ", bad, " of the text)");
    return false;
  }
  *text = v.as_string();
  return true;
}

void process_block(const BpeTokenizer& tok, const TokenizeOptions& opt, int32_t eod,
                   const LineBlock& b, BlockResult& r) {
  std::string text, error;
  for_each_line(b, [&](std::string_view line, int64_t line_no) {
    ++r.lines;
    if (!r.errors.empty() && !opt.skip_errors) return;  // the block fails at its first error
    if (line.find_first_not_of(" \t") == std::string_view::npos) return;  // blank line
    if (!document_text(line, opt.field, &text, &error)) {
      r.errors.push_back({line_no, error});
      return;
    }
    size_t before = r.tokens.size();
    tok.encode(text, r.tokens, /*allow_special=*/true);
    if (opt.append_eod) r.tokens.push_back(eod);
    r.doc_sizes.push_back(int64_t(r.tokens.size() - before));
  });
}

// A killed run leaves its AtomicFile temporaries, PREFIX.bin.tmp.<pid> and PREFIX.idx.tmp.<pid>,
// behind. Those of this output whose process is gone are removed so reruns do not pile them
// up; a live process's (a concurrent run over the same prefix) is left alone.
void remove_stale_temps(const std::string& prefix) {
  namespace fs = std::filesystem;
  fs::path p(prefix);
  fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  std::string base = p.filename().string();
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    for (const char* ext : {".bin.tmp.", ".idx.tmp."}) {
      std::string head = base + ext;
      if (name.size() <= head.size() || name.compare(0, head.size(), head) != 0) continue;
      std::string pid_text = name.substr(head.size());
      if (pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9)
        continue;
      pid_t pid = static_cast<pid_t>(std::stol(pid_text));
      if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
        log_info("tokenize: removing ", it->path().string(), " left by an interrupted run");
        fs::remove(it->path(), ec);
      }
    }
  }
}

}  // namespace

TokenizeStats tokenize_jsonl(const BpeTokenizer& tok, const TokenizeOptions& opt) {
  LOOM_CHECK(!opt.output_prefix.empty(), "no output prefix");
  const int32_t eod = tok.eot_id();
  LOOM_CHECK(!opt.append_eod || eod >= 0,
             "--append-eod: the tokenizer has no <|endoftext|> special token");
  const int n_workers = std::max(1, opt.workers);
  LineBlockReader reader(opt.inputs, opt.block_bytes);
  std::string parent = std::filesystem::path(opt.output_prefix).parent_path().string();
  if (!parent.empty()) make_dirs(parent);
  remove_stale_temps(opt.output_prefix);
  IndexedDatasetWriter writer(opt.output_prefix, dtype_for_vocab(tok.vocab_size()));

  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::deque<LineBlock> todo;
  std::map<uint64_t, std::pair<size_t, BlockResult>> done;  // seq -> (file, result)
  bool stop = false, worker_failed = false;
  // A worker that throws wakes the writer below, which then rethrows its exception.
  WorkerGroup workers(
      n_workers,
      [&](int) {
        while (true) {
          LineBlock b;
          {
            std::unique_lock lk(mu);
            cv_work.wait(lk, [&] { return !todo.empty() || stop; });
            if (todo.empty()) return;
            b = std::move(todo.front());
            todo.pop_front();
          }
          BlockResult r;
          process_block(tok, opt, eod, b, r);
          {
            std::lock_guard lk(mu);
            done.emplace(b.seq, std::make_pair(b.file, std::move(r)));
          }
          cv_done.notify_all();
        }
      },
      [&] {
        {
          std::lock_guard lk(mu);
          stop = worker_failed = true;
        }
        cv_work.notify_all();
        cv_done.notify_all();
      });
  auto stop_workers = [&] {
    {
      std::lock_guard lk(mu);
      stop = true;
    }
    cv_work.notify_all();
  };

  TokenizeStats st;
  st.input_bytes = reader.total_bytes();
  const double t0 = now_seconds();
  double last_log = t0;
  uint64_t next_write = 0, submitted = 0;
  const uint64_t max_in_flight = uint64_t(2 * n_workers + 1);

  // Writes the next block's result (waiting for it); throws on a fatal line error.
  auto write_next = [&] {
    std::pair<size_t, BlockResult> item;
    {
      std::unique_lock lk(mu);
      cv_done.wait(lk, [&] { return done.count(next_write) > 0 || worker_failed; });
      if (done.count(next_write) == 0) {
        lk.unlock();
        workers.join();  // rethrows the worker's exception
        fail("tokenize: a worker stopped without a result for block ", next_write);
      }
      item = std::move(done[next_write]);
      done.erase(next_write);
    }
    ++next_write;
    auto& [file, r] = item;
    for (auto& e : r.errors) {
      std::string where = cat(reader.path(file), ":", e.line, ": ", e.message);
      if (!opt.skip_errors) fail(where, " (use --on-error skip to skip such lines)");
      if (st.skipped < opt.max_reported_errors) log_warn("skipping ", where);
      ++st.skipped;
    }
    size_t off = 0;
    for (int64_t n : r.doc_sizes) {
      writer.add_document(std::span<const int32_t>(r.tokens.data() + off, size_t(n)));
      off += size_t(n);
    }
    st.lines += r.lines;
    st.documents += int64_t(r.doc_sizes.size());
    st.tokens += r.tokens.size();
    double now = now_seconds();
    if (opt.progress && now - last_log > 2) {
      last_log = now;
      double mb = double(reader.bytes_read()) / 1e6, rate = mb / (now - t0);
      double left = double(reader.total_bytes() - reader.bytes_read()) / 1e6 / std::max(rate, 1e-9);
      log_info("tokenize: ", int64_t(mb), " / ", int64_t(reader.total_bytes() / 1000000), " MB, ",
               int64_t(rate * 10) / 10.0, " MB/s, ", st.documents, " docs, ", st.tokens,
               " tokens, ETA ", int64_t(left), " s");
    }
  };

  try {
    LineBlock b;
    while (reader.next(b)) {
      while (submitted - next_write >= max_in_flight) write_next();
      {
        std::lock_guard lk(mu);
        todo.push_back(std::move(b));
      }
      ++submitted;
      cv_work.notify_one();
    }
    while (next_write < submitted) write_next();
  } catch (...) {
    stop_workers();
    workers.join_quietly();
    throw;  // the writer's destructor removes the temporary outputs
  }
  stop_workers();
  workers.join();
  writer.finalize();
  st.seconds = now_seconds() - t0;
  if (opt.progress) {
    log_info("tokenize: wrote ", opt.output_prefix, ".{bin,idx}: ", st.documents, " documents, ",
             st.tokens, " tokens (", dtype_name(dtype_for_vocab(tok.vocab_size())), ") from ",
             st.lines, " lines, ", st.skipped, " skipped, ",
             int64_t(double(st.input_bytes) / 1e6 / std::max(st.seconds, 1e-9) * 10) / 10.0,
             " MB/s");
  }
  return st;
}

}  // namespace loom::data
