// A constraint at the level of a model's tokens: a byte automaton (byte_dfa.h) run over the
// vocabulary's token strings. Per automaton state the set of tokens whose bytes keep the text
// inside the language is a bit mask over token ids, computed the first time the state is met
// (one walk of the vocabulary's prefix trie, pruned where the automaton dies) and cached, so a
// constrained step costs a mask lookup and one pass over the logits. The end-of-text token is
// not in any mask: the engine allows it exactly in accepting states.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "infer/constrain/byte_dfa.h"

namespace loom::infer::constrain {

// The bytes of each token id, as a prefix trie. Ids with no bytes (special tokens, unused or
// padded ids) are never allowed by a mask.
class TokenVocabulary {
 public:
  explicit TokenVocabulary(std::vector<std::string> token_bytes);
  int size() const { return static_cast<int>(tokens_.size()); }
  const std::string& bytes(int32_t id) const { return tokens_[size_t(id)]; }

  struct Node {
    int32_t first_child = -1, next_sibling = -1;
    int32_t token = -1;  // the token whose bytes end here, or -1
    unsigned char byte = 0;
  };
  const std::vector<Node>& trie() const { return trie_; }  // node 0: the root (no byte)

 private:
  std::vector<std::string> tokens_;
  std::vector<Node> trie_;
};

class TokenConstraint {
 public:
  TokenConstraint(ByteDfa dfa, std::shared_ptr<const TokenVocabulary> vocab);

  int start() const { return dfa_.start(); }
  bool accepting(int state) const { return dfa_.accepting(state); }
  // Bits over token ids [0, vocab size): bit t of word t / 64. Safe from many threads.
  const std::vector<uint64_t>& allowed(int state) const;
  bool allows(int state, int32_t token) const;
  bool can_continue(int state) const;  // some token is allowed
  // The state after `token`; ByteDfa::kDead when the token is not allowed.
  int advance(int state, int32_t token) const;
  int vocab_size() const { return vocab_->size(); }
  const ByteDfa& dfa() const { return dfa_; }

 private:
  struct Mask {
    std::vector<uint64_t> bits;
    bool any = false;
  };
  const Mask& mask(int state) const;
  ByteDfa dfa_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<Mask>> masks_;  // [state], filled on first use
};

}  // namespace loom::infer::constrain
