#include "data/spm_tokenizer.h"

#include <exception>
#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "data/hf_pipeline.h"

#if LOOM_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace loom::data {

namespace {

#if LOOM_HAVE_SENTENCEPIECE
class SpmBackend final : public TokenizerBackend {
 public:
  explicit SpmBackend(std::string bytes) : bytes_(std::move(bytes)) {}
  sentencepiece::SentencePieceProcessor sp;
  const std::string& bytes() const { return bytes_; }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<int> ids;
    sentencepiece::util::Status st;
    try {
      st = sp.Encode(std::string(text), &ids);
    } catch (const std::exception& e) {
      fail("SentencePiece encode: ", e.what());
    }
    LOOM_CHECK(st.ok(), "SentencePiece encode: ", st.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string text;
    sentencepiece::util::Status st;
    try {
      st = sp.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    } catch (const std::exception& e) {
      fail("SentencePiece decode: ", e.what());
    }
    LOOM_CHECK(st.ok(), "SentencePiece decode: ", st.ToString());
    return text;
  }

 private:
  std::string bytes_;
};
#endif

}  // namespace

bool sentencepiece_available() {
  return LOOM_HAVE_SENTENCEPIECE != 0;
}

BpeTokenizer spm_tokenizer_from_bytes(const std::string& bytes, const std::string& where) {
#if LOOM_HAVE_SENTENCEPIECE
  auto backend = std::make_shared<SpmBackend>(bytes);
  // The library reports most bad models by status, some (an empty piece, from its trie
  // builder) by a C++ exception.
  sentencepiece::util::Status st;
  try {
    st = backend->sp.LoadFromSerializedProto(bytes);
  } catch (const std::exception& e) {
    fail(where, ": not a readable SentencePiece model (tokenizer.model): ", e.what());
  }
  LOOM_CHECK(st.ok(), where,
             ": not a readable SentencePiece model (tokenizer.model): ", st.ToString());
  const int n = backend->sp.GetPieceSize();
  LOOM_CHECK(n > 0, where, ": the SentencePiece model has no pieces");
  std::vector<std::string> tokens(static_cast<size_t>(n));
  SpecialTokens specials;
  for (int id = 0; id < n; ++id) {
    const std::string& piece = backend->sp.IdToPiece(id);
    LOOM_CHECK(!piece.empty(), where, ": SentencePiece piece ", id, " is empty");
    if (backend->sp.IsControl(id) || backend->sp.IsUnknown(id))
      specials.emplace_back(piece, id);
    else
      tokens[size_t(id)] = piece;
  }
  auto pipe = std::make_shared<HfPipeline>();
  pipe->char_model = true;
  pipe->runs_encode = false;
  pipe->unk_id = backend->sp.unk_id();
  HfDecoder space;
  space.kind = HfDecoder::Kind::Metaspace;
  space.pattern = "\u2581";
  pipe->decoders.push_back(space);
  if (backend->sp.bos_id() >= 0) pipe->prefix.push_back(backend->sp.bos_id());
  try {
    return BpeTokenizer::from_backend(std::move(tokens), std::move(specials), std::move(pipe),
                                      std::move(backend));
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
#else
  (void)bytes;
  fail(where,
       ": reading a SentencePiece tokenizer.model needs libsentencepiece, which this build "
       "did not find (scripts/setup.sh installs libsentencepiece-dev)");
#endif
}

BpeTokenizer load_spm_tokenizer(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path))
    file = (std::filesystem::path(path) / "tokenizer.model").string();
  return spm_tokenizer_from_bytes(read_file(file), file);
}

std::string spm_model_bytes(const BpeTokenizer& tok) {
#if LOOM_HAVE_SENTENCEPIECE
  if (const auto* b = dynamic_cast<const SpmBackend*>(tok.backend())) return b->bytes();
#else
  (void)tok;
#endif
  return {};
}

}  // namespace loom::data
