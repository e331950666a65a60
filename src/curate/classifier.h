// A fastText-style linear text classifier: hashed word and word-bigram features, averaged
// embeddings, a softmax output layer, trained by SGD with a linearly decaying learning rate.
// Used to score document quality (`loom curate train-classifier`, stage quality_classifier).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::curate {

struct ClassifierOptions {
  int dim = 16;
  int buckets = 1 << 18;
  int epochs = 5;
  double lr = 0.5;
  bool bigrams = true;
  uint64_t seed = 1;
};

struct LabelledText {
  std::string text, label;
};

class TextClassifier {
 public:
  // `log` receives one line per epoch (average loss).
  static TextClassifier train(const std::vector<LabelledText>& data, const ClassifierOptions& opt,
                              const std::function<void(const std::string&)>& log = nullptr);
  static TextClassifier load(const std::string& path);
  void save(const std::string& path) const;  // atomic

  std::vector<float> predict(std::string_view text) const;  // probability per label
  int label_index(const std::string& label) const;          // -1 if unknown
  const std::vector<std::string>& labels() const { return labels_; }
  double accuracy(const std::vector<LabelledText>& data) const;

 private:
  std::vector<uint32_t> features(std::string_view text) const;
  void hidden(const std::vector<uint32_t>& f, std::vector<float>& h) const;
  ClassifierOptions opt_;
  std::vector<std::string> labels_;
  std::vector<float> emb_;  // buckets x dim
  std::vector<float> out_;  // labels x dim
};

}  // namespace loom::curate
