// The CPU feature probe against what the Linux kernel reports in /proc/cpuinfo (its own CPUID
// reading, with the features the OS does not enable cleared): a wrong CPUID bit or register
// shows as a flag that differs.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "kernels/cpu/cpu_features.h"

using namespace loom;

namespace {

// The first processor's "flags" line, as a set of names; empty when there is none.
std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

}  // namespace

TEST(CpuFeatures, AgreeWithProcCpuinfo) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "x86-64 only";
#endif
  const std::set<std::string> flags = proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no flags in /proc/cpuinfo";
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const auto has = [&](const char* name) { return flags.count(name) == 1; };
  EXPECT_EQ(f.avx512f, has("avx512f"));
  EXPECT_EQ(f.avx512bw, has("avx512bw"));
  EXPECT_EQ(f.avx512dq, has("avx512dq"));
  EXPECT_EQ(f.avx512vl, has("avx512vl"));
  EXPECT_EQ(f.avx512vbmi, has("avx512vbmi"));
  // Kernels older than about 5.11-5.16 do not list these names even where the CPU has them:
  // a flag the kernel lists must be probed (a wrong CPUID bit or register reads 0 here).
  EXPECT_TRUE(f.avx512bf16 || !has("avx512_bf16"));
  EXPECT_TRUE(f.avx512fp16 || !has("avx512_fp16"));
  EXPECT_TRUE(f.amx_tile || !has("amx_tile"));
  EXPECT_TRUE(f.amx_bf16 || !has("amx_bf16"));
  EXPECT_EQ(&f, &cpu::cpu_features()) << "probed once";
}
