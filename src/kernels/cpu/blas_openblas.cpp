#include <cblas.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_features.h"

extern "C" char* openblas_get_corename();

namespace loom::cpu {
namespace {

// OpenBLAS 0.3.21 (Debian 12) does not know AMD Zen 4 and runs its AVX2 "Haswell" kernels
// there (this workplace also sets OPENBLAS_CORETYPE=Haswell). Measured on an EPYC with
// AVX512-BF16: they reach half the sgemm rate of its AVX512 kernels and, worse for Loom, their
// bits depend on how the output is tiled, so 1 and 2 threads give different results. The
// AVX512 kernels ("SkylakeX", "Cooperlake") give the same bits for any split. OpenBLAS picks
// its kernels when it loads, before any code of ours runs; so when it runs an AVX2 core on a
// CPU with AVX512, the process sets OPENBLAS_CORETYPE to the AVX512 core and executes itself
// again, once (LOOM_BLAS_REEXEC marks the second start). LOOM_BLAS_CORE=keep turns this off.
bool wants_avx512_core() {
  if (std::getenv("LOOM_BLAS_REEXEC") != nullptr) return false;
  const char* keep = std::getenv("LOOM_BLAS_CORE");
  if (keep != nullptr && std::strcmp(keep, "keep") == 0) return false;
  const char* core = openblas_get_corename();
  if (core == nullptr || (std::strcmp(core, "Haswell") != 0 && std::strcmp(core, "Zen") != 0))
    return false;
  const CpuFeatures& f = cpu_features();
  return f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl;
}

void reexec_with_avx512_core() {
  if (!wants_avx512_core()) return;
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<char*> argv;
  for (size_t i = 0; i < cmdline.size(); i += std::strlen(cmdline.c_str() + i) + 1)
    argv.push_back(const_cast<char*>(cmdline.c_str() + i));
  if (argv.empty()) return;
  argv.push_back(nullptr);
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = before ? before : "";
  setenv("OPENBLAS_CORETYPE", cpu_features().avx512bf16 ? "Cooperlake" : "SkylakeX", 1);
  setenv("LOOM_BLAS_REEXEC", "1", 1);
  execv("/proc/self/exe", argv.data());
  // exec failed: carry on with the kernels OpenBLAS chose
  if (before)
    setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  else
    unsetenv("OPENBLAS_CORETYPE");
}

// Runs before main() in every program that links the BLAS door (after OpenBLAS has loaded).
const int kCoreChecked = (reexec_with_avx512_core(), 0);

}  // namespace

void blas_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

int blas_threads() {
  return openblas_get_num_threads();
}
void set_blas_threads(int n) {
  openblas_set_num_threads(n);
}
const char* blas_name() {
  return "openblas";
}

const char* blas_core() {
  (void)kCoreChecked;
  return openblas_get_corename();
}

}  // namespace loom::cpu
