#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/loader.h"
#include "data/npy.h"
#include "data/packed_dataset.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::data;

namespace {

// Token k of document d is d * 1000 + k: every token says where it came from.
int32_t tok(int32_t doc, int32_t k) {
  return doc * 1000 + k;
}

std::string write_docs(const std::string& name, const std::vector<int32_t>& lengths) {
  std::string dir = loom::test::this_test_dir() + "/" + name;
  make_dirs(dir);
  IndexedDatasetWriter w(dir + "/data", TokenDType::Int32);
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int32_t> doc;
    for (int32_t k = 0; k < lengths[d]; ++k) doc.push_back(tok(int32_t(d), k));
    w.add_document(doc);
  }
  w.finalize();
  return dir + "/data";
}

// Edge cases on purpose: empty documents, one-token documents, documents longer than a sample.
std::vector<int32_t> mixed_lengths() {
  std::vector<int32_t> L = {0, 1, 37, 5, 0, 1, 64, 3, 12, 100, 1, 9};
  for (int i = 0; i < 40; ++i) L.push_back(1 + (i * 7919) % 45);
  return L;
}

GptDatasetConfig gpt_config(const std::string& prefix, int T, int64_t n, uint64_t seed = 1) {
  GptDatasetConfig c;
  c.prefix = prefix;
  c.seq_len = T;
  c.num_samples = n;
  c.seed = seed;
  c.log = false;
  return c;
}

// The token stream the document index describes.
std::vector<int32_t> stream_of(const GptDataset& ds) {
  std::vector<int32_t> s;
  for (int32_t d : ds.document_index()) {
    auto doc = ds.data().document(d);
    s.insert(s.end(), doc.begin(), doc.end());
  }
  return s;
}

// A source whose row i holds tokens (id, i, 0, 0, ...), to check loaders and blends.
class TagSource : public SampleSource {
 public:
  TagSource(int id, int64_t n, int T) : id_(id), n_(n), T_(T) {}
  int64_t size() const override { return n_; }
  int seq_len() const override { return T_; }
  void fill_row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                std::vector<int32_t>& seg_lens) const override {
    for (int t = 0; t < T_; ++t) {
      tokens[t] = t == 0 ? id_ : t == 1 ? int32_t(i) : 0;
      targets[t] = -1;
      positions[t] = t;
    }
    seg_lens.push_back(T_);
  }

 private:
  int id_;
  int64_t n_;
  int T_;
};

}  // namespace

TEST(Split, MatchesMegatronRounding) {
  EXPECT_EQ(split_boundaries("969,30,1", 1000), (std::vector<int64_t>{0, 969, 999, 1000}));
  EXPECT_EQ(split_boundaries("8,1,1", 10), (std::vector<int64_t>{0, 8, 9, 10}));
  EXPECT_EQ(split_boundaries("1", 7), (std::vector<int64_t>{0, 7, 7, 7}));
  EXPECT_EQ(split_boundaries("2,1", 4), (std::vector<int64_t>{0, 3, 4, 4}));  // 2.67 -> 3
  EXPECT_THROW(split_boundaries("a,b", 10), Error);
  EXPECT_THROW(split_boundaries("0,0,0", 10), Error);
  EXPECT_THROW(split_boundaries("1,1,1,1", 10), Error);
}

TEST(GptDataset, OneEpochSamplesCoverTheStreamExactlyOnce) {
  const int T = 16;
  GptDataset ds(gpt_config(write_docs("cover", mixed_lengths()), T, 0));
  EXPECT_EQ(ds.num_epochs(), 1);
  std::vector<int32_t> stream = stream_of(ds);
  ASSERT_EQ(int64_t(stream.size()), ds.tokens_per_epoch());
  ASSERT_EQ(ds.size(), (ds.tokens_per_epoch() - 1) / T);
  // Sample j (stream order) is stream[j*T, j*T + T + 1): consecutive samples share one token.
  std::vector<int32_t> buf(T + 1);
  for (int64_t j = 0; j < ds.size(); ++j) {
    ds.sample_tokens(j, buf.data());
    ASSERT_TRUE(std::equal(buf.begin(), buf.end(), stream.begin() + j * T)) << "sample " << j;
  }
  // Every document appears once in the epoch, and the shuffle index is a permutation.
  std::multiset<int32_t> docs(ds.document_index().begin(), ds.document_index().end());
  for (int32_t d = 0; d < int32_t(mixed_lengths().size()); ++d) EXPECT_EQ(docs.count(d), 1u);
  std::vector<int64_t> perm = ds.shuffle_index();
  std::sort(perm.begin(), perm.end());
  for (int64_t i = 0; i < ds.size(); ++i) ASSERT_EQ(perm[size_t(i)], i);
  // Rows: inputs are tokens[:-1], targets tokens[1:].
  std::vector<int32_t> t(T), y(T), p(T), segs;
  ds.fill_row(3, t.data(), y.data(), p.data(), segs);
  ds.sample_tokens(ds.shuffle_index()[3], buf.data());
  EXPECT_TRUE(std::equal(t.begin(), t.end(), buf.begin()));
  EXPECT_TRUE(std::equal(y.begin(), y.end(), buf.begin() + 1));
  EXPECT_EQ(p.back(), T - 1);
  EXPECT_EQ(segs, std::vector<int32_t>{T});
}

TEST(GptDataset, EpochsSeedsAndCache) {
  std::string prefix = write_docs("epochs", mixed_lengths());
  const int T = 16;
  GptDataset one(gpt_config(prefix, T, 0));
  const int64_t per_epoch = one.size();
  // 2.5 epochs of samples: the final epoch is shuffled on its own (Megatron's
  // separate_final_epoch), so the first two epochs hold every document twice and the final
  // one every document once.
  GptDataset ds(gpt_config(prefix, T, per_epoch * 5 / 2, 7));
  EXPECT_EQ(ds.num_epochs(), 3);
  EXPECT_GE(ds.size(), per_epoch * 5 / 2);
  const size_t n_docs = mixed_lengths().size();
  std::multiset<int32_t> first(ds.document_index().begin(),
                               ds.document_index().begin() + long(2 * n_docs));
  std::multiset<int32_t> last(ds.document_index().begin() + long(2 * n_docs),
                              ds.document_index().end());
  for (int32_t d = 0; d < int32_t(n_docs); ++d) {
    EXPECT_EQ(first.count(d), 2u);
    EXPECT_EQ(last.count(d), 1u);
  }
  EXPECT_FALSE(ds.loaded_from_cache());
  GptDataset again(gpt_config(prefix, T, per_epoch * 5 / 2, 7));
  EXPECT_TRUE(again.loaded_from_cache());
  EXPECT_EQ(again.shuffle_index(), ds.shuffle_index());
  EXPECT_EQ(again.document_index(), ds.document_index());
  auto cfg = gpt_config(prefix, T, per_epoch * 5 / 2, 7);
  cfg.use_cache = false;
  GptDataset rebuilt(cfg);
  EXPECT_EQ(rebuilt.shuffle_index(), ds.shuffle_index());  // deterministic, not just cached
  GptDataset other(gpt_config(prefix, T, per_epoch * 5 / 2, 8));
  EXPECT_NE(other.cache_key(), ds.cache_key());
  EXPECT_NE(other.shuffle_index(), ds.shuffle_index());
  EXPECT_NE(other.document_index(), ds.document_index());
}

TEST(GptDataset, DocumentLongerThanAnEpochAndTinySplits) {
  // One 50-token document; 10 samples of 16 need 161 tokens: four passes over the document.
  std::string prefix = write_docs("long", {50});
  GptDataset ds(gpt_config(prefix, 16, 10));
  EXPECT_EQ(ds.num_epochs(), 4);
  std::vector<int32_t> buf(17);
  for (int64_t j = 0; j < ds.size(); ++j) {
    ds.sample_tokens(j, buf.data());
    for (int k = 0; k < 17; ++k) ASSERT_EQ(buf[size_t(k)], tok(0, int32_t((j * 16 + k) % 50)));
  }
  // Too few tokens for even one sample, or an empty split: clear errors.
  std::string tiny = write_docs("tiny", {3, 0, 2});
  EXPECT_THROW(GptDataset(gpt_config(tiny, 16, 0)), Error);
  auto c = gpt_config(prefix, 8, 0);
  c.split = "1,0,0";
  c.which = Split::Valid;
  EXPECT_THROW(GptDataset{c}, Error);
}

TEST(GptDataset, SplitsAreDisjointDocumentRanges) {
  std::vector<int32_t> L(100, 20);
  std::string prefix = write_docs("splits", L);
  std::set<int32_t> seen;
  int64_t total = 0;
  for (Split s : {Split::Train, Split::Valid, Split::Test}) {
    auto c = gpt_config(prefix, 8, 0);
    c.split = "80,15,5";
    c.which = s;
    GptDataset ds(c);
    std::set<int32_t> docs(ds.document_index().begin(), ds.document_index().end());
    for (int32_t d : docs) EXPECT_TRUE(seen.insert(d).second) << "document in two splits";
    total += int64_t(docs.size());
  }
  EXPECT_EQ(total, 100);
}

// The index caches are .npy files: a cache whose header lies about its shape (a negative,
// non-numeric or huge dimension) is an error naming the file and the dimension, not a
// std::stoll exception or an allocation of the claimed size.
TEST(Npy, ShapesThatLieAreErrorsNamingTheFile) {
  const std::string path = loom::test::this_test_dir() + "/index.npy";
  write_npy(path, std::vector<int32_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  std::vector<int64_t> shape;
  EXPECT_EQ(read_npy_i32(path, &shape), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(shape, (std::vector<int64_t>{2, 3}));
  const std::string good = read_file(path);
  const size_t at = good.find("(2, 3)");
  ASSERT_NE(at, std::string::npos);
  // Same header length (the preamble records it), so only the shape differs.
  for (const std::string lie : {"(2,-3)", "(2, x)", "(9999999999999999999, 3)"}) {
    std::string bad = good;
    bad.replace(at, 6, lie);
    const size_t nl = bad.find('\n', at);  // the header's padding ends there
    ASSERT_NE(nl, std::string::npos);
    if (lie.size() > 6) bad.erase(nl - (lie.size() - 6), lie.size() - 6);
    write_file_atomic(path, bad);
    try {
      read_npy_i32(path, &shape);
      ADD_FAILURE() << "accepted shape " << lie;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
    }
  }
}

TEST(PackedDataset, WholeDocumentsNeverCrossAndEfficiencyIsReported) {
  std::string prefix = write_docs("packed", mixed_lengths());
  PackedDatasetConfig c;
  c.prefix = prefix;
  c.seq_len = 64;
  c.log = false;
  PackedDataset ds(c);
  EXPECT_GT(ds.efficiency(), 0.85);
  EXPECT_LE(ds.efficiency(), 1.0);
  std::map<int32_t, int32_t> seen_tokens;  // doc -> tokens seen
  const int T = 64;
  std::vector<int32_t> t(T), y(T), p(T), segs;
  int64_t real = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    segs.clear();
    ds.fill_row(i, t.data(), y.data(), p.data(), segs);
    int32_t at = 0;
    auto placed = ds.row_segments(i);
    for (size_t s = 0; s < segs.size(); ++s) {
      bool padding = s == placed.size();
      for (int32_t k = 0; k < segs[s]; ++k) {
        EXPECT_EQ(p[size_t(at + k)], k);  // positions restart in every segment
        if (padding) {
          EXPECT_EQ(y[size_t(at + k)], -1);
          continue;
        }
        int32_t doc = t[size_t(at)] / 1000;
        EXPECT_EQ(t[size_t(at + k)] / 1000, doc) << "segment crosses documents";
        EXPECT_EQ(t[size_t(at + k)], t[size_t(at)] + k);  // consecutive tokens of one document
        EXPECT_EQ(y[size_t(at + k)], k + 1 < segs[s] ? t[size_t(at + k + 1)] : -1);
      }
      if (!padding) {
        seen_tokens[t[size_t(at)] / 1000] += segs[s];
        real += segs[s];
      }
      at += segs[s];
    }
    EXPECT_EQ(at, T);
  }
  EXPECT_NEAR(ds.efficiency(), double(real) / double(ds.size() * T), 1e-12);
  auto L = mixed_lengths();
  for (size_t d = 0; d < L.size(); ++d)
    EXPECT_EQ(seen_tokens[int32_t(d)], L[d]) << "document " << d << " not packed exactly once";
}

TEST(Blend, AchievesTheWeightsAtEveryPrefix) {
  std::vector<double> w = {0.5, 0.3, 0.2};
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices(w, 1000, &di, &dsi);
  std::vector<int64_t> count(3, 0);
  for (int64_t s = 0; s < 1000; ++s) {
    EXPECT_EQ(dsi[size_t(s)], count[size_t(di[size_t(s)])]);  // each source read in order
    ++count[size_t(di[size_t(s)])];
    for (int k = 0; k < 3; ++k)
      ASSERT_LE(std::abs(double(count[size_t(k)]) - w[size_t(k)] * double(s + 1)), 1.0 + 1e-9);
  }
  EXPECT_EQ(count, (std::vector<int64_t>{500, 300, 200}));

  std::vector<std::shared_ptr<const SampleSource>> src = {std::make_shared<TagSource>(0, 60, 4),
                                                          std::make_shared<TagSource>(1, 60, 4)};
  BlendedDataset b(src, {3, 1}, 80);  // normalised to 0.75 / 0.25
  std::vector<int32_t> t(4), y(4), p(4), segs;
  int from_first = 0;
  for (int64_t i = 0; i < b.size(); ++i) {
    b.fill_row(i, t.data(), y.data(), p.data(), segs);
    from_first += t[0] == 0;
  }
  EXPECT_EQ(from_first, 60);
  EXPECT_THROW(BlendedDataset(src, {3, 1}, 200), Error);  // 150 from a 60-sample source
}

TEST(Loader, RanksGetDisjointPartsWhoseUnionIsTheGlobalBatch) {
  auto src = std::make_shared<TagSource>(0, 1000, 4);
  const int B = 2, world = 3;
  std::vector<std::unique_ptr<Loader>> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(std::make_unique<Loader>(src, B, r, world, 2));
  Batch b;
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> rows;
    for (int r = 0; r < world; ++r) {
      ranks[size_t(r)]->next(b);
      ASSERT_EQ(b.B, B);
      EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 4, 8}));
      for (int i = 0; i < B; ++i) rows.push_back(b.tokens[size_t(i * 4 + 1)]);
    }
    std::vector<int32_t> expect(B * world);
    for (int i = 0; i < B * world; ++i) expect[size_t(i)] = step * B * world + i;
    EXPECT_EQ(rows, expect) << "step " << step;
  }
  EXPECT_EQ(ranks[0]->samples_consumed(), 5 * B * world);
}

TEST(Loader, ResumeFromStateGivesTheSameSubsequentBatches) {
  std::string prefix = write_docs("resume", mixed_lengths());
  LoaderConfig c;
  c.prefixes = {prefix};
  c.seq_len = 8;
  c.micro_batch = 3;
  c.rank = 1;
  c.world = 2;
  c.split = "1,0,0";
  c.num_samples = 500;
  c.log = false;
  Loader a(c);
  Batch b;
  for (int i = 0; i < 4; ++i) a.next(b);
  Json saved = Json::parse(a.state().dump(), "state");
  std::vector<std::vector<int32_t>> after;
  for (int i = 0; i < 6; ++i) {
    a.next(b);
    after.push_back(b.tokens);
    // Unpacked rows: targets are the next tokens; cu_seqlens one segment per row.
    EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 8, 16, 24}));
    for (int r = 0; r < 3; ++r)
      for (int t = 0; t + 1 < 8; ++t)
        EXPECT_EQ(b.targets[size_t(r * 8 + t)], b.tokens[size_t(r * 8 + t + 1)]);
  }
  c.prefetch = 0;  // the same batches with or without the prefetch thread
  Loader resumed(c);
  resumed.restore(saved);
  for (int i = 0; i < 6; ++i) {
    resumed.next(b);
    EXPECT_EQ(b.tokens, after[size_t(i)]) << "batch " << i << " after resume";
  }
  a.restore(saved);  // restoring a running loader rewinds it
  a.next(b);
  EXPECT_EQ(b.tokens, after[0]);
  Json wrong = saved;
  wrong["seed"] = 999;
  EXPECT_THROW(resumed.restore(wrong), Error);
}

TEST(Loader, PackedAndBlendedConfigs) {
  std::string p1 = write_docs("blend1", mixed_lengths());
  std::string p2 = write_docs("blend2", std::vector<int32_t>(30, 17));
  LoaderConfig c;
  c.prefixes = {p1, p2};
  c.weights = {0.7, 0.3};
  c.seq_len = 32;
  c.micro_batch = 4;
  c.split = "1,0,0";
  c.packed = true;
  c.num_samples = 40;
  c.log = false;
  Loader l(c);
  EXPECT_GT(l.packing_efficiency(), 0.8);
  EXPECT_GE(l.dataset_size(), 40);
  Batch b;
  l.next(b);
  ASSERT_EQ(b.tokens.size(), 4u * 32);
  EXPECT_EQ(b.cu_seqlens.front(), 0);
  EXPECT_EQ(b.cu_seqlens.back(), 4 * 32);
  EXPECT_GT(b.cu_seqlens.size(), 5u);  // several documents per row
  for (size_t s = 0; s + 1 < b.cu_seqlens.size(); ++s) {
    EXPECT_LT(b.cu_seqlens[s], b.cu_seqlens[s + 1]);
    EXPECT_EQ(b.positions[size_t(b.cu_seqlens[s])], 0);  // positions restart per document
  }
  for (int r = 1; r < 4; ++r)  // every row boundary is a segment boundary
    EXPECT_TRUE(std::count(b.cu_seqlens.begin(), b.cu_seqlens.end(), r * 32) == 1);
}
