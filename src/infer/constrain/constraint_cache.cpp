#include "infer/constrain/constraint_cache.h"

namespace loom::infer::constrain {

ConstraintCache::ConstraintCache(std::shared_ptr<const TokenVocabulary> vocab, size_t capacity)
    : vocab_(std::move(vocab)), capacity_(capacity) {}

std::shared_ptr<const TokenConstraint> ConstraintCache::get(const std::string& key,
                                                            const std::function<Rx()>& build) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: other requests' lookups do not wait for it.
  auto c = std::make_shared<const TokenConstraint>(ByteDfa::build(build()), vocab_);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;  // compiled meanwhile by another request
  lru_.emplace_front(key, c);
  index_[key] = lru_.begin();
  if (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return c;
}

}  // namespace loom::infer::constrain
