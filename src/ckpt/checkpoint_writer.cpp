#include "ckpt/checkpoint_writer.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace loom::ckpt {

struct CheckpointWriter::Job {
  TrainerState state;
  TensorList model, optim;  // owned host copies: training goes on changing the originals
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  Written written;
  std::thread thread;
};

namespace {

bool same_layout(const TensorList& a, const TensorList& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].tensor.shape() != b[i].tensor.shape() ||
        a[i].tensor.dtype() != b[i].tensor.dtype())
      return false;
  return true;
}

// dst <- copies of src, reusing dst's buffers when the layout is unchanged (the usual case: the
// same tensors every save), so that a save costs one memory copy and no page faults after the
// first. Contiguous tensors are copied in chunks on all OpenMP threads: this copy is the stall.
void snapshot(const TensorList& src, TensorList* dst) {
  if (!same_layout(src, *dst)) {
    dst->clear();
    for (const NamedTensor& nt : src)
      dst->push_back({nt.name, Tensor::zeros(nt.tensor.shape(), nt.tensor.dtype()), nt.shard});
  }
  struct Piece {
    uint8_t* to;
    const uint8_t* from;
    size_t n;
  };
  constexpr size_t kChunk = size_t{4} << 20;
  std::vector<Piece> pieces;
  for (size_t i = 0; i < src.size(); ++i) {
    (*dst)[i].shard = src[i].shard;
    const Tensor& s = src[i].tensor;
    Tensor d = (*dst)[i].tensor;
    LOOM_CHECK(s.device() == Device::CPU, "checkpoint snapshot: tensor '", src[i].name,
               "' is not on the host (copy it to the host first)");
    if (src[i].fill) {
      src[i].fill(d.raw());
      continue;
    }
    if (!s.is_contiguous()) {
      d.copy_from(s);
      continue;
    }
    auto* to = static_cast<uint8_t*>(d.raw());
    auto* from = static_cast<const uint8_t*>(s.raw());
    for (size_t off = 0; off < s.nbytes(); off += kChunk)
      pieces.push_back({to + off, from + off, std::min(kChunk, s.nbytes() - off)});
  }
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < pieces.size(); ++i) std::memcpy(pieces[i].to, pieces[i].from, pieces[i].n);
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string root, CheckpointWriterOptions options)
    : root_(std::move(root)), opt_(options) {
  LOOM_CHECK(opt_.keep_last >= 0, "checkpoint keep_last must be >= 0, got ", opt_.keep_last);
  LOOM_CHECK(opt_.timeout_s > 0, "train.ckpt_timeout must be > 0 seconds, got ", opt_.timeout_s);
}

CheckpointWriter::~CheckpointWriter() {
  try {
    reap(/*quietly=*/true);
  } catch (const std::exception& e) {
    log_warn("checkpoint: ", e.what());
  }
  if (job_) {
    // Still writing after the timeout: let the thread finish on its own (it owns its job); the
    // checkpoint it writes commits only if it completes.
    job_->thread.detach();
  }
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      log_warn("checkpoint: the last background write failed: ", e.what());
    }
  }
}

void CheckpointWriter::reap(bool quietly) {
  if (!job_) return;
  {
    std::unique_lock<std::mutex> lock(job_->mu);
    const bool finished = job_->cv.wait_for(lock, std::chrono::duration<double>(opt_.timeout_s),
                                            [&] { return job_->done; });
    if (!finished) {
      const std::string msg =
          cat("checkpoint step ", job_->state.step, ": the background write to ", root_,
              " has not finished after ", opt_.timeout_s, " s (train.ckpt_timeout)");
      if (quietly) {
        log_warn(msg);
        return;
      }
      fail(msg);
    }
  }
  job_->thread.join();
  if (job_->error)
    error_ = job_->error;
  else
    done_ = job_->written;
  spare_ = std::move(job_);
  spare_->error = nullptr;
  spare_->done = false;
}

void CheckpointWriter::save(const TrainerState& state, const TensorList& model,
                            const TensorList& optim) {
  const double t0 = now_seconds();
  if (!opt_.async) {
    const std::string dir = save_checkpoint(root_, state, model, optim, opt_.keep_last);
    stall_s_ = now_seconds() - t0;
    done_ = Written{state.step, dir, commit_digest(dir), stall_s_};
    return;
  }
  reap(/*quietly=*/false);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  std::shared_ptr<Job> job = spare_ ? std::move(spare_) : std::make_shared<Job>();
  job->state = state;
  snapshot(model, &job->model);
  snapshot(optim, &job->optim);
  job->thread = std::thread([job, root = root_, keep = opt_.keep_last, quiet = opt_.quiet] {
    const double w0 = now_seconds();
    try {
      const std::string dir = save_checkpoint(root, job->state, job->model, job->optim, keep);
      job->written = Written{job->state.step, dir, commit_digest(dir), now_seconds() - w0};
      if (!quiet)
        log_info("saved checkpoint ", dir, " (written in the background in ",
                 job->written.write_seconds, " s)");
    } catch (...) {
      job->error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(job->mu);
    job->done = true;
    job->cv.notify_all();
  });
  job_ = std::move(job);
  stall_s_ = now_seconds() - t0;
}

std::optional<CheckpointWriter::Written> CheckpointWriter::wait() {
  reap(/*quietly=*/false);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return std::exchange(done_, std::nullopt);
}

}  // namespace loom::ckpt
