#include "data/chat_tokens.h"

#include <cstring>

#include "core/error.h"
#include "core/json.h"
#include "data/line_reader.h"

namespace loom::data {

std::string chat_mask_prefix(const std::string& prefix) {
  return prefix + ".mask";
}

ChatTokenStats write_chat_token_files(const std::vector<std::string>& inputs, const ChatTemplate& t,
                                      int64_t vocab_size, const std::string& prefix) {
  LOOM_CHECK(!inputs.empty(), "chat token files: no input files");
  IndexedDatasetWriter ids(prefix, dtype_for_vocab(vocab_size));
  IndexedDatasetWriter mask(chat_mask_prefix(prefix), TokenDType::UInt8);
  ChatTokenStats st;
  LineBlockReader reader(inputs);
  LineBlock block;
  std::vector<int32_t> m;
  while (reader.next(block)) {
    for_each_line(block, [&](std::string_view line, int64_t line_no) {
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;  // blank line
      const std::string where = cat(reader.path(block.file), ":", line_no);
      const ChatExample ex = parse_chat_example(Json::parse(line, where), t, where);
      m.assign(ex.mask.begin(), ex.mask.end());
      ids.add_document(ex.ids);
      mask.add_document(m);
      ++st.examples;
      st.tokens += static_cast<int64_t>(ex.ids.size());
      for (uint8_t v : ex.mask) st.trained_tokens += v;
    });
  }
  LOOM_CHECK(st.examples > 0, "chat token files: no examples in ", inputs.front(),
             inputs.size() > 1 ? " and the other inputs" : "");
  // The mask first: a run stopped in between leaves no PREFIX.idx, which readers need first.
  mask.finalize();
  ids.finalize();
  return st;
}

ChatTokenFile::ChatTokenFile(const std::string& prefix) : prefix_(prefix) {
  ids_ = std::make_unique<IndexedDataset>(prefix);
  const std::string mp = chat_mask_prefix(prefix);
  LOOM_CHECK(file_exists(mp + ".idx"), prefix, ": no loss-mask file ", mp,
             ".idx next to the token file (chat token files are made ",
             "by `loom tokenize --chat`)");
  mask_ = std::make_unique<IndexedDataset>(mp);
  LOOM_CHECK(mask_->dtype() == TokenDType::UInt8, mp, ".idx: the loss mask must be uint8, got ",
             dtype_name(mask_->dtype()));
  LOOM_CHECK(mask_->num_sequences() == ids_->num_sequences(), mp, ".idx: ", mask_->num_sequences(),
             " sequences, but ", prefix, ".idx has ", ids_->num_sequences());
  for (int64_t i = 0; i < ids_->num_sequences(); ++i)
    LOOM_CHECK(mask_->sequence_length(i) == ids_->sequence_length(i), mp, ".idx: sequence ", i,
               " has ", mask_->sequence_length(i), " mask values for ", ids_->sequence_length(i),
               " tokens");
  LOOM_CHECK(ids_->num_sequences() > 0, prefix, ": no examples");
}

ChatExample ChatTokenFile::example(int64_t i) const {
  ChatExample ex;
  ex.ids = ids_->sequence(i);
  const std::vector<int32_t> m = mask_->sequence(i);
  ex.mask.resize(m.size());
  for (size_t k = 0; k < m.size(); ++k) {
    LOOM_CHECK(m[k] == 0 || m[k] == 1, chat_mask_prefix(prefix_), ".bin: sequence ", i,
               " holds mask value ", m[k], " at position ", k, " (only 0 and 1 are valid)");
    ex.mask[k] = static_cast<uint8_t>(m[k]);
  }
  return ex;
}

}  // namespace loom::data
