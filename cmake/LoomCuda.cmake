# The CUDA backend (src/kernels/cuda) is an optional component. LOOM_CUDA:
#   AUTO (default) build it when CMake finds a CUDA compiler and toolkit, skip it otherwise;
#   ON             require it (configure fails without a toolkit);
#   OFF            never build it: the CPU build is exactly what it is without a toolkit.
# Sets LOOM_CUDA_ENABLED for the rest of the tree (src/kernels/cuda, tests/cuda, bench).
set(LOOM_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE LOOM_CUDA PROPERTY STRINGS AUTO ON OFF)
set(LOOM_CUDA_ENABLED OFF)

if(NOT LOOM_CUDA STREQUAL "OFF")
  # nvcc is often installed outside PATH (/usr/local/cuda/bin): point CMake at it.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(LOOM_NVCC nvcc PATHS /usr/local/cuda/bin /usr/local/cuda-13.0/bin
                 /usr/local/cuda-12/bin NO_CACHE)
    if(LOOM_NVCC)
      set(CMAKE_CUDA_COMPILER ${LOOM_NVCC})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # sm_80 (A100) and sm_90 (H100/H200) machine code; no PTX for other targets.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(LOOM_CUDA_ENABLED ON)
      set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 flag for nvcc; the kernels need 17
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
      if(CCACHE_PROGRAM)
        set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
      endif()
      find_path(LOOM_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
      find_library(LOOM_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
      message(STATUS "CUDA backend: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                     "architectures ${CMAKE_CUDA_ARCHITECTURES}")
    endif()
  endif()
  if(NOT LOOM_CUDA_ENABLED)
    if(LOOM_CUDA STREQUAL "ON")
      message(FATAL_ERROR "LOOM_CUDA=ON but no CUDA compiler/toolkit was found "
                          "(set CMAKE_CUDA_COMPILER or CUDACXX to nvcc)")
    endif()
    message(STATUS "CUDA backend: skipped (no CUDA toolkit found)")
  endif()
endif()
