// `loom ckpt import`'s weight path on a sharded bf16 Hugging Face directory of a ~1B-parameter
// shape (default llama-1b: Llama 3.2 1B's 1.24B parameters, 2.5 GB in bf16): random bf16
// tensors written as model-0000i-of-0000n.safetensors + model.safetensors.index.json (one
// shard in memory at a time), then, each in its own child process (so that its peak resident
// memory, ru_maxrss, is its own):
//   read:        every shard read() into one reused 64 MiB buffer (what `cat` costs): the
//                baseline;
//   import bf16: import_hf_into bf16 tensors of the parameters (`--dtype bf16`; the files'
//                bits copied as they are);
//   import fp32: the same into fp32 tensors (the default import, widening as it copies).
// The shards are written just before, so every pass reads them from the page cache. Prints
// the load average before and after; the last line is one JSON object. Never asserts timings.
//
//   bench_hf_import [--preset llama-1b] [--dir /tmp/loom_hf_import_bench] [--shard-mb 1024]
//                   [--layers N] [--keep]
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/hf_export.h"
#include "ckpt/model_bridge.h"
#include "ckpt/safetensors.h"
#include "core/bench_util.h"
#include "core/dtype.h"
#include "core/fs.h"
#include "core/json.h"
#include "model/model_config.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// MemAvailable from /proc/meminfo, in bytes (0 when unreadable).
uint64_t mem_available() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char key[64];
  unsigned long long kb = 0, got = 0;
  while (std::fscanf(f, "%63s %llu kB\n", key, &kb) == 2)
    if (std::strcmp(key, "MemAvailable:") == 0) got = kb;
  std::fclose(f);
  return got * 1024;
}

// A random bf16 tensor, values uniform in about [-0.05, 0.05] (xorshift per tensor).
Tensor random_bf16(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::zeros(shape, DType::BF16);
  uint16_t* p = t.data<uint16_t>();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float u = float(x >> 40) / float(1 << 24) - 0.5f;
    p[i] = f32_to_bf16(0.1f * u);
  }
  return t;
}

// Writes the directory: shards of at most shard_bytes, in name order, one in memory at a time.
uint64_t write_model(const std::string& dir, const ckpt::HfModelShape& s, uint64_t shard_bytes) {
  fs::create_directories(dir);
  const auto shapes = ckpt::hf_param_shapes(s);
  std::vector<std::vector<std::string>> groups(1);
  uint64_t in = 0, total = 0;
  for (const auto& [name, shape] : shapes) {
    uint64_t n = 2;
    for (int64_t d : shape) n *= uint64_t(d);
    if (in > 0 && in + n > shard_bytes) {
      groups.emplace_back();
      in = 0;
    }
    groups.back().push_back(name);
    in += n;
    total += n;
  }
  Json weight_map = Json::object();
  uint64_t seed = 1;
  for (size_t g = 0; g < groups.size(); ++g) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", g + 1, groups.size());
    ckpt::TensorMap part;
    for (const std::string& name : groups[g]) {
      part[name] = random_bf16(shapes.at(name), seed++);
      weight_map[name] = Json(std::string(file));
    }
    ckpt::write_safetensors(dir + "/" + file, part, {{"format", "pt"}});
  }
  Json index = Json::object();
  index["metadata"]["total_size"] = Json(total);
  index["weight_map"] = std::move(weight_map);
  write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  write_file_atomic(dir + "/config.json", ckpt::hf_config_json(s, DType::BF16).dump(2) + "\n");
  return total;
}

struct Child {
  double seconds = -1, cpu = -1, rss_mb = -1;  // wall, user + system CPU seconds, peak RSS
};

// Runs fn in a child process: its wall time (reported through a pipe) and peak RSS.
Child in_child(const std::function<void()>& fn) {
  int p[2];
  if (pipe(p) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    const double t0 = now();
    fn();
    const double dt = now() - t0;
    if (write(p[1], &dt, sizeof dt) != sizeof dt) _exit(2);
    _exit(0);
  }
  close(p[1]);
  Child c;
  double dt = -1;
  if (read(p[0], &dt, sizeof dt) == sizeof dt) c.seconds = dt;
  close(p[0]);
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    c.rss_mb = double(ru.ru_maxrss) / 1024.0;
    c.cpu = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
            1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  }
  return c;
}

void read_all(const std::string& dir) {
  std::vector<char> buf(size_t(64) << 20);
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const int fd = open(e.path().c_str(), O_RDONLY);
    if (fd < 0) std::exit(3);
    while (read(fd, buf.data(), buf.size()) > 0) {
    }
    close(fd);
  }
}

void import(const std::string& dir, const ckpt::HfModelShape& s, DType dt) {
  ckpt::TensorMap dst;
  for (const auto& [name, shape] : ckpt::loom_param_shapes(s)) dst[name] = Tensor::zeros(shape, dt);
  ckpt::import_hf_into(dir, s, dst);
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "llama-1b", dir = "/tmp/loom_hf_import_bench";
  uint64_t shard_mb = 1024;
  int layers = 0;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--preset")
      preset = next();
    else if (a == "--dir")
      dir = next();
    else if (a == "--shard-mb")
      shard_mb = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--layers")
      layers = std::atoi(next().c_str());
    else if (a == "--keep")
      keep = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_hf_import [--preset P] [--dir D] [--shard-mb MB] "
                   "[--layers N] [--keep]\n");
      return 2;
    }
  }
  ModelConfig mc = model_preset(preset);
  if (layers > 0) mc.n_layer = layers;
  const uint64_t bytes = uint64_t(mc.num_params()) * 2;
  // The files, the bf16 import and the fp32 one (twice the files) must fit with room to spare;
  // fewer layers otherwise.
  const uint64_t avail = mem_available();
  while (avail > 0 && uint64_t(mc.num_params()) * 2 * 4 > avail && mc.n_layer > 1) --mc.n_layer;
  const ckpt::HfModelShape s = ckpt::hf_shape_of(mc);
  std::printf(
      "hf import bench: %s, %d layers, %.2fB parameters, bf16 shards of <= %llu MiB in %s\n",
      preset.c_str(), mc.n_layer, mc.num_params() / 1e9, static_cast<unsigned long long>(shard_mb),
      dir.c_str());
  if (mc.n_layer != (layers > 0 ? layers : model_preset(preset).n_layer))
    std::printf("(scaled down from %llu bytes to fit MemAvailable %.1f GiB)\n",
                static_cast<unsigned long long>(bytes), avail / 1073741824.0);
  const double load0 = load_average();
  fs::remove_all(dir);
  const double t0 = now();
  const uint64_t total = write_model(dir, s, shard_mb << 20);
  std::printf("wrote %.2f GB in %.1f s\n", total / 1e9, now() - t0);
  const Child rd = in_child([&] { read_all(dir); });
  const Child b16 = in_child([&] { import(dir, s, DType::BF16); });
  const Child f32 = in_child([&] { import(dir, s, DType::F32); });
  const double load1 = load_average();
  auto row = [&](const char* what, const Child& c) {
    std::printf("%-12s %7.2f s (CPU %6.2f s)  %6.2f GB/s  peak RSS %8.0f MiB (%.2fx the files)\n",
                what, c.seconds, c.cpu, total / 1e9 / c.seconds, c.rss_mb,
                c.rss_mb * 1048576.0 / total);
  };
  row("read", rd);
  row("import bf16", b16);
  row("import fp32", f32);
  std::printf(
      "bf16 import / read: %.2fx the time (%.2fx the CPU time); load average %.2f -> %.2f\n",
      b16.seconds / rd.seconds, b16.cpu / rd.cpu, load0, load1);
  std::printf(
      "{\"params\": %lld, \"bytes\": %llu, \"read_s\": %.3f, \"read_rss_mb\": %.0f, "
      "\"import_bf16_s\": %.3f, \"import_bf16_rss_mb\": %.0f, \"import_fp32_s\": %.3f, "
      "\"import_fp32_rss_mb\": %.0f, \"ratio_bf16_vs_read\": %.3f, \"read_cpu_s\": %.3f, "
      "\"import_bf16_cpu_s\": %.3f, \"load_before\": %.2f, \"load_after\": %.2f}\n",
      static_cast<long long>(mc.num_params()), static_cast<unsigned long long>(total), rd.seconds,
      rd.rss_mb, b16.seconds, b16.rss_mb, f32.seconds, f32.rss_mb, b16.seconds / rd.seconds, rd.cpu,
      b16.cpu, load0, load1);
  if (!keep) fs::remove_all(dir);
  return rd.seconds > 0 && b16.seconds > 0 && f32.seconds > 0 ? 0 : 1;
}
