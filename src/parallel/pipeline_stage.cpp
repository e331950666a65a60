#include "parallel/pipeline_stage.h"

#include "core/error.h"

namespace loom::parallel {

StageRunner::StageRunner(Decoder& model)
    : model_(model),
      n_chunks_(model.pipeline_stage().whole()
                    ? 1
                    : static_cast<int>(model.pipeline_stage().chunks.size())) {}

std::pair<int, int> StageRunner::range(int chunk) const {
  LOOM_CHECK(chunk >= 0 && chunk < n_chunks_, "pipeline chunk ", chunk, " of ", n_chunks_);
  const PipelineStage& pp = model_.pipeline_stage();
  return pp.whole() ? std::make_pair(0, model_.config().n_layer) : pp.chunks[size_t(chunk)];
}

bool StageRunner::is_first_stage(int chunk) const {
  return model_.pipeline_stage().first && chunk == 0;
}

bool StageRunner::is_last_stage(int chunk) const {
  return model_.pipeline_stage().last && chunk == n_chunks_ - 1;
}

void StageRunner::forward(int chunk, const ModelInput& in, const float* x_in, float* x_out) {
  run_forward(chunk, in, x_in, x_out, 0.f, false);
}

// for_backward: the recomputation that starts backward. Its last block runs inside the
// backward's hooks (before_block(e-1, true) here, after_block(e-1, true) after the block's
// backward), as in forward_backward, where the last block stays gathered into backward.
void StageRunner::run_forward(int chunk, const ModelInput& in, const float* x_in, float* x_out,
                              float dloss, bool for_backward) {
  auto [b, e] = range(chunk);
  Decoder& m = model_;
  m.begin_pass(in, dloss);
  const int64_t n = act_elems(in.N);
  if (is_first_stage(chunk)) {
    m.embed(in);
  } else {
    LOOM_CHECK(x_in, "pipeline chunk ", chunk, " needs its input activation");
    m.backend().copy_d2d(m.layer_input(b), x_in, size_t(n) * sizeof(float));
  }
  float* out = m.final_hidden();
  if (!is_last_stage(chunk)) {
    if (!x_out) x_out = recomputed_out_.ensure_n<float>(m.backend(), size_t(n), "activations");
    out = x_out;
  }
  for (int l = b; l < e; ++l) {
    const bool into_backward = for_backward && l == e - 1;
    if (m.before_block) m.before_block(l, into_backward);
    m.forward_layer(l, in, l + 1 < e ? m.layer_input(l + 1) : out);
    if (m.after_block && !into_backward) m.after_block(l, false);
  }
}

double StageRunner::backward(int chunk, const ModelInput& in, const float* x_in,
                             const float* dx_out, float* dx_in, float dloss) {
  LOOM_CHECK(in.targets, "a pipeline stage's backward needs targets");
  run_forward(chunk, in, x_in, nullptr, dloss, true);  // recompute from the kept chunk input
  auto [b, e] = range(chunk);
  Decoder& m = model_;
  const int64_t n = act_elems(in.N);
  double loss = m.last_aux_loss();
  if (is_last_stage(chunk)) {
    loss += m.head_loss(in, true);
  } else {
    LOOM_CHECK(dx_out, "pipeline chunk ", chunk, " needs its output gradient");
    m.backend().copy_d2d(m.residual_grad(), dx_out, size_t(n) * sizeof(float));
  }
  for (int l = e - 1; l >= b; --l) {
    if (m.before_block && l != e - 1) m.before_block(l, true);  // e-1: since its recomputation
    m.backward_layer(l, in);
    if (m.after_block) m.after_block(l, true);
  }
  if (is_first_stage(chunk))
    m.embed_backward(in);
  else
    m.backend().copy_d2d(dx_in, m.residual_grad(), size_t(n) * sizeof(float));
  return loss;
}

double StageRunner::forward_loss(int chunk, const ModelInput& in, const float* x_in, float* x_out,
                                 StepOutputs* out) {
  LOOM_CHECK(in.targets, "a pipeline stage's forward loss needs targets");
  forward(chunk, in, x_in, x_out);
  double loss = model_.last_aux_loss();
  if (is_last_stage(chunk)) {
    loss += model_.head_loss(in, false);
    if (out) model_.collect_outputs(in, out);  // the head's per-token losses are this pass's
  }
  return loss;
}

}  // namespace loom::parallel
