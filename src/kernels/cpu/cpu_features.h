// What this CPU (and the OS) offers the kernels, probed once per process: each AVX-512 flag is
// set only where the OS saves the AVX-512 registers, so a kernel may use the instructions where
// its flag is set. AMX's tile state is not granted by this probe: Linux hands it out only on
// request (gemm_lowp_amx.cpp asks where it will use the tiles).
#pragma once

namespace loom::cpu {

struct CpuFeatures {
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512vbmi = false;                  // byte permutes
  bool avx512bf16 = false;                  // bf16 dot products and conversions (AVX512_BF16)
  bool avx512fp16 = false;                  // fp16 arithmetic (Sapphire Rapids and later)
  bool amx_tile = false, amx_bf16 = false;  // the tile unit and its bf16 products (CPUID)
};

// Thread-safe; safe to call before main() (a static initialiser elsewhere may need it).
const CpuFeatures& cpu_features();

}  // namespace loom::cpu
