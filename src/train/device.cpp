#include "train/device.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"

#include "comm/communicator.h"
#include "comm/staged_communicator.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_backend.h"
#endif
#if LOOM_HAVE_NCCL
#include "comm/nccl/nccl_communicator.h"
#endif

namespace loom {

bool cuda_built() {
#if LOOM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool nccl_built() {
#if LOOM_HAVE_CUDA && LOOM_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

namespace {

// A group of one rank over a backend's buffers: the collectives that move data are Backend
// copies (the host's self communicator memmoves, which device memory does not allow).
class BackendSelfCommunicator : public comm::Communicator {
 public:
  BackendSelfCommunicator(std::string name, Backend& be) : name_(std::move(name)), be_(be) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int world_rank_of(int r) const override { return r; }
  std::string name() const override { return name_; }
  comm::Work all_reduce_async(void*, int64_t, DType, comm::ReduceOp) override { return {}; }
  void all_reduce_f64(double*, int64_t, comm::ReduceOp) override {}  // host scalars
  comm::Work reduce_scatter_async(const void* send, void* recv, const std::vector<int64_t>& counts,
                                  DType t, comm::ReduceOp) override {
    LOOM_CHECK(counts.size() == 1, name_, ": reduce_scatter needs one count per rank");
    be_.copy_d2d(recv, send, size_t(counts[0]) * dtype_size(t));
    return {};
  }
  // One rank's sum is its own bf16 values, widened (exactly) to fp32 by a Backend op.
  comm::Work reduce_scatter_bf16_async(const uint16_t* send, float* recv,
                                       const std::vector<int64_t>& counts) override {
    LOOM_CHECK(counts.size() == 1, name_, ": reduce_scatter needs one count per rank");
    if (counts[0] > 0) be_.convert(recv, DType::F32, send, DType::BF16, counts[0]);
    return {};
  }
  comm::Work all_gather_async(void*, const std::vector<int64_t>& counts, DType) override {
    LOOM_CHECK(counts.size() == 1, name_, ": all_gather needs one count per rank");
    return {};
  }
  comm::Work broadcast_async(void*, int64_t, DType, int root) override {
    LOOM_CHECK(root == 0, name_, ": broadcast root ", root, " outside a group of one rank");
    return {};
  }
  comm::Work send_async(const void*, int64_t, DType, int peer, int) override {
    fail(name_, ": send to rank ", peer, " in a group of one rank");
  }
  comm::Work recv_async(void*, int64_t, DType, int peer, int) override {
    fail(name_, ": receive from rank ", peer, " in a group of one rank");
  }
  comm::Work all_to_all_async(const void* send, void* recv, int64_t n, DType t) override {
    be_.copy_d2d(recv, send, size_t(n) * dtype_size(t));
    return {};
  }
  void barrier() override {}
  std::unique_ptr<comm::Communicator> split(int, int, const std::string& name) override {
    return std::make_unique<BackendSelfCommunicator>(name, be_);
  }

 private:
  std::string name_;
  Backend& be_;
};

}  // namespace

DeviceComm device_comm_from_name(const std::string& name, const std::string& key) {
  DeviceComm k = DeviceComm::Auto;
  if (name == "nccl")
    k = DeviceComm::Nccl;
  else if (name == "staged")
    k = DeviceComm::Staged;
  else
    LOOM_CHECK(name == "auto", key, " must be auto, nccl or staged, got '", name, "'");
  LOOM_CHECK(k != DeviceComm::Nccl || nccl_built(), key,
             " = nccl: this loom was built without the NCCL communicator; use staged or auto");
  return k;
}

const char* device_comm_name(DeviceComm kind) {
  return kind == DeviceComm::Nccl ? "nccl" : kind == DeviceComm::Staged ? "staged" : "auto";
}

std::unique_ptr<comm::Communicator> make_device_communicator(comm::Communicator& group, Backend& be,
                                                             DeviceComm kind) {
  if (group.size() == 1) return std::make_unique<BackendSelfCommunicator>(group.name(), be);
#if LOOM_HAVE_CUDA && LOOM_HAVE_NCCL
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (kind == DeviceComm::Nccl || (kind == DeviceComm::Auto && cb)) {
    LOOM_CHECK(cb, "the NCCL communicator needs the CUDA backend, not ", be.name());
    int gpu = 0;
    LOOM_CHECK(cudaGetDevice(&gpu) == cudaSuccess, "cudaGetDevice failed");
    return comm::make_nccl_communicator(group, gpu, cb->stream(), group.name() + "-nccl");
  }
#else
  LOOM_CHECK(kind != DeviceComm::Nccl, "collectives on ", be.name(), " memory over NCCL: this ",
             "build lacks the NCCL communicator (group ", group.name(), ")");
#endif
  return comm::make_staged_communicator(group, be);
}

int gpu_count() {
#if LOOM_HAVE_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"})
    if (const char* s = std::getenv(v)) {
      char* end = nullptr;
      const long r = std::strtol(s, &end, 10);
      LOOM_CHECK(end != s && *end == '\0' && r >= 0 && r < (1 << 20), "environment variable ", v,
                 " = '", s, "' is not a local rank");
      return static_cast<int>(r);
    }
  return 0;
}

#if LOOM_HAVE_CUDA
namespace {
// One CUDA backend per process, made on first use and kept to the end (parameters, optimizer
// state and every Decoder allocate on it and must not outlive it).
CudaBackend& process_cuda_backend(int gpu) {
  static std::once_flag once;
  static std::unique_ptr<CudaBackend> be;
  static int made_on = -1;
  std::call_once(once, [&] {
    CudaOptions o;
    o.device = gpu;
    be = std::make_unique<CudaBackend>(o);
    made_on = gpu;
  });
  LOOM_CHECK(made_on == gpu, "the CUDA backend of this process runs on GPU ", made_on,
             "; a second one on GPU ", gpu, " was asked for");
  return *be;
}
}  // namespace
#endif

void check_device(const std::string& device, const std::string& key) {
  LOOM_CHECK(device == "cpu" || device == "cuda" || device == "auto", key,
             " must be cpu, cuda or auto, got '", device, "'");
  if (device != "cuda") return;
  LOOM_CHECK(
      cuda_built(), key, " = cuda: this loom was built without the CUDA backend ",
      "(configure with -DLOOM_CUDA=ON where the CUDA toolkit is installed); use cpu or auto");
  LOOM_CHECK(gpu_count() > 0, key, " = cuda: no CUDA device is visible (no NVIDIA driver, no ",
             "GPU, or CUDA_VISIBLE_DEVICES hides them); use cpu or auto");
}

DeviceChoice select_device(const std::string& device, const std::string& key, bool quiet, int gpu) {
  check_device(device, key);
  DeviceChoice c;
  c.backend = &cpu_backend();
  c.describe = "cpu";
  if (device == "cpu") return c;
  const int n = gpu_count();
  if (device == "auto" && n == 0) {
    if (!quiet)
      log_info(key, " = auto: ",
               cuda_built() ? "no CUDA device is visible" : "this build has no CUDA backend",
               "; using the CPU");
    return c;
  }
#if LOOM_HAVE_CUDA
  if (gpu < 0) gpu = local_rank() % n;
  LOOM_CHECK(gpu < n, key, " = cuda: GPU ", gpu, " does not exist (", n, " visible)");
  CudaBackend& be = process_cuda_backend(gpu);
  c.backend = &be;
  c.cuda = true;
  c.describe = cat("cuda:", gpu, " (", be.device_name(), ", sm_", be.sm_version(), ")");
  if (!quiet && device == "auto") log_info(key, " = auto: using ", c.describe);
#endif
  return c;
}

std::string set_gemm_math(Backend& be, const std::string& math) {
#if LOOM_HAVE_CUDA
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (!cb) return "";
  cb->set_gemm_math(gemm_math_from_name(math));
  cb->set_attention_math(AttnMath::Auto);  // tensor cores exactly when the GEMMs round alike
  return gemm_math_name(cb->gemm_math());
#else
  (void)be;
  (void)math;
  return "";
#endif
}

double gpu_bf16_peak_gflops(Backend& be) {
#if LOOM_HAVE_CUDA
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (!cb) return 0;
  const std::string& name = cb->device_name();
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // Datasheet dense bf16 figures (tensor cores, no sparsity), in GFLOP/s.
  if (has("H100") && has("PCIe")) return 756e3;
  if (has("H100") && has("NVL")) return 835e3;
  if (has("H100") || has("H200") || has("H800") || has("GH200")) return 989.4e3;
  if (has("A100")) return 312e3;
  if (has("A800")) return 312e3;
  if (has("L40S")) return 362e3;
  return 0;
#else
  (void)be;
  return 0;
#endif
}

}  // namespace loom
