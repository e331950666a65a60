#include "curate/dedup_dist.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/fs.h"
#include "curate/collective.h"
#include "curate/dedup.h"

namespace loom::curate {

namespace {

comm::Communicator& comm_of(const GlobalInput& in) {
  LOOM_CHECK(in.comm, "distributed dedup without a communicator");
  return *in.comm;
}

// The rank owning a hash's range: ranks split the 64-bit hash space into equal ranges.
int hash_owner(uint64_t h, int ranks) {
  return static_cast<int>((static_cast<unsigned __int128>(h) * static_cast<unsigned>(ranks)) >> 64);
}

template <class T>
std::vector<T> concat_arrays(const std::vector<std::string>& blocks) {
  std::vector<T> out;
  for (auto& b : blocks) {
    auto v = as_array<T>(b);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// The connected components of the edges' graph: the documents the edges name, sorted, and a
// union-find over their positions. Positions follow document order, so a component's root
// (UnionFind keeps the smallest index) is its smallest document, as in the one-process run.
struct Components {
  std::vector<uint32_t> nodes;
  UnionFind uf;

  explicit Components(const std::vector<DocPair>& edges)
      : nodes(documents_of(edges)), uf(nodes.size()) {
    for (auto& [a, b] : edges) uf.unite(index(a), index(b));
  }
  static std::vector<uint32_t> documents_of(const std::vector<DocPair>& edges) {
    std::vector<uint32_t> docs;
    docs.reserve(edges.size() * 2);
    for (auto& [a, b] : edges) {
      docs.push_back(a);
      docs.push_back(b);
    }
    std::sort(docs.begin(), docs.end());
    docs.erase(std::unique(docs.begin(), docs.end()), docs.end());
    return docs;
  }
  uint32_t index(uint32_t doc) const {
    return static_cast<uint32_t>(std::lower_bound(nodes.begin(), nodes.end(), doc) - nodes.begin());
  }
};

// A spanning forest of the edges' graph: the same connected components from at most one edge
// per document, so what travels to rank 0 is bounded by the documents in some pair.
std::vector<DocPair> spanning_edges(const std::vector<DocPair>& edges) {
  Components cc(edges);
  std::vector<DocPair> out;
  for (uint32_t k = 0; k < cc.nodes.size(); ++k) {
    uint32_t r = cc.uf.find(k);
    if (r != k) out.push_back({cc.nodes[r], cc.nodes[k]});
  }
  return out;
}

}  // namespace

void RankDecisions::load_ids(const GlobalInput& in) {
  auto& c = comm_of(in);
  rank_ = c.rank();
  ranks_ = c.size();
  const size_t n = in.shard_files.size();
  ids_.assign(n, {});
  std::vector<int64_t> counts(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (!in.owns(i)) continue;
    ids_[i] = read_lines(cat(in.work_dir, "/", i, ".ids"));
    counts[i] = static_cast<int64_t>(ids_[i].size());
  }
  sum_i64(c, counts);
  offset_.assign(1, 0);
  for (size_t i = 0; i < n; ++i)
    offset_.push_back(offset_.back() + static_cast<uint64_t>(counts[i]));
  LOOM_CHECK(offset_.back() < 0xFFFFFFFFull, "dedup: more than 2^32 documents");
  fate_.clear();
  rep_ids_.clear();
}

size_t RankDecisions::shard_of(uint32_t g) const {
  return static_cast<size_t>(std::upper_bound(offset_.begin(), offset_.end(), g) -
                             offset_.begin()) -
         1;
}

const std::string& RankDecisions::own_id(uint32_t g) const {
  size_t s = shard_of(g);
  LOOM_CHECK(s < ids_.size() && g - offset_[s] < ids_[s].size(), "dedup: document ", g,
             " is not held by rank ", rank_);
  return ids_[s][g - offset_[s]];
}

RankDecisions::Fate RankDecisions::fate(uint32_t g) const {
  auto it = fate_.find(g);
  return it == fate_.end() ? Fate{g, 1} : it->second;
}

const std::string& RankDecisions::rep_id(uint32_t g) const {
  uint32_t r = fate(g).rep;
  if (owner(r) == rank_) return own_id(r);
  return rep_ids_.at(r);
}

void RankDecisions::deliver(const GlobalInput& in, const std::vector<Found>& found) {
  auto& c = comm_of(in);
  std::vector<std::string> out(static_cast<size_t>(ranks_));
  for (auto& f : found) put(out[static_cast<size_t>(owner(f.doc))], f);
  for (auto& f : concat_arrays<Found>(exchange_bytes(c, std::move(out))))
    fate_[f.doc] = {f.rep, f.size};
  // Ids of representatives held by other ranks: ask each owner once per representative.
  std::vector<std::vector<uint32_t>> asked(static_cast<size_t>(ranks_));
  for (auto& [doc, f] : fate_)
    if (owner(f.rep) != rank_) asked[static_cast<size_t>(owner(f.rep))].push_back(f.rep);
  std::vector<std::string> req(static_cast<size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) {
    auto& a = asked[static_cast<size_t>(r)];
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
    for (uint32_t g : a) put(req[static_cast<size_t>(r)], g);
  }
  auto got = exchange_bytes(c, std::move(req));
  std::vector<std::string> reply(static_cast<size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r)
    for (uint32_t g : as_array<uint32_t>(got[static_cast<size_t>(r)])) {
      const std::string& id = own_id(g);
      put(reply[static_cast<size_t>(r)], static_cast<uint64_t>(id.size()));
      reply[static_cast<size_t>(r)] += id;
    }
  auto ans = exchange_bytes(c, std::move(reply));
  for (int r = 0; r < ranks_; ++r) {
    const std::string& b = ans[static_cast<size_t>(r)];
    size_t at = 0;
    for (uint32_t g : asked[static_cast<size_t>(r)]) {
      uint64_t len;
      LOOM_CHECK(at + 8 <= b.size(), "dedup: short id reply from rank ", r);
      std::memcpy(&len, b.data() + at, 8);
      rep_ids_[g] = b.substr(at + 8, len);
      at += 8 + len;
    }
  }
}

void resolve_exact(const GlobalInput& in, const std::vector<std::pair<Hash128, uint32_t>>& mine,
                   RankDecisions& d) {
  auto& c = comm_of(in);
  struct Rec {
    Hash128 h;
    uint32_t doc, pad;
  };
  std::vector<std::string> out(static_cast<size_t>(c.size()));
  for (auto& [h, g] : mine) put(out[static_cast<size_t>(hash_owner(h.hi, c.size()))], Rec{h, g, 0});
  auto recs = concat_arrays<Rec>(exchange_bytes(c, std::move(out)));
  std::sort(recs.begin(), recs.end(),
            [](const Rec& a, const Rec& b) { return a.h == b.h ? a.doc < b.doc : a.h < b.h; });
  std::vector<RankDecisions::Found> found;
  for (size_t k = 0; k < recs.size();) {
    size_t e = k + 1;
    while (e < recs.size() && recs[e].h == recs[k].h) ++e;
    if (e - k > 1)
      for (size_t j = k; j < e; ++j)
        found.push_back({recs[j].doc, recs[k].doc, static_cast<uint32_t>(e - k)});
    k = e;
  }
  d.deliver(in, found);
}

void resolve_components(const GlobalInput& in, const std::vector<DocPair>& edges,
                        RankDecisions& d) {
  auto& c = comm_of(in);
  std::string mine;
  for (auto& e : spanning_edges(edges)) put(mine, e);
  auto all = gather_bytes(c, std::move(mine), 0);
  std::vector<RankDecisions::Found> found;
  if (c.rank() == 0) {
    Components cc(concat_arrays<DocPair>(all));
    std::vector<uint32_t> size(cc.nodes.size(), 0);
    for (uint32_t k = 0; k < cc.nodes.size(); ++k) ++size[cc.uf.find(k)];
    for (uint32_t k = 0; k < cc.nodes.size(); ++k) {
      uint32_t r = cc.uf.find(k);
      found.push_back({cc.nodes[k], cc.nodes[r], size[r]});
    }
  }
  d.deliver(in, found);
}

size_t distributed_buckets(const GlobalInput& in, size_t budget, const EntrySource& produce,
                           const PairFn& on_pair) {
  auto& c = comm_of(in);
  const int P = c.size();
  const size_t cap = std::max<size_t>(budget / sizeof(BandEntry), 64);
  // Each round sends at most cap/2/P entries from a rank, so one round's received entries stay
  // within half the budget even when all of them go to one rank.
  const size_t batch = std::max<size_t>(cap / 2 / static_cast<size_t>(P), 16);
  std::vector<BandEntry> buf, produced;
  std::vector<std::string> run_files;
  auto spill = [&] {
    // ".tmp." in the name: the pipeline deletes these if a killed run leaves them behind.
    std::string path = cat(in.work_dir, "/lsh.tmp.r", c.rank(), ".run", run_files.size());
    write_sorted_run(path, buf);
    run_files.push_back(path);
    buf.clear();
  };
  for (;;) {
    produced.clear();
    produce(produced, batch);
    if (!any_rank(c, !produced.empty())) break;
    std::vector<std::string> out(static_cast<size_t>(P));
    for (auto& e : produced) put(out[static_cast<size_t>(hash_owner(e.hash, P))], e);
    for (auto& block : exchange_bytes(c, std::move(out))) {
      size_t at = buf.size(), n = block.size() / sizeof(BandEntry);
      buf.resize(at + n);
      if (n) std::memcpy(buf.data() + at, block.data(), n * sizeof(BandEntry));
    }
    if (buf.size() >= cap) spill();
  }
  std::vector<BandEntry>().swap(produced);
  if (run_files.empty()) {
    std::sort(buf.begin(), buf.end());
    pairs_from_sorted(buf, on_pair);
    return 0;
  }
  if (!buf.empty()) spill();
  std::vector<BandEntry>().swap(buf);  // give the budget back to the merge
  pairs_from_runs(run_files, on_pair);
  for (auto& f : run_files) std::remove(f.c_str());
  return run_files.size();
}

std::vector<DocPair> verify_distributed(
    const GlobalInput& in, const RankDecisions& d, const std::vector<DocPair>& pairs,
    double threshold,
    const std::function<std::vector<std::vector<uint64_t>>(const std::vector<uint32_t>&)>& sets,
    int64_t& distinct) {
  auto& c = comm_of(in);
  const int P = c.size(), me = c.rank();
  // Every copy of a pair goes to the rank holding its first document, which deduplicates.
  std::vector<std::string> out(static_cast<size_t>(P));
  for (auto& p : pairs) put(out[static_cast<size_t>(d.owner(p.first))], p);
  auto mine = concat_arrays<DocPair>(exchange_bytes(c, std::move(out)));
  std::sort(mine.begin(), mine.end());
  mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
  distinct = static_cast<int64_t>(mine.size());
  // Shingle sets: own documents computed here, the others asked from their ranks.
  std::vector<std::vector<uint32_t>> asked(static_cast<size_t>(P));
  std::vector<uint32_t> local;
  for (auto& [a, b] : mine) {
    local.push_back(a);
    if (d.owner(b) == me)
      local.push_back(b);
    else
      asked[static_cast<size_t>(d.owner(b))].push_back(b);
  }
  std::vector<std::string> req(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    auto& a = asked[static_cast<size_t>(r)];
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
    for (uint32_t g : a) put(req[static_cast<size_t>(r)], g);
  }
  auto got = exchange_bytes(c, std::move(req));
  std::vector<std::vector<uint32_t>> wanted(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    wanted[static_cast<size_t>(r)] = as_array<uint32_t>(got[static_cast<size_t>(r)]);
    local.insert(local.end(), wanted[static_cast<size_t>(r)].begin(),
                 wanted[static_cast<size_t>(r)].end());
  }
  std::sort(local.begin(), local.end());
  local.erase(std::unique(local.begin(), local.end()), local.end());
  auto local_sets = sets(local);
  LOOM_CHECK(local_sets.size() == local.size(), "dedup: shingle sets for ", local.size(),
             " documents expected, got ", local_sets.size());
  auto set_of_local = [&](uint32_t g) -> const std::vector<uint64_t>& {
    return local_sets[static_cast<size_t>(std::lower_bound(local.begin(), local.end(), g) -
                                          local.begin())];
  };
  std::vector<std::string> reply(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r)
    for (uint32_t g : wanted[static_cast<size_t>(r)]) {
      auto& s = set_of_local(g);
      std::string& b = reply[static_cast<size_t>(r)];
      put(b, static_cast<uint64_t>(s.size()));
      b.append(reinterpret_cast<const char*>(s.data()), s.size() * 8);
    }
  auto ans = exchange_bytes(c, std::move(reply));
  std::unordered_map<uint32_t, std::vector<uint64_t>> remote;
  for (int r = 0; r < P; ++r) {
    const std::string& b = ans[static_cast<size_t>(r)];
    size_t at = 0;
    for (uint32_t g : asked[static_cast<size_t>(r)]) {
      uint64_t n;
      LOOM_CHECK(at + 8 <= b.size(), "dedup: short shingle reply from rank ", r);
      std::memcpy(&n, b.data() + at, 8);
      auto& s = remote[g];
      s.resize(n);
      if (n) std::memcpy(s.data(), b.data() + at + 8, n * 8);
      at += 8 + n * 8;
    }
  }
  std::vector<DocPair> joined;
  for (auto& [a, b] : mine) {
    const auto& sb = d.owner(b) == me ? set_of_local(b) : remote.at(b);
    if (sorted_jaccard(set_of_local(a), sb) >= threshold) joined.push_back({a, b});
  }
  return joined;
}

}  // namespace loom::curate
