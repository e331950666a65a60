#include "curate/writer.h"

#include <zstd.h>

#include "core/error.h"

namespace loom::curate {

JsonlWriter::JsonlWriter(const std::string& path, bool zstd, int level) : file_(path) {
  if (zstd) {
    cctx_ = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level);
  }
}

JsonlWriter::~JsonlWriter() {
  if (cctx_) ZSTD_freeCCtx(cctx_);
}

void JsonlWriter::write_line(const std::string& line) {
  buf_ += line;
  buf_ += '\n';
  ++lines_;
  if (buf_.size() >= (1u << 20)) flush(false);
}

void JsonlWriter::flush(bool end) {
  if (!cctx_) {
    file_.write(buf_);
    buf_.clear();
    return;
  }
  ZSTD_inBuffer in{buf_.data(), buf_.size(), 0};
  out_.resize(ZSTD_CStreamOutSize());
  for (;;) {
    ZSTD_outBuffer o{out_.data(), out_.size(), 0};
    size_t rem = ZSTD_compressStream2(cctx_, &o, &in, end ? ZSTD_e_end : ZSTD_e_continue);
    LOOM_CHECK(!ZSTD_isError(rem), "zstd compression failed: ", ZSTD_getErrorName(rem));
    file_.write(out_.data(), o.pos);
    if (end ? rem == 0 : in.pos == in.size) break;
  }
  buf_.clear();
}

void JsonlWriter::commit() {
  flush(true);
  file_.commit();
}

}  // namespace loom::curate
