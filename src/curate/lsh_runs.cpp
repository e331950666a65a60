#include "curate/lsh_runs.h"

#include <algorithm>
#include <memory>

#include "core/error.h"

namespace loom::curate {

namespace {

// Sequential reader of a sorted run file of BandEntry records.
class RunReader {
 public:
  explicit RunReader(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "rb");
    LOOM_CHECK(f_, path, ": cannot open LSH run file");
    buf_.resize(4096);
    fill();
  }
  ~RunReader() {
    if (f_) std::fclose(f_);
  }
  RunReader(const RunReader&) = delete;
  RunReader& operator=(const RunReader&) = delete;
  bool done() const { return pos_ == n_; }
  const BandEntry& head() const { return buf_[pos_]; }
  void pop() {
    if (++pos_ == n_) fill();
  }

 private:
  void fill() {
    n_ = std::fread(buf_.data(), sizeof(BandEntry), buf_.size(), f_);
    LOOM_CHECK(n_ > 0 || !std::ferror(f_), path_, ": read error");
    pos_ = 0;
  }
  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<BandEntry> buf_;
  size_t pos_ = 0, n_ = 0;
};

}  // namespace

void write_sorted_run(const std::string& path, std::vector<BandEntry>& buf) {
  std::sort(buf.begin(), buf.end());
  std::FILE* f = std::fopen(path.c_str(), "wb");
  LOOM_CHECK(f, path, ": cannot create LSH run file");
  size_t w = std::fwrite(buf.data(), sizeof(BandEntry), buf.size(), f);
  bool ok = std::fclose(f) == 0 && w == buf.size();
  LOOM_CHECK(ok, path, ": write failed (disk full?)");
}

void pairs_from_sorted(const std::vector<BandEntry>& sorted, const PairFn& on_pair) {
  size_t first = 0;  // start of the current bucket
  for (size_t k = 1; k < sorted.size(); ++k) {
    if (sorted[k].band != sorted[first].band || sorted[k].hash != sorted[first].hash) {
      first = k;
      continue;
    }
    on_pair(sorted[first].doc, sorted[k].doc);
  }
}

void pairs_from_runs(const std::vector<std::string>& run_files, const PairFn& on_pair) {
  std::vector<std::unique_ptr<RunReader>> runs;
  for (auto& f : run_files) runs.push_back(std::make_unique<RunReader>(f));
  auto later = [&](size_t a, size_t b) { return runs[b]->head() < runs[a]->head(); };
  std::vector<size_t> heap;
  for (size_t k = 0; k < runs.size(); ++k)
    if (!runs[k]->done()) heap.push_back(k);
  std::make_heap(heap.begin(), heap.end(), later);
  bool have = false;
  BandEntry first{};
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    size_t k = heap.back();
    BandEntry e = runs[k]->head();
    runs[k]->pop();
    if (runs[k]->done())
      heap.pop_back();
    else
      std::push_heap(heap.begin(), heap.end(), later);
    if (have && e.band == first.band && e.hash == first.hash)
      on_pair(first.doc, e.doc);
    else
      first = e;
    have = true;
  }
}

SigReader::SigReader(const std::string& path, size_t rec) : path_(path), rec_(rec) {
  f_ = std::fopen(path.c_str(), "rb");
  LOOM_CHECK(f_, path, ": cannot open");
}
SigReader::~SigReader() {
  std::fclose(f_);
}
const uint64_t* SigReader::next() {
  if (pos_ == have_) {
    buf_.resize(rec_ / 8 * 1024);
    size_t got = std::fread(buf_.data(), 1, buf_.size() * 8, f_);
    LOOM_CHECK(got % rec_ == 0 && !std::ferror(f_), path_, ": truncated signature file");
    have_ = got / rec_;
    pos_ = 0;
    if (have_ == 0) return nullptr;
  }
  return buf_.data() + (pos_++) * (rec_ / 8);
}

}  // namespace loom::curate
