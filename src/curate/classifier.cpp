#include "curate/classifier.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "core/error.h"
#include "core/fs.h"
#include "curate/stages.h"
#include "curate/text.h"

namespace loom::curate {

std::vector<uint32_t> TextClassifier::features(std::string_view text) const {
  auto words = split_words(text);
  std::vector<uint32_t> f;
  f.reserve(words.size() * 2);
  uint64_t prev = 0;
  const uint64_t nb = static_cast<uint64_t>(opt_.buckets);
  for (size_t i = 0; i < words.size(); ++i) {
    uint64_t h = hash64(ascii_lower(words[i]), 3);
    f.push_back(static_cast<uint32_t>(h % nb));
    if (opt_.bigrams && i > 0) f.push_back(static_cast<uint32_t>((prev * 116049371ULL + h) % nb));
    prev = h;
  }
  return f;
}

void TextClassifier::hidden(const std::vector<uint32_t>& f, std::vector<float>& h) const {
  const size_t d = static_cast<size_t>(opt_.dim);
  h.assign(d, 0.f);
  if (f.empty()) return;
  for (uint32_t id : f) {
    const float* e = emb_.data() + static_cast<size_t>(id) * d;
    for (size_t k = 0; k < d; ++k) h[k] += e[k];
  }
  float inv = 1.f / static_cast<float>(f.size());
  for (auto& v : h) v *= inv;
}

static void softmax(std::vector<float>& z) {
  float mx = *std::max_element(z.begin(), z.end());
  float s = 0;
  for (auto& v : z) s += (v = std::exp(v - mx));
  for (auto& v : z) v /= s;
}

TextClassifier TextClassifier::train(const std::vector<LabelledText>& data,
                                     const ClassifierOptions& opt,
                                     const std::function<void(const std::string&)>& log) {
  LOOM_CHECK(!data.empty(), "train-classifier: no training examples");
  LOOM_CHECK(opt.dim > 0 && opt.buckets > 0 && opt.epochs > 0 && opt.lr > 0,
             "train-classifier: dim, buckets, epochs and lr must be positive");
  TextClassifier m;
  m.opt_ = opt;
  std::map<std::string, int> index;
  for (auto& ex : data) index.emplace(ex.label, 0);
  LOOM_CHECK(index.size() >= 2, "train-classifier: need at least two labels, found ", index.size());
  for (auto& [l, i] : index) {
    i = static_cast<int>(m.labels_.size());
    m.labels_.push_back(l);
  }
  const size_t d = static_cast<size_t>(opt.dim), L = m.labels_.size();
  std::mt19937_64 rng(opt.seed);
  std::uniform_real_distribution<float> init(-1.f / static_cast<float>(d),
                                             1.f / static_cast<float>(d));
  m.emb_.resize(static_cast<size_t>(opt.buckets) * d);
  for (auto& v : m.emb_) v = init(rng);
  m.out_.assign(L * d, 0.f);

  std::vector<std::vector<uint32_t>> feats(data.size());
  std::vector<int> y(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    feats[i] = m.features(data[i].text);
    y[i] = index[data[i].label];
  }
  std::vector<size_t> order(data.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const double total = static_cast<double>(opt.epochs) * static_cast<double>(data.size());
  double step = 0;
  std::vector<float> h, z(L), gh(d);
  for (int ep = 0; ep < opt.epochs; ++ep) {
    std::shuffle(order.begin(), order.end(), rng);
    double loss = 0;
    for (size_t i : order) {
      float lr = static_cast<float>(opt.lr * (1.0 - step++ / total));
      auto& f = feats[i];
      if (f.empty()) continue;
      m.hidden(f, h);
      for (size_t c = 0; c < L; ++c) {
        float s = 0;
        for (size_t k = 0; k < d; ++k) s += m.out_[c * d + k] * h[k];
        z[c] = s;
      }
      softmax(z);
      loss -= std::log(std::max(z[static_cast<size_t>(y[i])], 1e-12f));
      std::fill(gh.begin(), gh.end(), 0.f);
      for (size_t c = 0; c < L; ++c) {
        float g = z[c] - (static_cast<int>(c) == y[i] ? 1.f : 0.f);
        for (size_t k = 0; k < d; ++k) {
          gh[k] += g * m.out_[c * d + k];
          m.out_[c * d + k] -= lr * g * h[k];
        }
      }
      float scale = lr / static_cast<float>(f.size());
      for (uint32_t id : f) {
        float* e = m.emb_.data() + static_cast<size_t>(id) * d;
        for (size_t k = 0; k < d; ++k) e[k] -= scale * gh[k];
      }
    }
    if (log)
      log(cat("epoch ", ep + 1, "/", opt.epochs, ": loss ",
              loss / static_cast<double>(data.size())));
  }
  return m;
}

std::vector<float> TextClassifier::predict(std::string_view text) const {
  auto f = features(text);
  std::vector<float> h;
  hidden(f, h);
  const size_t d = static_cast<size_t>(opt_.dim), L = labels_.size();
  std::vector<float> z(L);
  for (size_t c = 0; c < L; ++c) {
    float s = 0;
    for (size_t k = 0; k < d; ++k) s += out_[c * d + k] * h[k];
    z[c] = s;
  }
  softmax(z);
  return z;
}

int TextClassifier::label_index(const std::string& label) const {
  for (size_t i = 0; i < labels_.size(); ++i)
    if (labels_[i] == label) return static_cast<int>(i);
  return -1;
}

double TextClassifier::accuracy(const std::vector<LabelledText>& data) const {
  if (data.empty()) return 0;
  size_t ok = 0;
  for (auto& ex : data) {
    auto p = predict(ex.text);
    size_t best = static_cast<size_t>(std::max_element(p.begin(), p.end()) - p.begin());
    ok += labels_[best] == ex.label;
  }
  return static_cast<double>(ok) / static_cast<double>(data.size());
}

static const char kMagic[8] = {'L', 'O', 'O', 'M', 'Q', 'C', '0', '1'};

void TextClassifier::save(const std::string& path) const {
  std::string s(kMagic, 8);
  auto put32 = [&](uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); };
  put32(static_cast<uint32_t>(opt_.dim));
  put32(static_cast<uint32_t>(opt_.buckets));
  put32(opt_.bigrams ? 1 : 0);
  put32(static_cast<uint32_t>(labels_.size()));
  for (auto& l : labels_) {
    put32(static_cast<uint32_t>(l.size()));
    s += l;
  }
  s.append(reinterpret_cast<const char*>(emb_.data()), emb_.size() * 4);
  s.append(reinterpret_cast<const char*>(out_.data()), out_.size() * 4);
  write_file_atomic(path, s);
}

TextClassifier TextClassifier::load(const std::string& path) {
  std::string s = read_file(path);
  size_t p = 0;
  auto need = [&](size_t n) {
    LOOM_CHECK(p + n <= s.size(), path, ": truncated classifier model (", s.size(), " bytes)");
  };
  need(8);
  LOOM_CHECK(std::memcmp(s.data(), kMagic, 8) == 0, path, ": not a loom quality classifier model");
  p = 8;
  auto get32 = [&] {
    need(4);
    uint32_t v;
    std::memcpy(&v, s.data() + p, 4);
    p += 4;
    return v;
  };
  TextClassifier m;
  m.opt_.dim = static_cast<int>(get32());
  m.opt_.buckets = static_cast<int>(get32());
  m.opt_.bigrams = get32() != 0;
  uint32_t L = get32();
  LOOM_CHECK(m.opt_.dim > 0 && m.opt_.buckets > 0 && L >= 2 && L < 100000, path,
             ": corrupt header");
  for (uint32_t i = 0; i < L; ++i) {
    uint32_t n = get32();
    need(n);
    m.labels_.push_back(s.substr(p, n));
    p += n;
  }
  size_t ne = static_cast<size_t>(m.opt_.buckets) * static_cast<size_t>(m.opt_.dim);
  size_t no = L * static_cast<size_t>(m.opt_.dim);
  need((ne + no) * 4);
  LOOM_CHECK(p + (ne + no) * 4 == s.size(), path, ": trailing bytes after the model");
  m.emb_.resize(ne);
  m.out_.resize(no);
  std::memcpy(m.emb_.data(), s.data() + p, ne * 4);
  std::memcpy(m.out_.data(), s.data() + p + ne * 4, no * 4);
  return m;
}

namespace {
class QualityClassifierStage : public Stage {
 public:
  explicit QualityClassifierStage(const StageParams& p) {
    std::string path = p.get_string("model", "");
    LOOM_CHECK(!path.empty(), p.where("model"),
               " is required (a model from `loom curate train-classifier`)");
    model_ = TextClassifier::load(path);
    std::string label = p.get_string("label", "hq");
    label_ = model_.label_index(label);
    LOOM_CHECK(label_ >= 0, p.where("label"), ": the model has no label '", label, "'");
    threshold_ = p.get_double("threshold", 0.5, 0, 1);
    field_ = p.get_string("field", "quality_score");
  }
  std::string process(Doc& doc, StageContext& ctx) const override {
    double s = model_.predict(doc.text)[static_cast<size_t>(label_)];
    doc.record[field_] = s;
    ctx.score(field_, s, 0, 1);
    return s < threshold_ ? "quality_below_threshold" : "";
  }

 private:
  TextClassifier model_;
  int label_ = 0;
  double threshold_ = 0.5;
  std::string field_;
};
}  // namespace

std::unique_ptr<Stage> make_quality_classifier_stage(const StageParams& p) {
  return std::make_unique<QualityClassifierStage>(p);
}

}  // namespace loom::curate
