#include "curate/dedup.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/parallel.h"
#include "curate/collective.h"
#include "curate/dedup_dist.h"
#include "curate/lsh_runs.h"
#include "curate/readers.h"
#include "curate/stages.h"
#include "curate/text.h"

namespace loom::curate {

static uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

MinHasher::MinHasher(const MinHashParams& p) : p_(p) {
  LOOM_CHECK(p.bands > 0 && p.rows > 0 && p.ngram > 0,
             "minhash: bands, rows and ngram must be > 0");
  LOOM_CHECK(p.shingle == "word" || p.shingle == "char", "minhash: shingle must be word or char");
  uint64_t s = p.seed;
  for (int i = 0; i < num_perm(); ++i) {
    a_.push_back(static_cast<uint32_t>(splitmix(s)) | 1u);  // odd: a bijection mod 2^32
    b_.push_back(static_cast<uint32_t>(splitmix(s)));
  }
}

std::vector<uint64_t> MinHasher::shingles(std::string_view text) const {
  std::vector<uint64_t> out;
  if (p_.shingle == "word") {
    // The fast path: words split into and hashed in buffers of the thread, each lowercased on
    // the stack, not into a new string (the same hashes: tested against the reference).
    thread_local std::vector<std::string_view> words;
    thread_local std::vector<uint64_t> wh;
    split_words(text, words);
    wh.resize(words.size());
    if (reference_paths()) {
      for (size_t i = 0; i < words.size(); ++i) wh[i] = hash64(ascii_lower(words[i]), 11);
    } else {
      char low[64];
      for (size_t i = 0; i < words.size(); ++i) {
        const std::string_view w = words[i];
        if (w.size() > sizeof low) {
          wh[i] = hash64(ascii_lower(w), 11);
          continue;
        }
        for (size_t k = 0; k < w.size(); ++k)
          low[k] = w[k] >= 'A' && w[k] <= 'Z' ? static_cast<char>(w[k] + 32) : w[k];
        wh[i] = hash64(std::string_view(low, w.size()), 11);
      }
    }
    size_t n = static_cast<size_t>(p_.ngram);
    if (words.size() < n && !words.empty()) n = words.size();  // short text: one shingle
    for (size_t i = 0; i + n <= words.size(); ++i) {
      uint64_t h = 0x84222325cbf29ce4ULL;
      for (size_t k = 0; k < n; ++k) h = (h ^ wh[i + k]) * 0x100000001b3ULL;
      out.push_back(h);
    }
  } else {
    std::string norm = normalize_for_dedup(text);
    size_t n = static_cast<size_t>(p_.ngram);
    if (norm.size() < n && !norm.empty()) n = norm.size();
    for (size_t i = 0; i + n <= norm.size(); ++i)
      out.push_back(hash64(std::string_view(norm).substr(i, n), 13));
  }
  return out;
}

std::vector<uint32_t> MinHasher::signature(std::string_view text) const {
  const int m = num_perm();
  std::vector<uint32_t> sig(static_cast<size_t>(m), 0xFFFFFFFFu);
  const uint32_t* a = a_.data();
  const uint32_t* b = b_.data();
  uint32_t* out = sig.data();
  for (uint64_t h : shingles(text)) {
    uint32_t x = static_cast<uint32_t>(h ^ (h >> 32));
    // Per permutation: affine map mod 2^32 followed by an xorshift-multiply finaliser, all
    // bijections, written so the compiler vectorises it across permutations.
    for (int j = 0; j < m; ++j) {
      uint32_t v = a[j] * x + b[j];
      v ^= v >> 15;
      v *= 0x2c1b3c6dU;
      v ^= v >> 12;
      out[j] = v < out[j] ? v : out[j];
    }
  }
  return sig;
}

std::vector<uint64_t> MinHasher::band_hashes(const std::vector<uint32_t>& sig) const {
  std::vector<uint64_t> out(static_cast<size_t>(p_.bands));
  for (int bnd = 0; bnd < p_.bands; ++bnd)
    out[static_cast<size_t>(bnd)] =
        hash64(std::string_view(reinterpret_cast<const char*>(sig.data() + bnd * p_.rows),
                                static_cast<size_t>(p_.rows) * 4),
               static_cast<uint64_t>(bnd) + 1);
  return out;
}

double signature_similarity(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  size_t eq = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) eq += a[i] == b[i];
  return a.empty() ? 0 : static_cast<double>(eq) / static_cast<double>(a.size());
}

double lsh_probability(double s, int bands, int rows) {
  return 1 - std::pow(1 - std::pow(s, rows), bands);
}

UnionFind::UnionFind(size_t n) : parent_(n) {
  for (size_t i = 0; i < n; ++i) parent_[i] = static_cast<uint32_t>(i);
}
uint32_t UnionFind::find(uint32_t x) {
  while (parent_[x] != x) {
    parent_[x] = parent_[parent_[x]];
    x = parent_[x];
  }
  return x;
}
void UnionFind::unite(uint32_t a, uint32_t b) {
  a = find(a);
  b = find(b);
  if (a == b) return;
  if (a < b)
    parent_[b] = a;
  else
    parent_[a] = b;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::string data = read_file(path);
  std::vector<std::string> out;
  size_t start = 0;
  while (start < data.size()) {
    size_t nl = data.find('\n', start);
    out.push_back(data.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

double sorted_jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  if (a.empty() && b.empty()) return 1;  // two empty texts are the same text
  size_t i = 0, j = 0, inter = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++inter;
      ++i;
      ++j;
    }
  }
  return static_cast<double>(inter) / static_cast<double>(a.size() + b.size() - inter);
}

namespace {

// Reads every document of an intermediate shard, calling fn(doc).
void read_shard(const std::string& file, const GlobalInput& in,
                const std::function<void(Doc&)>& fn) {
  ReaderOptions ro;
  ro.format = "jsonl";
  ro.text_field = in.text_field;
  ro.id_field = in.id_field;
  ro.fail_on_error = true;
  InputShard s;
  s.files = {file};
  auto r = open_reader(s, ro);
  Doc d;
  std::string reject;
  while (r->next(d, reject)) fn(d);
}

std::string id_line(const std::string& id) {
  std::string s = id;
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s + "\n";
}

// Shared bookkeeping of both dedup stages: global index of each shard's first document,
// the ids (for "duplicate_of") and each document's representative.
struct Decisions {
  std::vector<uint64_t> offset;  // per shard
  std::vector<std::string> ids;
  std::vector<uint32_t> rep;
  std::vector<uint32_t> size;  // cluster size, indexed by representative
};

// What both dedup stages share: the decisions prepare() made, in one process (d_) or across
// ranks (dd_, when dist_), and where a document processed later finds its own.
class DedupStage : public Stage {
 public:
  bool global() const override { return true; }

 protected:
  struct DocFate {
    uint64_t g;                   // global index of the document
    uint32_t rep, size;           // its group's representative and size (itself and 1 if alone)
    const std::string* rep_id;    // the representative's id
    const std::string* recorded;  // the id prepare() read at g, to check the input is the same
  };
  // The document at ctx.doc_index of ctx.shard; throws if the shard now holds more documents
  // than prepare() saw.
  DocFate fate(const StageContext& ctx, const char* stage) const {
    const size_t shard = static_cast<size_t>(ctx.shard);
    DocFate f;
    f.g = (dist_ ? dd_.begin(shard) : d_.offset[shard]) + static_cast<uint64_t>(ctx.doc_index);
    const uint64_t end = dist_ ? dd_.end(shard) : d_.offset[shard + 1];
    LOOM_CHECK(f.g < end, stage, ": shard ", ctx.shard, " changed since prepare read it");
    const auto g32 = static_cast<uint32_t>(f.g);
    if (dist_) {
      auto rs = dd_.fate(g32);
      f.rep = rs.rep;
      f.size = rs.size;
      f.rep_id = &dd_.rep_id(g32);
      f.recorded = &dd_.own_id(g32);
    } else {
      f.rep = d_.rep[f.g];
      f.size = d_.size[f.rep];
      f.rep_id = &d_.ids[f.rep];
      f.recorded = &d_.ids[f.g];
    }
    return f;
  }

  bool dist_ = false;
  Decisions d_;
  RankDecisions dd_;
};

class ExactDedup : public DedupStage {
 public:
  explicit ExactDedup(const StageParams& p) {}

  void prepare(const GlobalInput& in) override {
    size_t n = in.shard_files.size();
    parallel_for(n, in.workers, [&](size_t i) {
      std::string base = cat(in.work_dir, "/", i);
      if (!in.owns(i)) return;                                                // another rank's
      if (file_exists(base + ".hash") && file_exists(base + ".ids")) return;  // resumed
      std::string hashes, ids;
      read_shard(in.shard_files[i], in, [&](Doc& d) {
        Hash128 h = dedup_hash(d.text);
        hashes.append(reinterpret_cast<const char*>(&h), sizeof h);
        ids += id_line(d.id);
      });
      write_file_atomic(base + ".ids", ids);
      write_file_atomic(base + ".hash", hashes);
    });
    dist_ = in.distributed();
    if (dist_) return prepare_distributed(in);
    d_ = Decisions();
    hashes_.clear();
    for (size_t i = 0; i < n; ++i) {
      std::string base = cat(in.work_dir, "/", i);
      d_.offset.push_back(d_.ids.size());
      std::string h = read_file(base + ".hash");
      auto ids = read_lines(base + ".ids");
      LOOM_CHECK(h.size() == ids.size() * sizeof(Hash128), base, ".hash does not match ", base,
                 ".ids: remove ", in.work_dir, " and rerun");
      size_t at = hashes_.size();
      hashes_.resize(at + ids.size());
      // An empty shard has no hashes: memcpy with the null data() of an empty vector is UB.
      if (!h.empty()) std::memcpy(hashes_.data() + at, h.data(), h.size());
      for (auto& id : ids) d_.ids.push_back(std::move(id));
    }
    d_.offset.push_back(d_.ids.size());
    LOOM_CHECK(d_.ids.size() < 0xFFFFFFFFull, "exact_dedup: more than 2^32 documents");
    std::vector<uint32_t> order(d_.ids.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return hashes_[a] == hashes_[b] ? a < b : hashes_[a] < hashes_[b];
    });
    d_.rep.assign(order.size(), 0);
    d_.size.assign(order.size(), 0);
    for (size_t k = 0; k < order.size(); ++k) {
      uint32_t first =
          (k > 0 && hashes_[order[k]] == hashes_[order[k - 1]]) ? d_.rep[order[k - 1]] : order[k];
      d_.rep[order[k]] = first;
      ++d_.size[first];
    }
  }

  std::string process(Doc& doc, StageContext& ctx) const override {
    DocFate f = fate(ctx, "exact_dedup");
    const size_t shard = static_cast<size_t>(ctx.shard);
    LOOM_CHECK(
        (dist_ ? own_hashes_[shard][f.g - dd_.begin(shard)] : hashes_[f.g]) == dedup_hash(doc.text),
        "exact_dedup: shard ", ctx.shard, " changed since its hashes were computed");
    if (f.rep != f.g) {
      doc.record["duplicate_of"] = *f.rep_id;
      return "exact_duplicate";
    }
    if (f.size > 1) ctx.count("docs_with_duplicates");
    return "";
  }

 private:
  // Across ranks: this rank's hashes go to the ranks owning their ranges (dedup_dist.h).
  void prepare_distributed(const GlobalInput& in) {
    dd_.load_ids(in);
    own_hashes_.assign(in.shard_files.size(), {});
    std::vector<std::pair<Hash128, uint32_t>> mine;
    for (size_t i = 0; i < in.shard_files.size(); ++i) {
      if (!in.owns(i)) continue;
      std::string base = cat(in.work_dir, "/", i);
      std::string h = read_file(base + ".hash");
      LOOM_CHECK(h.size() == (dd_.end(i) - dd_.begin(i)) * sizeof(Hash128), base,
                 ".hash does not match ", base, ".ids: remove ", in.work_dir, " and rerun");
      auto& hs = own_hashes_[i];
      hs.resize(h.size() / sizeof(Hash128));
      if (!h.empty()) std::memcpy(hs.data(), h.data(), h.size());
      for (size_t k = 0; k < hs.size(); ++k)
        mine.push_back({hs[k], static_cast<uint32_t>(dd_.begin(i) + k)});
    }
    resolve_exact(in, mine, dd_);
  }

  std::vector<Hash128> hashes_;
  std::vector<std::vector<Hash128>> own_hashes_;  // per shard, this rank's only
};

class FuzzyDedup : public DedupStage {
 public:
  explicit FuzzyDedup(const StageParams& p) {
    std::string preset = p.get_string("preset", "default");
    MinHashParams mp;
    if (preset == "nemo") {  // NeMo Curator: character 24-grams, 20 bands x 13 rows
      mp.shingle = "char";
      mp.ngram = 24;
      mp.bands = 20;
      mp.rows = 13;
    } else {
      LOOM_CHECK(preset == "default", p.where("preset"), " must be default or nemo");
    }
    mp.shingle = p.get_string("shingle", mp.shingle);
    mp.ngram = p.get_int32("ngram", mp.ngram, 1, 1000);
    mp.bands = p.get_int32("bands", mp.bands, 1, 1000);
    mp.rows = p.get_int32("rows", mp.rows, 1, 1000);
    mp.seed = static_cast<uint64_t>(p.get_int("seed", 42, INT64_MIN, INT64_MAX));
    verify_ = p.get_double("verify_threshold", 0, 0, 1);
    double mb = p.get_double("memory_budget_mb", 2048, 1e-6, 1 << 24);
    budget_ = static_cast<size_t>(mb * 1024 * 1024);
    hasher_ = std::make_unique<MinHasher>(mp);
  }

  void prepare(const GlobalInput& in) override {
    const int B = hasher_->params().bands;
    const size_t rec = static_cast<size_t>(B) * 8;
    size_t n = in.shard_files.size();
    parallel_for(n, in.workers, [&](size_t i) {
      std::string base = cat(in.work_dir, "/", i);
      if (!in.owns(i)) return;                                               // another rank's
      if (file_exists(base + ".sig") && file_exists(base + ".ids")) return;  // resumed
      std::string sigs, ids;
      read_shard(in.shard_files[i], in, [&](Doc& d) {
        auto bands = hasher_->band_hashes(hasher_->signature(d.text));
        sigs.append(reinterpret_cast<const char*>(bands.data()), bands.size() * 8);
        ids += id_line(d.id);
      });
      write_file_atomic(base + ".ids", ids);
      write_file_atomic(base + ".sig", sigs);
    });
    dist_ = in.distributed();
    if (dist_) return prepare_distributed(in);
    d_ = Decisions();
    for (size_t i = 0; i < n; ++i) {
      std::string base = cat(in.work_dir, "/", i);
      d_.offset.push_back(d_.ids.size());
      auto ids = read_lines(base + ".ids");
      LOOM_CHECK(std::filesystem::file_size(base + ".sig") == ids.size() * rec, base,
                 ".sig does not match ", base, ".ids (different fuzzy_dedup settings?): remove ",
                 in.work_dir, " and rerun");
      for (auto& id : ids) d_.ids.push_back(std::move(id));
    }
    d_.offset.push_back(d_.ids.size());
    size_t N = d_.ids.size();
    LOOM_CHECK(N < 0xFFFFFFFFull, "fuzzy_dedup: more than 2^32 documents");
    UnionFind uf(N);
    std::vector<std::pair<uint32_t, uint32_t>> pairs;  // to verify, when verifying
    int64_t candidates = 0;
    auto on_pair = [&](uint32_t first, uint32_t other) {
      ++candidates;
      if (verify_ > 0)
        pairs.push_back({first, other});
      else
        uf.unite(first, other);
    };
    // Band by band in memory needs every band hash at once plus one band's sort keys; past
    // the budget, (band, hash, doc) entries go to sorted runs on disk and are merged.
    size_t runs = 0;
    if (N * (rec + sizeof(BandEntry)) <= budget_)
      buckets_in_memory(in, N, on_pair);
    else
      runs = buckets_external(in, on_pair);
    int64_t verified = 0;
    if (verify_ > 0) verified = verify_pairs(in, pairs, uf);
    d_.rep.assign(N, 0);
    d_.size.assign(N, 0);
    for (size_t k = 0; k < N; ++k) {
      d_.rep[k] = uf.find(static_cast<uint32_t>(k));
      ++d_.size[d_.rep[k]];
    }
    Json info = Json::object();
    info["documents"] = static_cast<int64_t>(N);
    info["candidate_pairs"] = candidates;
    info["spill_runs"] = static_cast<int64_t>(runs);
    info["memory_budget_bytes"] = static_cast<int64_t>(budget_);
    if (verify_ > 0) {
      info["verified_pairs"] = static_cast<int64_t>(pairs.size());
      info["pairs_above_threshold"] = verified;
    }
    write_file_atomic(in.work_dir + "/lsh.json", info.dump(1));
    log_info("curate: fuzzy_dedup: ", N, " documents, ", candidates, " candidate pairs",
             runs ? cat(", ", runs, " sorted runs spilled to disk") : std::string(),
             verify_ > 0 ? cat(", ", verified, " of ", pairs.size(), " distinct pairs verified")
                         : std::string());
  }

  std::string process(Doc& doc, StageContext& ctx) const override {
    DocFate f = fate(ctx, "fuzzy_dedup");
    LOOM_CHECK(id_line(*f.recorded) == id_line(doc.id), "fuzzy_dedup: shard ", ctx.shard,
               " changed since its signatures were computed");
    doc.record["cluster_id"] = *f.rep_id;
    doc.record["cluster_size"] = static_cast<int64_t>(f.size);
    if (f.rep != f.g) {
      doc.record["duplicate_of"] = *f.rep_id;
      return "near_duplicate";
    }
    if (f.size > 1) {
      ctx.count("clusters");
      ctx.score("cluster_size", static_cast<double>(f.size), 0, 100);
    }
    return "";
  }

 private:
  // Every band hash in memory; one band's (hash, doc) keys sorted at a time.
  void buckets_in_memory(const GlobalInput& in, size_t N, const PairFn& on_pair) const {
    const int B = hasher_->params().bands;
    std::string all;  // every document's band hashes, in global order
    all.reserve(N * static_cast<size_t>(B) * 8);
    for (size_t i = 0; i < in.shard_files.size(); ++i)
      all += read_file(cat(in.work_dir, "/", i, ".sig"));
    std::vector<std::pair<uint64_t, uint32_t>> keys(N);
    for (int b = 0; b < B; ++b) {
      for (size_t k = 0; k < N; ++k) {
        uint64_t v;
        std::memcpy(&v, all.data() + (k * static_cast<size_t>(B) + static_cast<size_t>(b)) * 8, 8);
        keys[k] = {v, static_cast<uint32_t>(k)};
      }
      std::sort(keys.begin(), keys.end());
      size_t first = 0;  // start of the current bucket
      for (size_t k = 1; k < N; ++k) {
        if (keys[k].first != keys[k - 1].first) {
          first = k;
          continue;
        }
        on_pair(keys[first].second, keys[k].second);  // same bucket as its first document
      }
    }
  }

  // External sort: entries collected up to the budget, sorted and written as runs, then a
  // k-way merge streams them in (band, hash, doc) order. Returns the number of runs written.
  size_t buckets_external(const GlobalInput& in, const PairFn& on_pair) const {
    const int B = hasher_->params().bands;
    const size_t rec = static_cast<size_t>(B) * 8;
    size_t cap = std::max<size_t>(budget_ / sizeof(BandEntry), 1024);
    std::vector<BandEntry> buf;
    buf.reserve(cap);
    std::vector<std::string> run_files;
    auto flush = [&] {
      // ".tmp." in the name: the pipeline deletes these if a killed run leaves them behind.
      std::string path = cat(in.work_dir, "/lsh.tmp.run", run_files.size());
      write_sorted_run(path, buf);
      run_files.push_back(path);
      buf.clear();
    };
    uint32_t doc = 0;
    for (size_t i = 0; i < in.shard_files.size(); ++i) {
      SigReader r(cat(in.work_dir, "/", i, ".sig"), rec);
      for (const uint64_t* h; (h = r.next()) != nullptr; ++doc)
        for (int b = 0; b < B; ++b) {
          buf.push_back({h[b], static_cast<uint32_t>(b), doc});
          if (buf.size() == cap) flush();
        }
    }
    if (!buf.empty()) flush();
    std::vector<BandEntry>().swap(buf);  // give the budget back to the merge
    pairs_from_runs(run_files, on_pair);
    for (auto& f : run_files) std::remove(f.c_str());
    return run_files.size();
  }

  // The exact Jaccard similarity of each distinct candidate pair, from shingle sets recomputed
  // from the text of the documents in some pair only; pairs at or above the threshold are
  // joined. Returns how many were.
  int64_t verify_pairs(const GlobalInput& in, std::vector<std::pair<uint32_t, uint32_t>>& pairs,
                       UnionFind& uf) const {
    std::sort(pairs.begin(), pairs.end());
    pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
    size_t N = d_.ids.size();
    std::vector<char> needed(N, 0);
    for (auto& [a, b] : pairs) needed[a] = needed[b] = 1;
    std::vector<std::vector<uint64_t>> sets(N);
    parallel_for(in.shard_files.size(), in.workers, [&](size_t i) {
      uint64_t g = d_.offset[i];
      read_shard(in.shard_files[i], in, [&](Doc& d) {
        LOOM_CHECK(g < d_.offset[i + 1], in.shard_files[i],
                   ": has more documents than when its signatures were computed");
        if (needed[g]) {
          auto& s = sets[g];
          s = hasher_->shingles(d.text);
          std::sort(s.begin(), s.end());
          s.erase(std::unique(s.begin(), s.end()), s.end());
        }
        ++g;
      });
    });
    int64_t joined = 0;
    for (auto& [a, b] : pairs) {
      if (sorted_jaccard(sets[a], sets[b]) < verify_) continue;
      uf.unite(a, b);
      ++joined;
    }
    return joined;
  }

  // Across ranks (dedup_dist.h): this rank's band entries go to the ranks owning their hash
  // ranges, whose buckets give candidate pairs; components are joined on rank 0.
  void prepare_distributed(const GlobalInput& in) {
    auto& c = *in.comm;
    const int B = hasher_->params().bands;
    const size_t rec = static_cast<size_t>(B) * 8;
    dd_.load_ids(in);
    for (size_t i = 0; i < in.shard_files.size(); ++i) {
      if (!in.owns(i)) continue;
      std::string base = cat(in.work_dir, "/", i);
      LOOM_CHECK(std::filesystem::file_size(base + ".sig") == (dd_.end(i) - dd_.begin(i)) * rec,
                 base, ".sig does not match ", base,
                 ".ids (different fuzzy_dedup settings?): remove ", in.work_dir, " and rerun");
    }
    // This rank's entries, shard by shard, in pieces.
    size_t shard = 0;
    uint32_t doc = 0;
    std::unique_ptr<SigReader> reader;
    auto produce = [&](std::vector<BandEntry>& out, size_t max) {
      while (out.size() + static_cast<size_t>(B) <= std::max(max, static_cast<size_t>(B))) {
        if (!reader) {
          while (shard < in.shard_files.size() && !in.owns(shard)) ++shard;
          if (shard == in.shard_files.size()) return;
          reader = std::make_unique<SigReader>(cat(in.work_dir, "/", shard, ".sig"), rec);
          doc = static_cast<uint32_t>(dd_.begin(shard));
        }
        const uint64_t* h = reader->next();
        if (!h) {
          reader.reset();
          ++shard;
          continue;
        }
        for (int b = 0; b < B; ++b) out.push_back({h[b], static_cast<uint32_t>(b), doc});
        ++doc;
      }
    };
    int64_t candidates = 0;
    std::vector<DocPair> pairs;
    size_t runs = distributed_buckets(in, budget_, produce, [&](uint32_t first, uint32_t other) {
      ++candidates;
      pairs.push_back({first, other});
    });
    int64_t distinct = 0;
    if (verify_ > 0) {
      pairs = verify_distributed(
          in, dd_, pairs, verify_,
          [&](const std::vector<uint32_t>& docs) { return shingle_sets(in, docs); }, distinct);
    }
    std::vector<int64_t> totals = {candidates, static_cast<int64_t>(runs), distinct,
                                   static_cast<int64_t>(pairs.size())};
    sum_i64(c, totals);
    resolve_components(in, pairs, dd_);
    if (c.rank() != 0) return;
    Json info = Json::object();
    info["documents"] = static_cast<int64_t>(dd_.total());
    info["candidate_pairs"] = totals[0];
    info["spill_runs"] = totals[1];
    info["memory_budget_bytes"] = static_cast<int64_t>(budget_);
    info["ranks"] = static_cast<int64_t>(c.size());
    if (verify_ > 0) {
      info["verified_pairs"] = totals[2];
      info["pairs_above_threshold"] = totals[3];
    }
    write_file_atomic(in.work_dir + "/lsh.json", info.dump(1));
    log_info("curate: fuzzy_dedup: ", dd_.total(), " documents on ", c.size(), " ranks, ",
             totals[0], " candidate pairs",
             totals[1] ? cat(", ", totals[1], " sorted runs spilled to disk") : std::string(),
             verify_ > 0 ? cat(", ", totals[3], " of ", totals[2], " distinct pairs verified")
                         : std::string());
  }

  // Sorted, distinct shingle sets of this rank's documents `docs` (sorted), read from its shards.
  std::vector<std::vector<uint64_t>> shingle_sets(const GlobalInput& in,
                                                  const std::vector<uint32_t>& docs) const {
    std::vector<std::vector<uint64_t>> sets(docs.size());
    parallel_for(in.shard_files.size(), in.workers, [&](size_t i) {
      if (!in.owns(i)) return;
      auto lo = std::lower_bound(docs.begin(), docs.end(), dd_.begin(i));
      if (lo == docs.end() || *lo >= dd_.end(i)) return;  // none needed from this shard
      uint64_t g = dd_.begin(i);
      read_shard(in.shard_files[i], in, [&](Doc& d) {
        LOOM_CHECK(g < dd_.end(i), in.shard_files[i],
                   ": has more documents than when its signatures were computed");
        auto it = std::lower_bound(docs.begin(), docs.end(), g);
        if (it != docs.end() && *it == g) {
          auto& s = sets[static_cast<size_t>(it - docs.begin())];
          s = hasher_->shingles(d.text);
          std::sort(s.begin(), s.end());
          s.erase(std::unique(s.begin(), s.end()), s.end());
        }
        ++g;
      });
    });
    return sets;
  }

  std::unique_ptr<MinHasher> hasher_;
  double verify_ = 0;
  size_t budget_ = 0;
};

}  // namespace

std::unique_ptr<Stage> make_exact_dedup_stage(const StageParams& p) {
  return std::make_unique<ExactDedup>(p);
}
std::unique_ptr<Stage> make_fuzzy_dedup_stage(const StageParams& p) {
  return std::make_unique<FuzzyDedup>(p);
}

}  // namespace loom::curate
