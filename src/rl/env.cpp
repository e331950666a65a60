#include "rl/env.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "core/rng.h"

namespace loom::rl {
namespace {

int draw(uint64_t seed, uint64_t index, uint64_t k, int lo, int hi) {
  return lo + int(uniform_at(seed, index * 16 + k, 0) * double(hi - lo + 1));
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

class Arithmetic : public Environment {
 public:
  std::string name() const override { return "arithmetic"; }
  Task task(uint64_t seed, uint64_t i) const override {
    const int a = draw(seed, i, 0, 1, 99), b = draw(seed, i, 1, 1, 99);
    const bool mul = draw(seed, i, 2, 0, 3) == 0;
    Task t;
    t.prompt = "What is " + std::to_string(a) + (mul ? " * " : " + ") + std::to_string(b) + "?";
    t.answer = std::to_string(mul ? a * b : a + b);
    return t;
  }
  double reward(const Task& t, const std::string& reply) const override {
    size_t p = 0;
    while (p < reply.size() && !std::isdigit(static_cast<unsigned char>(reply[p])) &&
           reply[p] != '-')
      ++p;
    size_t q = p + (p < reply.size() && reply[p] == '-');
    while (q < reply.size() && std::isdigit(static_cast<unsigned char>(reply[q]))) ++q;
    return p < reply.size() && reply.substr(p, q - p) == t.answer ? 1.0 : 0.0;
  }
};

class Reverse : public Environment {
 public:
  std::string name() const override { return "reverse"; }
  Task task(uint64_t seed, uint64_t i) const override {
    static const char* words[] = {"red",  "blue", "green", "cat",  "dog",  "sun",
                                  "moon", "tree", "fish",  "bird", "star", "rain"};
    const int k = draw(seed, i, 0, 3, 4);
    std::vector<std::string> w;
    for (int j = 0; j < k; ++j) w.push_back(words[draw(seed, i, uint64_t(1 + j), 0, 11)]);
    Task t;
    t.prompt = "Reverse the words:";
    for (auto& x : w) t.prompt += " " + x;
    for (int j = k - 1; j >= 0; --j) t.answer += (j < k - 1 ? " " : "") + w[size_t(j)];
    return t;
  }
  double reward(const Task& t, const std::string& reply) const override {
    return trim(reply) == t.answer ? 1.0 : 0.0;
  }
};

// Recursive descent over + - * and parentheses; numbers must come from `pool` (each once).
struct Parser {
  const std::string& s;
  size_t p = 0;
  std::vector<int> pool;
  int depth = 0;
  void skip() {
    while (p < s.size() && s[p] == ' ') ++p;
  }
  bool number(long long* v) {
    skip();
    size_t q = p;
    while (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q])) && q - p < 9) ++q;
    if (q == p) return false;
    const int n = std::stoi(s.substr(p, q - p));
    auto it = std::find(pool.begin(), pool.end(), n);
    if (it == pool.end()) return false;
    pool.erase(it);
    p = q;
    *v = n;
    return true;
  }
  bool factor(long long* v) {
    skip();
    if (p < s.size() && s[p] == '(') {
      if (++depth > 32) return false;
      ++p;
      if (!expr(v)) return false;
      skip();
      if (p >= s.size() || s[p] != ')') return false;
      ++p;
      --depth;
      return true;
    }
    return number(v);
  }
  bool term(long long* v) {
    if (!factor(v)) return false;
    for (skip(); p < s.size() && s[p] == '*'; skip()) {
      ++p;
      long long r;
      if (!factor(&r)) return false;
      *v *= r;
    }
    return true;
  }
  bool expr(long long* v) {
    if (!term(v)) return false;
    for (skip(); p < s.size() && (s[p] == '+' || s[p] == '-'); skip()) {
      const char op = s[p++];
      long long r;
      if (!term(&r)) return false;
      *v = op == '+' ? *v + r : *v - r;
    }
    return true;
  }
};

class Countdown : public Environment {
 public:
  std::string name() const override { return "countdown"; }
  Task task(uint64_t seed, uint64_t i) const override {
    Task t;
    for (int k = 0; k < 3; ++k) t.numbers.push_back(draw(seed, i, uint64_t(k), 1, 12));
    // A target known to be reachable: a random combination of the three.
    const int a = t.numbers[0], b = t.numbers[1], c = t.numbers[2];
    const int choice = draw(seed, i, 3, 0, 3);
    const long long target = choice == 0   ? a + b + c
                             : choice == 1 ? a * b + c
                             : choice == 2 ? a * (b + c)
                                           : a + b * c;
    t.answer = std::to_string(target);
    t.prompt = "Use " + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) +
               " to make " + t.answer + ".";
    return t;
  }
  double reward(const Task& t, const std::string& reply) const override {
    long long v = 0;
    return eval_countdown(trim(reply), t.numbers, &v) && std::to_string(v) == t.answer ? 1.0 : 0.0;
  }
};

}  // namespace

bool eval_countdown(const std::string& expr, const std::vector<int>& allowed, long long* value) {
  if (expr.empty() || expr.size() > 200) return false;
  Parser ps{expr, 0, allowed, 0};
  long long v = 0;
  if (!ps.expr(&v)) return false;
  ps.skip();
  if (ps.p != expr.size()) return false;
  *value = v;
  return true;
}

std::unique_ptr<Environment> make_environment(const std::string& name) {
  if (name == "arithmetic") return std::make_unique<Arithmetic>();
  if (name == "reverse") return std::make_unique<Reverse>();
  if (name == "countdown") return std::make_unique<Countdown>();
  fail("unknown environment '", name, "' (arithmetic, reverse, countdown)");
}

}  // namespace loom::rl
