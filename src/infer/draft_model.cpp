#include "infer/draft_model.h"

#include <algorithm>

#include "core/error.h"
#include "infer/argmax.h"

namespace loom::infer {

DraftModel::DraftModel(ModelRunner& runner, int block_size, int num_blocks)
    : runner_(runner), cache_(runner.kv_spec(), block_size, num_blocks, runner.cache_backend()) {}

void DraftModel::release(State& s) {
  for (int32_t b : s.blocks) cache_.release(b);
  s.blocks.clear();
  s.computed = 0;
  s.tokens.clear();
}

void DraftModel::forget(int64_t seq) {
  auto it = states_.find(seq);
  if (it == states_.end()) return;
  release(it->second);
  states_.erase(it);
}

bool DraftModel::reserve(State& s, int positions) {
  const int bs = cache_.block_size();
  const size_t need = size_t((positions + bs - 1) / bs);
  while (s.blocks.size() < need) {
    int32_t b = cache_.allocate();
    if (b < 0) {
      // The least recently served state not in this step gives its blocks back.
      State* oldest = nullptr;
      for (auto& [id, o] : states_)
        if (o.used < clock_ && !o.blocks.empty() && (!oldest || o.used < oldest->used)) oldest = &o;
      if (!oldest) return false;
      release(*oldest);
      continue;
    }
    s.blocks.push_back(b);
  }
  return true;
}

void DraftModel::propose(std::vector<Job>& jobs) {
  ++clock_;
  const int V = runner_.vocab();
  std::vector<State*> live;  // per job, null when it gets no guesses
  for (Job& j : jobs) {
    j.guesses.clear();
    State& s = states_[j.seq];
    s.used = clock_;
    const std::vector<int32_t>& t = *j.tokens;
    const int len = static_cast<int>(t.size());
    // What the draft computed still holds where the sequence agrees with it (the target kept
    // a prefix of its guesses); at least the last token is computed again, for its logits.
    int keep = 0;
    while (keep < s.computed && keep < len && s.tokens[size_t(keep)] == t[size_t(keep)]) ++keep;
    s.computed = std::min(keep, len - 1);
    s.tokens = t;
    // Its guesses feed back in, but the last: positions up to len + k - 2 hold keys and values.
    j.k = std::min(j.k, runner_.max_seq() - len + 1);
    const bool wanted = j.k > 0 && len > 0;
    const bool room = wanted && reserve(s, len + j.k - 1);
    if (wanted && !room) release(s);  // what it got before the pool ran out goes back
    live.push_back(room ? &s : nullptr);
  }
  std::vector<SeqChunk> batch;
  std::vector<size_t> owner;
  for (int step = 0;; ++step) {
    batch.clear();
    owner.clear();
    for (size_t i = 0; i < jobs.size(); ++i) {
      State* s = live[i];
      if (!s || step >= jobs[i].k) continue;
      SeqChunk c;
      c.start_pos = s->computed;
      c.n = static_cast<int>(s->tokens.size()) - s->computed;
      c.tokens = s->tokens.data() + s->computed;
      c.block_table = s->blocks.data();
      c.num_blocks = static_cast<int>(s->blocks.size());
      c.want_logits = true;
      batch.push_back(c);
      owner.push_back(i);
    }
    if (batch.empty()) break;
    logits_.resize(batch.size() * size_t(V));
    runner_.forward(batch, cache_.view(), logits_.data());
    ++forwards_;
    for (size_t b = 0; b < batch.size(); ++b) {
      Job& j = jobs[owner[b]];
      State& s = *live[owner[b]];
      const int32_t g = argmax_first(logits_.data() + b * size_t(V), V);
      s.computed = static_cast<int>(s.tokens.size());
      s.tokens.push_back(g);
      j.guesses.push_back(g);
    }
  }
}

}  // namespace loom::infer
