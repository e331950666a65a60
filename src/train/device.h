// Which Backend a run computes on: train.device (and `--device` on loom train, generate and
// bench train) = "cpu", "cuda" or "auto". The CUDA backend exists only in a build with the
// toolkit (LOOM_CUDA); "cuda" without it, or without a visible GPU, is an error naming the key,
// raised before anything is written. "auto" takes CUDA when both are there, else the CPU with a
// logged notice ("--device = auto: ...; using the CPU"), worded for every caller: training,
// benchmarks, generation and serving all pick their device here.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace loom {

namespace comm {
class Communicator;
}

// Whether this binary has the CUDA backend (and the NCCL communicator) compiled in.
bool cuda_built();
bool nccl_built();
// Usable GPUs (0 in a build without CUDA, or without a driver or device; never throws).
int gpu_count();

struct DeviceChoice {
  Backend* backend = nullptr;  // the CPU backend, or the process's CUDA backend
  bool cuda = false;
  std::string describe;  // "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)"
};

// Throws, naming `key`, unless `device` is cpu, cuda or auto and, for cuda, this build has the
// CUDA backend and a GPU is visible. Makes no backend (command-line checks before any work).
void check_device(const std::string& device, const std::string& key);

// Checks `device` as check_device does, naming `key` ("train.device", "--device") in the
// error otherwise, and picks the backend. The CUDA backend is made once per process (every
// caller shares it) on GPU `gpu` (-1: the launcher's local rank modulo the GPU count, so one
// process per GPU under mpirun / srun / torchrun-style launchers). `quiet` silences the notice.
DeviceChoice select_device(const std::string& device, const std::string& key, bool quiet,
                           int gpu = -1);

// How the ranks of a device run exchange device memory (parallel.device_comm): NCCL, or
// staged through host buffers around the host communicator (comm/staged_communicator.h: no
// NCCL needed, and several ranks may share one GPU, which NCCL refuses). Auto: NCCL on the CUDA
// backend of a build that has it, else staged.
enum class DeviceComm { Auto, Nccl, Staged };
// Throws naming `key` unless `name` is auto, nccl or staged, or for nccl in a build without it.
DeviceComm device_comm_from_name(const std::string& name, const std::string& key);
const char* device_comm_name(DeviceComm kind);

// `group` for collectives on `be`'s memory: one rank, a communicator whose data moves are
// Backend copies; several, the ranks over NCCL on the device `be` computes on (its stream),
// bootstrapped through `group` (a host communicator), or `group` itself with every buffer
// staged through the host (`kind`). The result must not outlive `group`.
std::unique_ptr<comm::Communicator> make_device_communicator(comm::Communicator& group, Backend& be,
                                                             DeviceComm kind = DeviceComm::Auto);

// The launcher's local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, LOCAL_RANK), 0 without.
int local_rank();

// On the CUDA backend: the fp32 Backend GEMMs' tensor-core math, "tf32" (the default), "bf16"
// (inputs rounded to bf16, fp32 accumulation; attention on the bf16 tensor cores too) or
// "fp32" (exact, CUDA cores). Returns the math now in use ("" on a backend without the choice).
std::string set_gemm_math(Backend& be, const std::string& math);

// The dense bf16 tensor-core peak of the GPU the CUDA backend runs on, in GFLOP/s (H100 SXM:
// 989 TFLOP/s, H200: the same chip; A100: 312), from its SM version and count and clock; 0 when
// unknown (then MFU is not reported).
double gpu_bf16_peak_gflops(Backend& be);

}  // namespace loom
