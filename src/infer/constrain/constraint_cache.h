// Compiled token constraints by a key naming what they constrain to (a schema's text, a
// regex, ...), so a schema sent with every request is compiled once and its masks are reused.
// The least recently used entry leaves when `capacity` are held.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "infer/constrain/token_constraint.h"

namespace loom::infer::constrain {

class ConstraintCache {
 public:
  explicit ConstraintCache(std::shared_ptr<const TokenVocabulary> vocab, size_t capacity = 64);
  // The constraint for `key`, compiled from build() when not held (build's errors propagate).
  std::shared_ptr<const TokenConstraint> get(const std::string& key,
                                             const std::function<Rx()>& build);
  const std::shared_ptr<const TokenVocabulary>& vocabulary() const { return vocab_; }

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t capacity_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const TokenConstraint>>> lru_;  // newest first
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

}  // namespace loom::infer::constrain
