// Bad-input HTML: pages nested far deeper than a thread's stack allows recursion, and pages
// whose parse grows memory faster than their size, are rejected with the limit named instead
// of crashing the run or exhausting memory.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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

// Runs extract_main_text(html, opt) in a child process (so that the peak resident set measured
// is this extraction's alone); returns the rejection reason, with the child's peak RSS in KiB.
static std::string extract_in_child(const std::string& html, const ExtractOptions& opt,
                                    long* peak_kib) {
  // The child starts with the parent's resident pages (under ASan, hundreds of MB of shadow
  // and quarantine): its peak is measured from there, so the bound is the extraction's own.
  long rss_at_fork_kib = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    long size = 0, resident = 0;
    if (std::fscanf(f, "%ld %ld", &size, &resident) == 2)
      rss_at_fork_kib = resident * (::sysconf(_SC_PAGESIZE) / 1024);
    std::fclose(f);
  }
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string r = extract_main_text(html, opt).rejected;
    if (r.empty()) r = "kept";
    (void)!::write(fds[1], r.data(), r.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  char buf[64];
  ssize_t n = ::read(fds[0], buf, sizeof buf);
  ::close(fds[0]);
  int status = 0;
  struct rusage ru {};
  EXPECT_EQ(::wait4(pid, &status, 0, &ru), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  *peak_kib = ru.ru_maxrss - rss_at_fork_kib;
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "crashed";
}

TEST(HtmlLimits, UnclosedTagsAreRejectedWithPeakRssBounded) {
  // 100,000 unclosed <b> (300 KB) once grew the parse to 24 GB.
  long peak = 0;
  EXPECT_EQ(extract_in_child(repeat("<b>", 100000), ExtractOptions(), &peak), "too_deep");
  EXPECT_LT(peak, 200 * 1024) << "peak RSS " << peak << " KiB";
}

TEST(HtmlLimits, ParsingManyUnclosedTagsNoLongerGrowsMemoryQuadratically) {
  // Let 15,000 unclosed <b> through both depth checks so that gumbo parses them: it copied the
  // stack of open elements into every parse error it recorded (about 1.8 GB here); parse
  // errors are no longer recorded.
  ExtractOptions opt;
  opt.max_depth = 20000;
  long peak = 0;
  EXPECT_EQ(extract_in_child(repeat("<b>", 15000) + "text", opt, &peak), "kept");
  EXPECT_LT(peak, 200 * 1024) << "peak RSS " << peak << " KiB";
}

TEST(HtmlLimits, PageFarTooDeepIsRefusedBeforeParsing) {
  // 100,000 nested <div> took gumbo 9 s to parse; the pre-scan refuses it at once.
  Extracted e = extract_main_text(nested_divs(100000), ExtractOptions());
  EXPECT_EQ(e.rejected, "too_deep");
  EXPECT_NE(e.limit.find("max_depth = 1000"), std::string::npos) << e.limit;
  EXPECT_NE(e.limit.find("before parsing"), std::string::npos) << e.limit;
}

TEST(HtmlLimits, PrescanIgnoresImplicitlyClosedVoidRawTextAndCommentedTags) {
  // 20,000 unclosed <p>/<li>/<br>/<img>, tags inside a script and a comment: nothing nests.
  std::string page = "<html><body><ul>" + repeat("<li><p>item<br><img src=x>", 20000) +
                     "</ul><script>" + repeat("<div>", 20000) + "</script><!--" +
                     repeat("<div>", 20000) + "--><p>The end.</body></html>";
  Extracted e = extract_main_text(page, ExtractOptions());
  EXPECT_EQ(e.rejected, "");
  EXPECT_NE(e.text.find("The end."), std::string::npos);
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
