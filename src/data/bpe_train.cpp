#include "data/bpe_train.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <queue>

#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "core/parallel.h"
#include "data/line_reader.h"

namespace loom::data {

namespace {

bool is_jsonl(const std::string& path) {
  return path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
}

// Text of one block: the field of every JSONL line, or the block itself for plain text.
void block_texts(const LineBlock& b, const std::string& path, const std::string& field,
                 const BpeTrainOptions& opt, PieceCounts& counts) {
  if (!is_jsonl(path)) return count_pieces_in_text(b.text, opt, counts);
  for_each_line(b, [&](std::string_view line, int64_t line_no) {
    if (line.find_first_not_of(" \t") == std::string_view::npos) return;
    try {
      Json j = Json::parse(line, "line");
      LOOM_CHECK(j.is_object(), "not a JSON object");
      LOOM_CHECK(j.contains(field), "missing field '", field, "'");
      count_pieces_in_text(j.at(field).as_string(), opt, counts);
    } catch (const Error& e) {
      fail(path, ":", line_no, ": ", e.what());
    }
  });
}

}  // namespace

void count_pieces_in_text(std::string_view text, const BpeTrainOptions& opt, PieceCounts& out) {
  // Cut out special-token strings, then count the pieces of what lies between them.
  size_t start = 0;
  auto flush = [&](std::string_view part) {
    for_each_piece(opt.pretokenizer, part, [&](std::string_view p) { ++out[std::string(p)]; });
  };
  for (size_t i = 0; i < text.size() && !opt.specials.empty(); ++i) {
    for (auto& s : opt.specials) {
      if (s.empty() || text.compare(i, s.size(), s) != 0) continue;
      flush(text.substr(start, i - start));
      start = i + s.size();
      i = start - 1;
      break;
    }
  }
  flush(text.substr(start));
}

PieceCounts count_pieces(const std::vector<std::string>& inputs, const BpeTrainOptions& opt) {
  LineBlockReader reader(inputs, 1 << 20);
  const int n = std::max(1, opt.threads);
  std::vector<PieceCounts> partial(static_cast<size_t>(n));
  std::mutex mu;
  std::condition_variable cv_work, cv_space;
  std::deque<LineBlock> queue;
  bool done = false;
  // A failing worker empties the queue and stops the reader; join() rethrows its error.
  WorkerGroup workers(
      n,
      [&](int t) {
        while (true) {
          LineBlock b;
          {
            std::unique_lock lk(mu);
            cv_work.wait(lk, [&] { return !queue.empty() || done; });
            if (queue.empty()) return;
            b = std::move(queue.front());
            queue.pop_front();
          }
          cv_space.notify_one();
          block_texts(b, reader.path(b.file), opt.text_field, opt, partial[size_t(t)]);
        }
      },
      [&] {
        {
          std::lock_guard lk(mu);
          done = true;
          queue.clear();
        }
        cv_space.notify_all();
        cv_work.notify_all();
      });
  double t0 = now_seconds(), last = t0;
  LineBlock b;
  try {
    while (reader.next(b)) {
      std::unique_lock lk(mu);
      cv_space.wait(lk, [&] { return queue.size() < size_t(2 * n) || done; });
      if (done) break;
      queue.push_back(std::move(b));
      lk.unlock();
      cv_work.notify_one();
      double now = now_seconds();
      if (opt.progress && now - last > 2) {
        last = now;
        double mb = double(reader.bytes_read()) / 1e6, rate = mb / (now - t0);
        double left = double(reader.total_bytes() - reader.bytes_read()) / 1e6 / rate;
        log_info("counting pieces: ", int64_t(mb), " / ", int64_t(reader.total_bytes() / 1000000),
                 " MB, ", int64_t(rate), " MB/s, ETA ", int64_t(left), " s");
      }
    }
  } catch (...) {
    {
      std::lock_guard lk(mu);
      done = true;
    }
    cv_work.notify_all();
    workers.join_quietly();
    throw;
  }
  {
    std::lock_guard lk(mu);
    done = true;
  }
  cv_work.notify_all();
  workers.join();
  PieceCounts total = std::move(partial[0]);
  for (size_t t = 1; t < partial.size(); ++t)
    for (auto& [k, v] : partial[t]) total[k] += v;
  return total;
}

BpeTokenizer train_bpe(const PieceCounts& counts, const BpeTrainOptions& opt) {
  const int32_t n_special = int32_t(opt.specials.size());
  LOOM_CHECK(opt.vocab_size >= 256 + n_special, "vocab size ", opt.vocab_size,
             " is below 256 byte tokens + ", n_special, " special tokens");
  const int32_t target = opt.vocab_size - n_special;

  // Words in a fixed order (sorted bytes), so everything below is deterministic.
  std::vector<const std::pair<const std::string, int64_t>*> sorted;
  sorted.reserve(counts.size());
  for (auto& kv : counts) sorted.push_back(&kv);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> freq(sorted.size());
  for (size_t w = 0; w < sorted.size(); ++w) {
    for (unsigned char c : sorted[w]->first) words[w].push_back(int32_t(c));
    freq[w] = sorted[w]->second;
  }

  std::vector<std::string> tokens(256);
  for (int b = 0; b < 256; ++b) tokens[size_t(b)] = std::string(1, char(b));
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) id_of[tokens[size_t(b)]] = b;

  auto key = [](int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); };
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // pair -> words containing it
  for (size_t w = 0; w < words.size(); ++w) {
    auto& s = words[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      uint64_t k = key(s[i], s[i + 1]);
      pair_count[k] += freq[w];
      auto& lst = where[k];
      if (lst.empty() || lst.back() != int32_t(w)) lst.push_back(int32_t(w));
    }
  }
  // Max-heap on count; equal counts: smaller pair key first.
  using Entry = std::pair<int64_t, uint64_t>;
  auto cmp = [](const Entry& a, const Entry& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  for (auto& [k, c] : pair_count) heap.push({c, k});

  std::vector<int32_t> seen(words.size(), -1);
  double t0 = now_seconds(), last = t0;
  int32_t merges = 0;
  const int32_t wanted = target - 256;
  while (int32_t(tokens.size()) < target && !heap.empty()) {
    auto [c, k] = heap.top();
    heap.pop();
    auto it = pair_count.find(k);
    int64_t cur = it == pair_count.end() ? 0 : it->second;
    if (cur != c) {  // stale entry
      if (cur > 0) heap.push({cur, k});
      continue;
    }
    if (c <= 0) break;
    const int32_t a = int32_t(k >> 32), b = int32_t(uint32_t(k));
    std::string merged = tokens[size_t(a)] + tokens[size_t(b)];
    int32_t z;
    if (auto f = id_of.find(merged); f != id_of.end()) {
      z = f->second;  // the same bytes were already made by another pair
    } else {
      z = int32_t(tokens.size());
      tokens.push_back(merged);
      id_of.emplace(std::move(merged), z);
    }
    ++merges;
    std::vector<int32_t> affected = std::move(where[k]);
    where.erase(k);
    std::vector<uint64_t> grown;
    for (int32_t w : affected) {
      if (seen[size_t(w)] == merges) continue;
      seen[size_t(w)] = merges;
      auto& s = words[size_t(w)];
      const int64_t f = freq[size_t(w)];
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;
      for (size_t i = 0; i + 1 < s.size(); ++i) pair_count[key(s[i], s[i + 1])] -= f;
      std::vector<int32_t> out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          out.push_back(z);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      s = std::move(out);
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        uint64_t nk = key(s[i], s[i + 1]);
        pair_count[nk] += f;
        auto& lst = where[nk];
        if (lst.empty() || lst.back() != w) lst.push_back(w);
        grown.push_back(nk);
      }
    }
    pair_count.erase(k);
    std::sort(grown.begin(), grown.end());
    grown.erase(std::unique(grown.begin(), grown.end()), grown.end());
    for (uint64_t g : grown)
      if (int64_t cnt = pair_count[g]; cnt > 0) heap.push({cnt, g});
    double now = now_seconds();
    if (opt.progress && now - last > 2) {
      last = now;
      double rate = merges / (now - t0);
      log_info("merges: ", merges, " / ", wanted, ", ", int64_t(rate), " merges/s, ETA ",
               int64_t((wanted - merges) / std::max(rate, 1e-9)), " s");
    }
  }
  if (int32_t(tokens.size()) < target)
    log_warn("corpus has too few distinct pairs: vocabulary is ",
             tokens.size() + opt.specials.size(), " tokens, not ", opt.vocab_size);
  SpecialTokens specials;
  for (auto& s : opt.specials) specials.emplace_back(s, int32_t(tokens.size() + specials.size()));
  return BpeTokenizer::from_ranks(std::move(tokens), opt.pretokenizer, std::move(specials));
}

BpeTokenizer train_bpe(const std::vector<std::string>& inputs, const BpeTrainOptions& opt) {
  double t0 = now_seconds();
  PieceCounts counts = count_pieces(inputs, opt);
  if (opt.progress)
    log_info("counted ", counts.size(), " distinct pieces in ", now_seconds() - t0, " s");
  return train_bpe(counts, opt);
}

}  // namespace loom::data
