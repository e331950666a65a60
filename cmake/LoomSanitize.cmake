# Sanitizer and fuzzing builds: separate configurations, never the default one.
#   LOOM_SANITIZE=ON  ASan + UBSan (float-cast-overflow included) on every target, and any
#                     report aborts the process (-fno-sanitize-recover), so UB fails a test.
#   LOOM_FUZZ=ON      clang only: also the libFuzzer targets of tests/fuzz (implies
#                     LOOM_SANITIZE); our code gets libFuzzer's coverage instrumentation.
# The replay executables of tests/fuzz (corpus files run without libFuzzer) are built in every
# configuration, so the default gcc build replays every regression input.
option(LOOM_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(LOOM_FUZZ "Build the libFuzzer targets (clang only; implies LOOM_SANITIZE)" OFF)

if(LOOM_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "LOOM_FUZZ=ON needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang")
  endif()
  set(LOOM_SANITIZE ON CACHE BOOL "" FORCE)
endif()

if(LOOM_SANITIZE)
  set(_loom_san -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all)
  # -O1: reports keep their stack frames and the build is much faster than -O3.
  # Host code only: nvcc would not understand these.
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:${_loom_san};-fno-omit-frame-pointer;-g;-O1>")
  add_link_options(${_loom_san})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC's flow analysis under the sanitizers reports uninitialised reads inside libstdc++
    # (std::regex, std::function) that are not there; the normal build keeps the warning.
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-Wno-maybe-uninitialized>")
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    # At -O1 clang does not vectorize, and says so for every `omp simd` loop.
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-Wno-pass-failed>")
  endif()
  if(LOOM_FUZZ)
    add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=fuzzer-no-link>")
  endif()
  message(STATUS "Sanitizers: ${_loom_san}")
endif()
