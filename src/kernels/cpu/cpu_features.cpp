#include "kernels/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace loom::cpu {
namespace {

CpuFeatures probe() {
  CpuFeatures f;
#if defined(__x86_64__)
  // __builtin_cpu_supports also checks that the OS saves the AVX-512 registers (XCR0); before
  // main() it needs the explicit init.
  __builtin_cpu_init();
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
  // The newer bits straight from CPUID leaf 7 (not every compiler's __builtin_cpu_supports
  // names them), usable only where the AVX-512 state is.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx512fp16 = f.avx512f && (d >> 23 & 1);
    f.amx_bf16 = d >> 22 & 1;
    f.amx_tile = d >> 24 & 1;
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = f.avx512f && (a >> 5 & 1);
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = probe();
  return features;
}

}  // namespace loom::cpu
