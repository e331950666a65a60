# Dependencies come from Debian packages (scripts/setup.sh). The trainer core needs only a
# BLAS and OpenMP; heavier libraries are optional components found or skipped here.
find_package(OpenMP REQUIRED)
find_package(Threads REQUIRED)

# The OpenMP build of OpenBLAS shares Loom's OpenMP thread pool. The pthread build would add a
# second pool whose threads fight OpenMP's spinning workers for the cores (on 2 cores that made
# small GEMMs hundreds of times slower).
find_path(CBLAS_INCLUDE_DIR cblas.h
          PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
          PATH_SUFFIXES openblas NO_DEFAULT_PATH)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
find_library(OPENBLAS_LIBRARY NAMES openblas
             PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
             NO_DEFAULT_PATH)
find_library(OPENBLAS_LIBRARY NAMES openblas)
option(LOOM_USE_OPENBLAS "Use OpenBLAS when found (OFF: always the portable GEMM)" ON)
add_library(loom_blas INTERFACE)
if(LOOM_USE_OPENBLAS AND OPENBLAS_LIBRARY AND CBLAS_INCLUDE_DIR)
  set(LOOM_HAVE_OPENBLAS ON)
  message(STATUS "OpenBLAS: ${OPENBLAS_LIBRARY}")
  target_include_directories(loom_blas INTERFACE ${CBLAS_INCLUDE_DIR})
  target_link_libraries(loom_blas INTERFACE ${OPENBLAS_LIBRARY})
else()
  # A bare toolchain (the GPU machine): the kernels fall back to their portable GEMM.
  set(LOOM_HAVE_OPENBLAS OFF)
  message(WARNING "OpenBLAS not found (scripts/setup.sh installs libopenblas-openmp-dev): "
                  "using the portable GEMM, which is much slower")
endif()

# oneDNN (Debian libdnnl-dev, OpenMP-threaded like OpenBLAS, so both share libgomp's pool) runs
# the bf16 GEMMs on CPUs with AVX512-BF16. Optional: without it bf16 GEMMs convert to fp32.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(DNNL_LIBRARY NAMES dnnl)
option(LOOM_USE_DNNL "Use oneDNN for bf16 GEMMs when found (OFF: convert to fp32 and use sgemm)" ON)
add_library(loom_dnnl INTERFACE)
if(LOOM_USE_DNNL AND DNNL_LIBRARY AND DNNL_INCLUDE_DIR)
  set(LOOM_HAVE_DNNL ON)
  message(STATUS "oneDNN: ${DNNL_LIBRARY}")
  target_include_directories(loom_dnnl INTERFACE ${DNNL_INCLUDE_DIR})
  target_link_libraries(loom_dnnl INTERFACE ${DNNL_LIBRARY})
else()
  set(LOOM_HAVE_DNNL OFF)
  message(STATUS "oneDNN not used: bf16 GEMMs convert to fp32 and run on the fp32 GEMM")
endif()

find_package(MPI COMPONENTS CXX QUIET)
set(LOOM_HAVE_MPI ${MPI_CXX_FOUND})

if(LOOM_TESTS)
  find_package(GTest REQUIRED)
endif()
