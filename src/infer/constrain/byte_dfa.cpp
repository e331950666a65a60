#include "infer/constrain/byte_dfa.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_set>

#include "core/error.h"

namespace loom::infer::constrain {

namespace {

// Thompson NFA: each state has byte-set edges (to one target) and empty edges.
struct Nfa {
  struct Edge {
    int set;  // index into sets
    int to;
  };
  std::vector<std::vector<Edge>> edges;
  std::vector<std::vector<int>> eps;
  std::vector<std::bitset<256>> sets;
  size_t limit = 0;

  int add() {
    LOOM_CHECK(edges.size() < limit, "the constraint is too large (more than ", limit,
               " automaton states before determinisation)");
    edges.emplace_back();
    eps.emplace_back();
    return static_cast<int>(edges.size()) - 1;
  }
  // Builds rx between a new entry and a new exit; returns {entry, exit}.
  std::pair<int, int> build(const Rx& rx) {
    switch (rx.kind) {
      case Rx::Kind::Set: {
        const int a = add(), b = add();
        if (rx.bytes.any()) {
          sets.push_back(rx.bytes);
          edges[size_t(a)].push_back({static_cast<int>(sets.size()) - 1, b});
        }
        return {a, b};
      }
      case Rx::Kind::Seq: {
        const int a = add();
        int cur = a;
        for (const Rx& k : rx.kids) {
          auto [s, e] = build(k);
          eps[size_t(cur)].push_back(s);
          cur = e;
        }
        return {a, cur};
      }
      case Rx::Kind::Alt: {
        const int a = add(), b = add();
        for (const Rx& k : rx.kids) {
          auto [s, e] = build(k);
          eps[size_t(a)].push_back(s);
          eps[size_t(e)].push_back(b);
        }
        return {a, b};
      }
      case Rx::Kind::Rep: {
        const Rx& k = rx.kids[0];
        const int a = add();
        int cur = a;
        for (int i = 0; i < rx.min; ++i) {
          auto [s, e] = build(k);
          eps[size_t(cur)].push_back(s);
          cur = e;
        }
        if (rx.max < 0) {  // a loop: k*
          auto [s, e] = build(k);
          const int b = add();
          eps[size_t(cur)].push_back(s);
          eps[size_t(cur)].push_back(b);
          eps[size_t(e)].push_back(s);
          eps[size_t(e)].push_back(b);
          return {a, b};
        }
        const int b = add();
        eps[size_t(cur)].push_back(b);
        for (int i = rx.min; i < rx.max; ++i) {  // optional copies, each may end the run
          auto [s, e] = build(k);
          eps[size_t(cur)].push_back(s);
          eps[size_t(e)].push_back(b);
          cur = e;
        }
        return {a, b};
      }
    }
    return {add(), add()};
  }

  void close(std::vector<int>& states, std::vector<uint8_t>& mark) const {
    std::vector<int> stack = states;
    for (int s : states) mark[size_t(s)] = 1;
    while (!stack.empty()) {
      const int s = stack.back();
      stack.pop_back();
      for (int t : eps[size_t(s)])
        if (!mark[size_t(t)]) {
          mark[size_t(t)] = 1;
          states.push_back(t);
          stack.push_back(t);
        }
    }
    for (int s : states) mark[size_t(s)] = 0;
    std::sort(states.begin(), states.end());
  }
};

}  // namespace

ByteDfa ByteDfa::build(const Rx& rx, int max_states) {
  Nfa nfa;
  nfa.limit = size_t(max_states) * 50;
  const auto [entry, exit] = nfa.build(rx);
  // Byte classes: bytes that every set treats alike share a class.
  std::vector<int> cls(256, 0);
  {
    const std::unordered_set<std::bitset<256>> distinct(nfa.sets.begin(), nfa.sets.end());
    for (const auto& s : distinct) {
      std::map<std::pair<int, bool>, int> renum;
      for (int b = 0; b < 256; ++b)
        cls[size_t(b)] =
            renum.emplace(std::make_pair(cls[size_t(b)], bool(s[size_t(b)])), int(renum.size()))
                .first->second;
    }
  }
  const int n_cls = *std::max_element(cls.begin(), cls.end()) + 1;
  std::vector<int> rep(size_t(n_cls), -1);
  for (int b = 0; b < 256; ++b)
    if (rep[size_t(cls[size_t(b)])] < 0) rep[size_t(cls[size_t(b)])] = b;

  std::vector<uint8_t> mark(nfa.edges.size(), 0);
  std::map<std::vector<int>, int> ids;
  std::vector<std::vector<int>> subsets;
  std::vector<std::vector<int32_t>> trans;  // [state][class]
  auto intern = [&](std::vector<int> s) {
    auto [it, fresh] = ids.emplace(s, static_cast<int>(subsets.size()));
    if (fresh) {
      LOOM_CHECK(int(subsets.size()) < max_states, "the constraint is too large (more than ",
                 max_states, " automaton states)");
      subsets.push_back(std::move(s));
    }
    return it->second;
  };
  std::vector<int> first{entry};
  nfa.close(first, mark);
  intern(first);
  for (size_t d = 0; d < subsets.size(); ++d) {
    std::vector<int32_t> row(size_t(n_cls), kDead);
    for (int c = 0; c < n_cls; ++c) {
      std::vector<int> to;
      for (int s : subsets[d])
        for (const auto& e : nfa.edges[size_t(s)])
          if (nfa.sets[size_t(e.set)][size_t(rep[size_t(c)])] && !mark[size_t(e.to)]) {
            mark[size_t(e.to)] = 1;
            to.push_back(e.to);
          }
      for (int t : to) mark[size_t(t)] = 0;
      if (to.empty()) continue;
      nfa.close(to, mark);
      row[size_t(c)] = intern(std::move(to));
    }
    trans.push_back(std::move(row));
  }
  const int n = static_cast<int>(subsets.size());
  std::vector<uint8_t> acc(size_t(n), 0);
  for (int d = 0; d < n; ++d)
    acc[size_t(d)] = std::binary_search(subsets[size_t(d)].begin(), subsets[size_t(d)].end(), exit);
  // Live states: those from which an accepting state is reachable.
  std::vector<std::vector<int>> rev(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d)
    for (int32_t t : trans[size_t(d)])
      if (t != kDead) rev[size_t(t)].push_back(d);
  std::vector<uint8_t> live(acc);
  std::vector<int> stack;
  for (int d = 0; d < n; ++d)
    if (live[size_t(d)]) stack.push_back(d);
  while (!stack.empty()) {
    const int d = stack.back();
    stack.pop_back();
    for (int p : rev[size_t(d)])
      if (!live[size_t(p)]) {
        live[size_t(p)] = 1;
        stack.push_back(p);
      }
  }
  // Renumber the live states densely.
  std::vector<int> id(size_t(n), kDead);
  int m = 0;
  for (int d = 0; d < n; ++d)
    if (live[size_t(d)]) id[size_t(d)] = m++;
  ByteDfa out;
  out.start_ = id[0];
  out.next_.assign(size_t(m) * 256, kDead);
  out.accepting_.assign(size_t(m), 0);
  for (int d = 0; d < n; ++d) {
    if (id[size_t(d)] == kDead) continue;
    out.accepting_[size_t(id[size_t(d)])] = acc[size_t(d)];
    for (int b = 0; b < 256; ++b) {
      const int32_t t = trans[size_t(d)][size_t(cls[size_t(b)])];
      out.next_[size_t(id[size_t(d)]) * 256 + size_t(b)] = t == kDead ? kDead : id[size_t(t)];
    }
  }
  return out;
}

int ByteDfa::walk(int state, const char* bytes, size_t n) const {
  for (size_t i = 0; i < n && state != kDead; ++i)
    state = next(state, static_cast<unsigned char>(bytes[i]));
  return state;
}

bool ByteDfa::matches(const std::string& s) const {
  if (start_ == kDead) return false;
  const int e = walk(start_, s.data(), s.size());
  return e != kDead && accepting(e);
}

}  // namespace loom::infer::constrain
