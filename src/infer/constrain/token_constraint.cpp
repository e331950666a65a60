#include "infer/constrain/token_constraint.h"

#include <algorithm>

#include "core/error.h"

namespace loom::infer::constrain {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes)
    : tokens_(std::move(token_bytes)) {
  trie_.push_back({});
  // Children found through a map while building, then linked as sibling lists.
  std::unordered_map<uint64_t, int32_t> child;  // (node << 8 | byte) -> node
  std::vector<std::vector<int32_t>> kids(1);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& s = tokens_[id];
    if (s.empty()) continue;
    int32_t node = 0;
    for (unsigned char c : s) {
      const uint64_t key = (uint64_t(node) << 8) | c;
      auto it = child.find(key);
      if (it == child.end()) {
        const int32_t n = static_cast<int32_t>(trie_.size());
        trie_.push_back({});
        trie_.back().byte = c;
        kids.emplace_back();
        kids[size_t(node)].push_back(n);
        it = child.emplace(key, n).first;
      }
      node = it->second;
    }
    trie_[size_t(node)].token = static_cast<int32_t>(id);
  }
  for (size_t n = 0; n < kids.size(); ++n) {
    int32_t prev = -1;
    for (int32_t k : kids[n]) {
      if (prev < 0)
        trie_[n].first_child = k;
      else
        trie_[size_t(prev)].next_sibling = k;
      prev = k;
    }
  }
}

TokenConstraint::TokenConstraint(ByteDfa dfa, std::shared_ptr<const TokenVocabulary> vocab)
    : dfa_(std::move(dfa)), vocab_(std::move(vocab)) {
  LOOM_CHECK(dfa_.start() != ByteDfa::kDead, "the constraint matches no text at all");
  masks_.resize(size_t(dfa_.num_states()));
}

const TokenConstraint::Mask& TokenConstraint::mask(int state) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Mask>& m = masks_[size_t(state)];
  if (m) return *m;
  m = std::make_unique<Mask>();
  m->bits.assign((size_t(vocab_->size()) + 63) / 64, 0);
  // Depth-first over the trie, carrying the automaton's state; a dead state prunes the subtree.
  const auto& trie = vocab_->trie();
  std::vector<std::pair<int32_t, int>> stack;
  for (int32_t c = trie[0].first_child; c >= 0; c = trie[size_t(c)].next_sibling)
    stack.push_back({c, state});
  while (!stack.empty()) {
    const auto [node, from] = stack.back();
    stack.pop_back();
    const TokenVocabulary::Node& n = trie[size_t(node)];
    const int to = dfa_.next(from, n.byte);
    if (to == ByteDfa::kDead) continue;
    if (n.token >= 0) {
      m->bits[size_t(n.token) / 64] |= uint64_t(1) << (n.token % 64);
      m->any = true;
    }
    for (int32_t c = n.first_child; c >= 0; c = trie[size_t(c)].next_sibling)
      stack.push_back({c, to});
  }
  return *m;
}

const std::vector<uint64_t>& TokenConstraint::allowed(int state) const {
  return mask(state).bits;
}

bool TokenConstraint::allows(int state, int32_t token) const {
  if (token < 0 || token >= vocab_->size()) return false;
  return (mask(state).bits[size_t(token) / 64] >> (token % 64)) & 1;
}

bool TokenConstraint::can_continue(int state) const {
  return mask(state).any;
}

int TokenConstraint::advance(int state, int32_t token) const {
  if (token < 0 || token >= vocab_->size()) return ByteDfa::kDead;
  const std::string& b = vocab_->bytes(token);
  if (b.empty()) return ByteDfa::kDead;
  return dfa_.walk(state, b.data(), b.size());
}

}  // namespace loom::infer::constrain
