// Bad-input HTML: pages nested far deeper than a thread's stack allows recursion, and pages
// whose parse grows memory faster than their size, are rejected with the limit named instead
// of crashing the run or exhausting memory.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "curate/html_extract.h"
#include "helpers.h"

using namespace loom::curate;

static std::string repeat(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

static std::string nested_divs(int n) {
  return "<html><body>" + repeat("<div>", n) + "deep text" + repeat("</div>", n) + "</body></html>";
}

TEST(HtmlLimits, DeepNestingIsRejectedAsTooDeepNamingTheLimit) {
  Extracted e = extract_main_text(nested_divs(5000), ExtractOptions());
  EXPECT_EQ(e.rejected, "too_deep");
  EXPECT_NE(e.limit.find("max_depth = 1000"), std::string::npos) << e.limit;
  EXPECT_TRUE(e.text.empty());
}

// Runs f on a thread with a 512 KiB stack: recursion once per level of a 20,000-deep tree
// needs several times that, so this fails (SIGSEGV) unless the walk is iterative.
static void on_small_stack(void (*f)(void*), void* arg) {
  struct Call {
    void (*f)(void*);
    void* arg;
  } call{f, arg};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 512 * 1024);
  pthread_t th;
  ASSERT_EQ(pthread_create(
                &th, &attr,
                [](void* c) -> void* {
                  static_cast<Call*>(c)->f(static_cast<Call*>(c)->arg);
                  return nullptr;
                },
                &call),
            0);
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
}

TEST(HtmlLimits, DeepTreeWithinARaisedLimitIsWalkedWithoutRecursion) {
  // 100,000 levels overflowed the recursive walk's stack (SIGSEGV); the explicit stack walks a
  // deep tree on a small stack.
  static Extracted e;
  on_small_stack(
      [](void*) {
        ExtractOptions opt;
        opt.max_depth = 200000;
        e = extract_main_text(nested_divs(20000), opt);
      },
      nullptr);
  EXPECT_EQ(e.rejected, "");
  EXPECT_EQ(e.text, "deep text");
}

TEST(HtmlLimits, NestingUnderTheLimitIsKept) {
  Extracted e = extract_main_text(nested_divs(900), ExtractOptions());
  EXPECT_EQ(e.rejected, "");
  EXPECT_EQ(e.text, "deep text");
}

TEST(HtmlLimits, UnclosedTagsAreRejectedWithPeakRssBounded) {
  // 100,000 unclosed <b> (300 KB) once grew the parse to 24 GB: gumbo copied the stack of open
  // elements into every parse error it recorded. In a child process so that the peak resident
  // set measured is this parse's alone.
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    Extracted e = extract_main_text(repeat("<b>", 100000), ExtractOptions());
    ::_exit(e.rejected == "too_deep" ? 0 : 1);
  }
  int status = 0;
  struct rusage ru {};
  ASSERT_EQ(::wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "not rejected as too_deep";
  EXPECT_LT(ru.ru_maxrss, 200 * 1024) << "peak RSS " << ru.ru_maxrss << " KiB";  // KiB
}

TEST(HtmlLimits, ParseMemoryPastTheLimitIsRejectedAsTooLarge) {
  ExtractOptions opt;
  opt.max_parse_bytes = 1u << 20;
  std::string page =
      "<html><body>" + repeat("<p>Some words in a paragraph.</p>", 20000) + "</body></html>";
  Extracted e = extract_main_text(page, opt);
  EXPECT_EQ(e.rejected, "too_large");
  EXPECT_NE(e.limit.find("max_parse_bytes = 1048576"), std::string::npos) << e.limit;
  EXPECT_TRUE(e.text.empty());
  opt.max_parse_bytes = 256u << 20;
  EXPECT_EQ(extract_main_text(page, opt).rejected, "");
}

TEST(HtmlLimits, AFreshParseAfterARejectedOneIsUnaffected) {
  ExtractOptions opt;
  opt.max_parse_bytes = 1u << 20;
  EXPECT_EQ(extract_main_text(repeat("<p>words</p>", 50000), opt).rejected, "too_large");
  Extracted e = extract_main_text("<html><body><p>Fine words here.</p></body></html>", opt);
  EXPECT_EQ(e.rejected, "");
  EXPECT_EQ(e.text, "Fine words here.");
}
