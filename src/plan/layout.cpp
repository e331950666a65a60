#include "plan/layout.h"

#include <vector>

#include "core/error.h"

namespace loom::plan {

const char* name(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
    case Precision::fp8:
      return "fp8";
  }
  return "?";
}
const char* name(Optimizer o) {
  switch (o) {
    case Optimizer::adam:
      return "adam";
    case Optimizer::sgd:
      return "sgd";
    case Optimizer::adam8bit:
      return "adam8bit";
  }
  return "?";
}
const char* name(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::delayed:
      return "fp8_tensorwise_delayed";
    case Fp8Recipe::current:
      return "fp8_tensorwise_current";
    case Fp8Recipe::mxfp8:
      return "mxfp8";
  }
  return "?";
}

Precision parse_precision(const std::string& s) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16, Precision::fp8})
    if (s == name(p)) return p;
  fail("unknown precision '", s, "' (valid: fp32, bf16, fp16, fp8)");
}
Optimizer parse_optimizer(const std::string& s) {
  for (Optimizer o : {Optimizer::adam, Optimizer::sgd, Optimizer::adam8bit})
    if (s == name(o)) return o;
  fail("unknown optimizer '", s, "' (valid: adam, sgd, adam8bit)");
}
Fp8Recipe parse_fp8_recipe(const std::string& s) {
  for (Fp8Recipe r : {Fp8Recipe::delayed, Fp8Recipe::current, Fp8Recipe::mxfp8})
    if (s == name(r)) return r;
  fail("unknown fp8 recipe '", s,
       "' (valid: fp8_tensorwise_delayed, fp8_tensorwise_current, mxfp8)");
}
int64_t micro_batches(const TrainSpec& t) {
  return t.global_batch / (t.dp * t.micro_batch);
}
int64_t world_size(const TrainSpec& t) {
  return t.tp * t.pp * t.cp * t.dp;
}
int64_t pipeline_slots(const ModelSpec& m, const TrainSpec& t) {
  return m.layers + (t.pipeline_embedding_as_layer ? 2 : 0);
}

namespace {

std::string divisors_of(int64_t n, int64_t limit = 1 << 30) {
  std::string s;
  for (int64_t d = 1; d <= n && d <= limit; ++d)
    if (n % d == 0) s += cat(s.empty() ? "" : ", ", d);
  return s;
}

}  // namespace

void resolve_and_validate(const ModelSpec& m, const ClusterSpec& c, TrainSpec& t) {
  validate(m);
  validate(c);
  auto pos = [](int64_t v, const char* f) {
    LOOM_CHECK(v >= 1, "layout: '", f, "' must be >= 1, got ", v);
  };
  pos(t.tp, "tp");
  pos(t.pp, "pp");
  pos(t.vp, "vp");
  pos(t.cp, "cp");
  pos(t.ep, "ep");
  pos(t.micro_batch, "micro_batch");
  pos(t.grad_accum, "grad_accum");
  LOOM_CHECK(t.global_batch >= 0, "layout: 'global_batch' must be >= 0, got ", t.global_batch);
  LOOM_CHECK(t.zero_stage >= 0 && t.zero_stage <= 3, "layout: parallel.zero must be 0..3, got ",
             t.zero_stage);
  LOOM_CHECK(t.precision != Precision::fp8 || c.gpu.peak_fp8_tflops > 0, "precision fp8: GPU '",
             c.gpu.name, "' has no FP8 tensor cores (use bf16)");

  LOOM_CHECK(m.heads % t.tp == 0, "tensor parallel ", t.tp, " does not divide the ", m.heads,
             " attention heads of '", m.name, "' (valid tp: ", divisors_of(m.heads, c.world()),
             ")");
  LOOM_CHECK(m.kv() % t.tp == 0 || t.tp % m.kv() == 0, "tensor parallel ", t.tp, " and the ",
             m.kv(), " KV heads of '", m.name,
             "' do not divide one another (KV heads are split or replicated whole)");
  LOOM_CHECK(m.ffn % t.tp == 0, "tensor parallel ", t.tp, " does not divide ffn ", m.ffn);
  LOOM_CHECK(t.vp == 1 || t.pp > 1, "virtual pipeline ", t.vp, " needs pp > 1");
  int64_t slots = pipeline_slots(m, t);
  if (slots % (t.pp * t.vp) != 0) {
    std::string ok;
    for (int64_t pp = 1; pp <= slots; ++pp)
      if (slots % pp == 0 && pp * t.tp * t.cp <= c.world()) ok += cat(ok.empty() ? "" : ", ", pp);
    fail("layers: ", slots, t.pipeline_embedding_as_layer ? " (layers + embedding + loss)" : "",
         " are not divisible by pp x vp = ", t.pp, " x ", t.vp, " = ", t.pp * t.vp,
         " (pp values that divide them: ", ok, "; vp must then divide ", slots, " / pp)");
  }
  LOOM_CHECK(slots / (t.pp * t.vp) >= (t.pipeline_embedding_as_layer ? 2 : 1),
             "pipeline: ", t.pp * t.vp, " (virtual) stages for ", slots,
             " layers leaves a stage with no transformer layer");
  LOOM_CHECK(m.seq % (2 * t.cp) == 0 || t.cp == 1, "context parallel ", t.cp,
             " needs the sequence ", m.seq,
             " to be divisible by 2*cp (load-balanced causal split)");
  if (m.moe()) {
    LOOM_CHECK(m.experts % t.ep == 0, "expert parallel ", t.ep, " does not divide the ", m.experts,
               " experts (valid ep: ", divisors_of(m.experts), ")");
  } else {
    LOOM_CHECK(t.ep == 1, "expert parallel ", t.ep, " given but model '", m.name,
               "' has no experts");
  }
  int64_t model_par = t.tp * t.pp * t.cp;
  if (t.dp == 0) {
    LOOM_CHECK(c.world() % model_par == 0, "world size ", c.world(), " (", c.nodes, " nodes x ",
               c.gpus_per_node, " GPUs) is not divisible by tp x pp x cp = ", model_par,
               "; use a GPU count that is a multiple of ", model_par);
    t.dp = c.world() / model_par;
  }
  LOOM_CHECK(world_size(t) == c.world(), "world size mismatch: tp x pp x cp x dp = ", t.tp, " x ",
             t.pp, " x ", t.cp, " x ", t.dp, " = ", world_size(t), " but the cluster has ",
             c.world(), " GPUs (", c.nodes, " nodes x ", c.gpus_per_node,
             "); leave parallel.dp unset to use dp = ",
             c.world() % model_par == 0 ? c.world() / model_par : 0,
             c.world() % model_par == 0 ? "" : " (not possible: change tp/pp/cp)");
  if (t.global_batch == 0) t.global_batch = t.micro_batch * t.grad_accum * t.dp;
  LOOM_CHECK((t.dp * t.cp) % t.ep == 0, "expert parallel ", t.ep,
             " must divide dp x cp = ", t.dp * t.cp,
             " (experts are spread over data-parallel ranks)");
  if (t.global_batch % (t.dp * t.micro_batch) != 0) {
    int64_t unit = t.dp * t.micro_batch;
    int64_t lo = t.global_batch / unit * unit, hi = lo + unit;
    fail("global batch ", t.global_batch, " is not divisible by dp x micro_batch = ", t.dp, " x ",
         t.micro_batch, " = ", unit,
         " (nearest valid global batches: ", lo > 0 ? cat(lo, ", ") : "", hi, ")");
  }
  if (t.vp > 1)
    LOOM_CHECK(micro_batches(t) % t.pp == 0, "interleaved pipeline (vp=", t.vp,
               ") needs the number of micro-batches (", micro_batches(t),
               ") to be a multiple of pp (", t.pp, ")");
  if (t.tp == 1) t.sequence_parallel = false;
  if (t.zero_stage == 3 && t.pp > 1)
    fail(
        "parallel.zero = 3 with pipeline parallelism is not supported (use parallel.zero = 1 "
        "with pp > 1)");
}

}  // namespace loom::plan
