#include "rl/trajectory_wire.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace loom::rl {

namespace {

constexpr uint32_t kMagic = 0x33524C54;    // "TLR3": a message of this layout, version 3
constexpr uint32_t kMagicV2 = 0x32524C54;  // "TLR2": no carried groups, no completion marks

struct Writer {
  std::vector<uint8_t> out;
  void raw(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  template <class T>
  void put(T v) {
    raw(&v, sizeof(T));
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    put<int64_t>(int64_t(v.size()));
    raw(v.data(), v.size() * sizeof(T));
  }
  void str(const std::string& s) {
    put<int64_t>(int64_t(s.size()));
    raw(s.data(), s.size());
  }
};

struct Reader {
  const std::vector<uint8_t>& in;
  const std::string& from;
  size_t pos = 0;
  void raw(void* p, size_t n) {
    LOOM_CHECK(n <= in.size() - pos, "trajectory message from ", from, " (", in.size(),
               " bytes): truncated at byte ", pos, " (", n, " more bytes expected)");
    std::memcpy(p, in.data() + pos, n);
    pos += n;
  }
  template <class T>
  T get() {
    T v;
    raw(&v, sizeof(T));
    return v;
  }
  int64_t count(size_t elem) {
    const int64_t n = get<int64_t>();
    LOOM_CHECK(n >= 0 && uint64_t(n) <= (in.size() - pos) / elem, "trajectory message from ", from,
               ": a length of ", n, " at byte ", pos - 8, " exceeds the ", in.size() - pos,
               " bytes left");
    return n;
  }
  template <class T>
  std::vector<T> vec() {
    std::vector<T> v(size_t(count(sizeof(T))));
    raw(v.data(), v.size() * sizeof(T));
    return v;
  }
  std::string str() {
    std::string s(size_t(count(1)), '\0');
    raw(s.data(), s.size());
    return s;
  }
};

}  // namespace

namespace {

void put_groups(Writer& w, const std::vector<PromptGroup>& groups) {
  w.put<int64_t>(int64_t(groups.size()));
  for (const PromptGroup& g : groups) {
    w.put<int64_t>(g.target_step);
    w.put<int64_t>(g.version);
    w.put<uint64_t>(g.task_index);
    w.str(g.task.prompt);
    w.str(g.task.answer);
    w.vec(g.task.numbers);
    w.vec(g.prompt);
    w.put<int64_t>(int64_t(g.rollouts.size()));
    for (const Rollout& r : g.rollouts) {
      w.vec(r.response);
      w.vec(r.logprobs);
      w.vec(r.versions);
      w.str(r.text);
      w.put<double>(r.reward);
      w.put<uint8_t>(uint8_t((r.finished ? 1 : 0) | (r.stopped ? 2 : 0)));
    }
  }
}

// Groups that target `target` and hold no token newer than `newest`; v2: no completion marks.
std::vector<PromptGroup> get_groups(Reader& r, const std::string& from, int64_t step,
                                    int64_t target, int64_t newest, bool v2) {
  std::vector<PromptGroup> out;
  const int64_t groups = r.count(8);
  for (int64_t i = 0; i < groups; ++i) {
    PromptGroup g;
    g.target_step = r.get<int64_t>();
    g.version = r.get<int64_t>();
    g.task_index = r.get<uint64_t>();
    LOOM_CHECK(g.target_step == target && g.version >= 0, "trajectory message from ", from,
               ": group ", i, " targets step ", g.target_step, " (version ", g.version,
               ") in a message for step ", step, target == step ? "" : " (carried groups)");
    g.task.prompt = r.str();
    g.task.answer = r.str();
    g.task.numbers = r.vec<int>();
    g.prompt = r.vec<int32_t>();
    g.rollouts.resize(size_t(r.count(8)));
    for (Rollout& ro : g.rollouts) {
      ro.response = r.vec<int32_t>();
      ro.logprobs = r.vec<float>();
      ro.versions = r.vec<int64_t>();
      ro.text = r.str();
      ro.reward = r.get<double>();
      const uint8_t marks = v2 ? 1 : r.get<uint8_t>();
      LOOM_CHECK(marks <= 3, "trajectory message from ", from, ": task ", g.task_index,
                 " has completion marks ", int(marks));
      ro.finished = marks & 1;
      ro.stopped = marks & 2;
      LOOM_CHECK(ro.logprobs.size() == ro.response.size() &&
                     ro.versions.size() == ro.response.size() && std::isfinite(ro.reward),
                 "trajectory message from ", from, ": task ", g.task_index, " has ",
                 ro.logprobs.size(), " log-probs and ", ro.versions.size(), " versions for ",
                 ro.response.size(), " tokens, or a non-finite reward");
      for (int64_t v : ro.versions)
        LOOM_CHECK(v >= g.version && v <= newest, "trajectory message from ", from, ": task ",
                   g.task_index, " has a token of weight version ", v, " outside [", g.version,
                   ", ", newest, "]");
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace

std::vector<uint8_t> encode_trajectories(const RolloutBatch& b, int64_t target_step) {
  Writer w;
  w.out.reserve(4096);  // (also keeps GCC 12 from a false -Wstringop-overflow on the growth)
  w.put<uint32_t>(kMagic);
  w.put<int64_t>(target_step);
  w.put<int64_t>(b.dropped_timeout);
  w.put<int64_t>(b.dropped_env);
  w.put<int64_t>(b.generated_tokens);
  w.put<double>(b.seconds);
  put_groups(w, b.groups);
  put_groups(w, b.carried);
  return std::move(w.out);
}

RolloutBatch decode_trajectories(const std::vector<uint8_t>& bytes, const std::string& from,
                                 int64_t* target_step) {
  Reader r{bytes, from};
  const uint32_t magic = r.get<uint32_t>();
  LOOM_CHECK(magic == kMagic || magic == kMagicV2, "trajectory message from ", from,
             ": not a trajectory message (bad magic)");
  const bool v2 = magic == kMagicV2;
  RolloutBatch b;
  const int64_t step = r.get<int64_t>();
  b.dropped_timeout = r.get<int64_t>();
  b.dropped_env = r.get<int64_t>();
  b.generated_tokens = r.get<int64_t>();
  b.seconds = r.get<double>();
  LOOM_CHECK(step >= 0 && b.dropped_timeout >= 0 && b.dropped_env >= 0 && b.generated_tokens >= 0 &&
                 std::isfinite(b.seconds) && b.seconds >= 0,
             "trajectory message from ", from, ": negative or non-finite counts in the header");
  b.groups = get_groups(r, from, step, step, step, v2);
  // Carried groups continue in the sender's next batch (step + 1), from tokens made up to now.
  if (!v2) b.carried = get_groups(r, from, step, step + 1, step, false);
  LOOM_CHECK(r.pos == bytes.size(), "trajectory message from ", from, ": ", bytes.size() - r.pos,
             " bytes left over after ", b.groups.size(), " groups");
  *target_step = step;
  return b;
}

}  // namespace loom::rl
