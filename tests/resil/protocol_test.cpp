#include "resil/protocol.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace loom::resil {
namespace {

std::string error_of(const std::string& line) {
  try {
    decode(line, "rank 3 (10.0.0.1:4000)");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HeartbeatProtocol, RoundTrips) {
  Message h;
  h.kind = MsgKind::Hello;
  h.token = "abc";
  h.attempt = 2;
  h.rank = 5;
  h.world = 8;
  h.pid = 1234;
  h.host = "node7";
  h.run_dir = "/runs/x";
  Message d = decode(encode(h), "t");
  EXPECT_EQ(d.kind, MsgKind::Hello);
  EXPECT_EQ(d.token, "abc");
  EXPECT_EQ(d.attempt, 2);
  EXPECT_EQ(d.rank, 5);
  EXPECT_EQ(d.world, 8);
  EXPECT_EQ(d.pid, 1234);
  EXPECT_EQ(d.host, "node7");
  EXPECT_EQ(d.run_dir, "/runs/x");
  EXPECT_EQ(d.setup_seconds, -1);  // not sent: not known
  EXPECT_EQ(encode(h).find("setup_seconds"), std::string::npos);
  h.setup_seconds = 4.5;
  h.restore_seconds = 1.25;
  d = decode(encode(h), "t");
  EXPECT_DOUBLE_EQ(d.setup_seconds, 4.5);
  EXPECT_DOUBLE_EQ(d.restore_seconds, 1.25);
  Message s;
  s.kind = MsgKind::Section;
  s.step = 17;
  s.section = "forward_backward";
  d = decode(encode(s), "t");
  EXPECT_EQ(d.kind, MsgKind::Section);
  EXPECT_EQ(d.step, 17);
  EXPECT_EQ(d.section, "forward_backward");
  Message e;
  e.kind = MsgKind::Step;
  e.step = 18;
  e.seconds = 0.25;
  d = decode(encode(e), "t");
  EXPECT_EQ(d.kind, MsgKind::Step);
  EXPECT_EQ(d.step, 18);
  EXPECT_DOUBLE_EQ(d.seconds, 0.25);
  EXPECT_EQ(encode(e).find('\n'), std::string::npos);  // one line
}

TEST(HeartbeatProtocol, MalformedLinesNameSenderAndField) {
  std::string e = error_of("hello there");
  EXPECT_NE(e.find("malformed heartbeat from rank 3 (10.0.0.1:4000)"), std::string::npos) << e;
  EXPECT_NE(e.find("'hello there'"), std::string::npos) << e;
  e = error_of(R"({"ev":"section","step":4})");
  EXPECT_NE(e.find("field 'name'"), std::string::npos) << e;
  e = error_of(R"({"ev":"section","step":-1,"name":"data"})");
  EXPECT_NE(e.find("field 'step'"), std::string::npos) << e;
  e = error_of(R"({"ev":"section","step":1,"name":"Data!"})");
  EXPECT_NE(e.find("section name 'Data!'"), std::string::npos) << e;
  e = error_of(R"({"ev":"step","step":1,"seconds":"fast"})");
  EXPECT_NE(e.find("field 'seconds'"), std::string::npos) << e;
  e = error_of(R"({"ev":"step","step":1,"seconds":-2})");
  EXPECT_NE(e.find("not a finite number >= 0"), std::string::npos) << e;
  e = error_of(R"({"ev":"reboot"})");
  EXPECT_NE(e.find("unknown event 'reboot'"), std::string::npos) << e;
  e = error_of(R"(["ev"])");
  EXPECT_NE(e.find("not a JSON object"), std::string::npos) << e;
  e = error_of(R"({"ev":"hello","token":"t","attempt":0,"rank":-4,"world":2,"pid":9,)"
               R"("host":"h","run_dir":""})");
  EXPECT_NE(e.find("field 'rank'"), std::string::npos) << e;
  const std::string hello = R"({"ev":"hello","token":"t","attempt":0,"rank":0,"world":2,"pid":9,)"
                            R"("host":"h","run_dir":"",)";
  e = error_of(hello + R"("setup_seconds":-2})");
  EXPECT_NE(e.find("field 'setup_seconds': -2 is not a number of seconds"), std::string::npos) << e;
  e = error_of(hello + R"("restore_seconds":"soon"})");
  EXPECT_NE(e.find("field 'restore_seconds'"), std::string::npos) << e;
  std::string longline(500, 'x');
  e = error_of(longline);
  EXPECT_LT(e.size(), 400u) << "the quoted line is cut short";
}

}  // namespace
}  // namespace loom::resil
