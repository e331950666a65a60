#include "precision/device_fp8.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "kernels/backend.h"

#if LOOM_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "precision/cuda_fp8_recipes.h"
#endif

namespace loom {
namespace {
struct StandIn {
  const Backend* be = nullptr;
  DeviceFp8StandIn make;
};
StandIn& stand_in() {
  static StandIn s;
  return s;
}
}  // namespace

void set_device_fp8_stand_in(const Backend* be, DeviceFp8StandIn make) {
  stand_in() = make ? StandIn{be, std::move(make)} : StandIn{};
}

void check_device_fp8(const Fp8Options& o, const DeviceFp8Target& t, const std::string& where) {
  const std::string recipe = cat("precision.fp8_recipe = \"", fp8_recipe_name(o.kind), "\"");
  LOOM_CHECK(t.cuda || t.stand_in, where, recipe,
             ": the fp8 recipes run on the CPU and on the CUDA backend ",
             "only; leave precision.fp8_recipe unset");
  // Hopper-class fp8 tensor cores; MXFP8 multiplies dequantised bf16 values and needs none.
  LOOM_CHECK(o.kind == Fp8RecipeKind::Mxfp8 || t.sm_version >= 89, where, recipe,
             " needs fp8 tensor cores (sm_89 or newer); this GPU is sm_", t.sm_version,
             ": use mxfp8 (emulated on bf16 GEMMs), train in bf16, or use the CPU");
  // Under context parallelism a rank's GEMMs see its share of every sequence, tokens / cp rows
  // (the trainer has already refused a seq_len that 2 x cp does not divide).
  const int cp = std::max(t.cp, 1);
  const int share = t.tokens % cp == 0 ? t.tokens / cp : 0;
  if (cp == 1)
    LOOM_CHECK(share > 0 && share % 16 == 0, where, recipe, ": the fp8 GEMMs need a ",
               "multiple of 16 tokens per micro-batch (cuBLASLt's fp8 alignment), got ", t.tokens,
               " (train.micro_batch x train.seq_len, DPO: twice that)");
  else
    LOOM_CHECK(share > 0 && share % 16 == 0, where, recipe, ": the fp8 GEMMs need a ",
               "multiple of 16 tokens per micro-batch and context-parallel rank (cuBLASLt's fp8 ",
               "alignment), got ", t.tokens, " tokens over ", cp, " ranks (train.micro_batch x ",
               "train.seq_len / parallel.cp, DPO: twice that); use a train.micro_batch x "
               "train.seq_len that is a ",
               "multiple of ", 16 * cp);
}

DeviceFp8Target device_fp8_target(Backend& be, int dp_ranks, int tokens, int cp) {
  DeviceFp8Target t;
  t.dp_ranks = dp_ranks;
  t.tokens = tokens;
  t.cp = cp;
  if (stand_in().make && stand_in().be == &be) {
    t.stand_in = true;
    t.sm_version = 90;
    return t;
  }
#if LOOM_HAVE_CUDA
  if (auto* cb = dynamic_cast<CudaBackend*>(&be)) {
    t.cuda = true;
    t.sm_version = cb->sm_version();
  }
#else
  (void)be;
#endif
  return t;
}

std::unique_ptr<DeviceFp8Recipes> attach_device_fp8_recipes(const Fp8Options& o, Decoder& model,
                                                            Backend& be, int dp_ranks, int tokens,
                                                            const std::string& where, bool quiet) {
  check_device_fp8(o, device_fp8_target(be, dp_ranks, tokens), where);
  const std::vector<std::string> names = fp8_layer_names(model, o);
  for (const Decoder::LinearInfo& l : model.linears())
    if (std::find(names.begin(), names.end(), l.name) != names.end())
      LOOM_CHECK(l.in % 16 == 0 && l.out % 16 == 0, where, "precision.fp8_recipe: linear ", l.name,
                 " is ", l.in, " -> ", l.out, "; the fp8 GEMMs need widths that are multiples ",
                 "of 16 (model.d_model and the MLP width), or keep that block in bf16 ",
                 "(precision.fp8_keep_first / fp8_keep_last)");
  if (stand_in().make && stand_in().be == &be) return stand_in().make(o, model, be, tokens);
#if LOOM_HAVE_CUDA
  auto r = std::make_unique<CudaFp8Recipes>(model, dynamic_cast<CudaBackend&>(be),
                                            cuda_fp8_options(o), tokens, o);
  if (!quiet)
    log_info("fp8: ", o.describe(), " on ", r->size(), " linear layers (bf16: the head",
             o.keep_first + o.keep_last > 0
                 ? cat(", the first ", o.keep_first, " and last ", o.keep_last, " blocks")
                 : std::string(),
             "); GEMMs: ",
             o.kind == Fp8RecipeKind::Mxfp8 ? "bf16 tensor cores on dequantised MX blocks"
                                            : "cuBLASLt fp8 tensor cores");
  return r;
#else
  (void)quiet;
  fail(where, "this build has no CUDA backend");  // unreachable: check_device_fp8 refused
#endif
}

}  // namespace loom
