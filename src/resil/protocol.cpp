#include "resil/protocol.h"

#include <cmath>

#include "core/error.h"
#include "core/json.h"

namespace loom::resil {

std::string encode(const Message& m) {
  Json j = Json::object();
  switch (m.kind) {
    case MsgKind::Hello:
      j["ev"] = "hello";
      j["token"] = m.token;
      j["attempt"] = m.attempt;
      j["rank"] = m.rank;
      j["world"] = m.world;
      j["pid"] = m.pid;
      j["host"] = m.host;
      j["run_dir"] = m.run_dir;
      if (m.setup_seconds >= 0) j["setup_seconds"] = m.setup_seconds;
      if (m.restore_seconds >= 0) j["restore_seconds"] = m.restore_seconds;
      break;
    case MsgKind::Section:
      j["ev"] = "section";
      j["step"] = m.step;
      j["name"] = m.section;
      break;
    case MsgKind::Step:
      j["ev"] = "step";
      j["step"] = m.step;
      j["seconds"] = m.seconds;
      break;
    case MsgKind::Bye:
      j["ev"] = "bye";
      break;
  }
  return j.dump();
}

namespace {

bool valid_section_name(const std::string& s) {
  if (s.empty() || s.size() > 32) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || c == '_')) return false;
  return true;
}

}  // namespace

Message decode(const std::string& line, const std::string& where) {
  // The JSON errors name the field; the prefix names the sender, the line says what came.
  std::string shown = line.size() > 120 ? line.substr(0, 120) + "..." : line;
  try {
    Json j = Json::parse(line, where);
    LOOM_CHECK(j.is_object(), "not a JSON object");
    // Each field's error names the field (the JSON layer's says only what was wrong).
    auto num = [&](const char* k, int64_t lo, int64_t hi) -> int64_t {
      try {
        return j.at(k).as_int(lo, hi);
      } catch (const Error& e) {
        fail("field '", k, "': ", e.what());
      }
    };
    auto str = [&](const char* k) -> std::string {
      try {
        return j.at(k).as_string();
      } catch (const Error& e) {
        fail("field '", k, "': ", e.what());
      }
    };
    const std::string ev = str("ev");
    Message m;
    constexpr int64_t kMaxStep = int64_t(1) << 53;
    if (ev == "hello") {
      m.kind = MsgKind::Hello;
      m.token = str("token");
      m.attempt = num("attempt", 0, 1 << 20);
      m.rank = num("rank", 0, 1 << 24);
      m.world = num("world", 1, 1 << 24);
      m.pid = num("pid", 1, INT32_MAX);
      m.host = str("host");
      m.run_dir = str("run_dir");
      for (auto [k, v] : {std::pair{"setup_seconds", &m.setup_seconds},
                          std::pair{"restore_seconds", &m.restore_seconds}}) {
        if (!j.contains(k)) continue;
        try {
          *v = j.at(k).as_double();
        } catch (const Error& e) {
          fail("field '", k, "': ", e.what());
        }
        LOOM_CHECK(std::isfinite(*v) && *v >= 0 && *v <= 1e7, "field '", k, "': ", *v,
                   " is not a number of seconds in [0, 1e7]");
      }
    } else if (ev == "section") {
      m.kind = MsgKind::Section;
      m.step = num("step", 0, kMaxStep);
      m.section = str("name");
      LOOM_CHECK(valid_section_name(m.section), "section name '", m.section,
                 "' is not 1 to 32 letters a-z or '_'");
    } else if (ev == "step") {
      m.kind = MsgKind::Step;
      m.step = num("step", 0, kMaxStep);
      try {
        m.seconds = j.at("seconds").as_double();
      } catch (const Error& e) {
        fail("field 'seconds': ", e.what());
      }
      LOOM_CHECK(std::isfinite(m.seconds) && m.seconds >= 0, "step seconds ", m.seconds,
                 " is not a finite number >= 0");
    } else if (ev == "bye") {
      m.kind = MsgKind::Bye;
    } else {
      fail("unknown event '", ev, "' (expected hello, section, step or bye)");
    }
    return m;
  } catch (const Error& e) {
    fail("malformed heartbeat from ", where, ": ", e.what(), " in '", shown, "'");
  }
}

}  // namespace loom::resil
