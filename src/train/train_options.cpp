#include "train/train_options.h"

#include "core/config_int32.h"
#include "core/error.h"

namespace loom {

TrainOptions train_options_from(const Config& c) {
  TrainOptions o;
  o.steps = c.get_int("train.steps", o.steps);
  o.micro_batch = get_int32(c, "train.micro_batch", o.micro_batch);
  o.seq_len = get_int32(c, "train.seq_len", o.seq_len);
  o.grad_accum = get_int32(c, "train.grad_accum", o.grad_accum);
  o.seed = static_cast<uint64_t>(c.get_int("train.seed", static_cast<int64_t>(o.seed)));
  o.threads = get_int32(c, "train.threads", o.threads);
  o.log_interval = c.get_int("train.log_interval", o.log_interval);
  o.eval_interval = c.get_int("train.eval_interval", o.eval_interval);
  o.eval_batches = get_int32(c, "train.eval_batches", o.eval_batches);
  o.out_dir = c.get_string("train.out_dir", o.out_dir);
  o.checkpoint_interval = c.get_int("train.checkpoint_interval", o.checkpoint_interval);
  o.keep_last = get_int32(c, "train.keep_last", o.keep_last);
  o.resume = c.get_bool("train.resume", o.resume);
  o.ckpt_async = c.get_bool("train.ckpt_async", o.ckpt_async);
  o.ckpt_timeout = c.get_double("train.ckpt_timeout", o.ckpt_timeout);
  LOOM_CHECK(o.ckpt_timeout > 0 && o.ckpt_timeout <= 86400, "train.ckpt_timeout = ", o.ckpt_timeout,
             " must lie in (0, 86400] seconds");
  o.init_from = c.get_string("train.init_from", o.init_from);
  o.pretrained = c.get_string("train.pretrained", o.pretrained);
  o.clip_grad = c.get_double("train.clip_grad", o.clip_grad);
  o.peak_gflops = c.get_double("train.peak_gflops", o.peak_gflops);
  o.quiet = c.get_bool("train.quiet", o.quiet);
  o.tensorboard = c.get_bool("train.tensorboard", o.tensorboard);
  o.mode = c.get_string("train.mode", o.mode);
  o.freeze = c.get_string("train.freeze", o.freeze);
  o.recompute = recompute_from_name(c.get_string("train.recompute", "none"));
  o.guard = loss_guard_options_from(c);
  o.device = c.get_string("train.device", o.device);
  LOOM_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "auto",
             "train.device must be cpu, cuda or auto, got '", o.device, "'");
  LOOM_CHECK(o.mode == "pretrain" || o.mode == "sft" || o.mode == "dpo" || o.mode == "reward",
             "train.mode must be pretrain, sft, dpo or reward, got '", o.mode, "'");
  LOOM_CHECK(o.steps > 0, "train.steps must be positive, got ", o.steps);
  LOOM_CHECK(o.micro_batch > 0, "train.micro_batch must be positive, got ", o.micro_batch);
  LOOM_CHECK(o.seq_len > 0, "train.seq_len must be positive, got ", o.seq_len);
  LOOM_CHECK(o.grad_accum > 0, "train.grad_accum must be positive, got ", o.grad_accum);
  LOOM_CHECK(o.log_interval > 0, "train.log_interval must be positive");
  LOOM_CHECK(o.eval_interval >= 0 && o.checkpoint_interval >= 0,
             "train.eval_interval and train.checkpoint_interval must be >= 0");
  LOOM_CHECK(o.keep_last >= 0, "train.keep_last must be >= 0");
  LOOM_CHECK(o.clip_grad >= 0, "train.clip_grad must be >= 0");
  return o;
}

}  // namespace loom
