#include "data/hf_pipeline.h"

#include <cctype>
#include <string>

#include "data/normalize.h"
#include "data/pretokenize.h"
#include "data/unicode.h"

namespace loom::data {

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t at = 0;
  for (size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, at)) {
    out.append(s, at, hit - at);
    out += to;
    at = hit + from.size();
  }
  if (at == 0) return;
  out.append(s, at);
  s = std::move(out);
}

void split_piece(const HfPreTokenizer& p, const std::string& s, std::vector<std::string>& out) {
  using B = HfPreTokenizer::Behavior;
  const auto matches = p.regex->find_all(s);
  size_t prev = 0;
  std::string pending;  // MergedWithNext: a match waiting for the text after it
  auto emit = [&](std::string piece) {
    if (!pending.empty()) piece = std::move(pending) + piece, pending.clear();
    if (!piece.empty()) out.push_back(std::move(piece));
  };
  for (const auto& [b, e] : matches) {
    std::string gap = s.substr(prev, b - prev), hit = s.substr(b, e - b);
    prev = e;
    switch (p.behavior) {
      case B::Isolated:
        emit(std::move(gap));
        emit(std::move(hit));
        break;
      case B::Removed:
        emit(std::move(gap));
        break;
      case B::MergedWithPrevious:
        emit(gap + hit);
        break;
      case B::MergedWithNext:
        emit(std::move(gap));
        pending = std::move(hit);
        break;
      case B::Contiguous:
        break;  // refused when the file is read
    }
  }
  emit(s.substr(prev));
  if (!pending.empty()) out.push_back(std::move(pending));
}

}  // namespace

std::string HfPipeline::normalize(std::string text) const {
  for (const HfNormalizer& n : normalizers) {
    switch (n.kind) {
      case HfNormalizer::Kind::Prepend:
        text = n.text + text;
        break;
      case HfNormalizer::Kind::Replace:
        if (!n.regex) {
          replace_all(text, n.text, n.content);
          break;
        } else {
          std::string out;
          size_t at = 0;
          for (const auto& [b, e] : n.regex->find_all(text)) {
            out.append(text, at, b - at);
            out += n.content;
            at = e;
          }
          out.append(text, at);
          text = std::move(out);
        }
        break;
      case HfNormalizer::Kind::Strip:
        text = js_trim(text, n.left, n.right);
        break;
      case HfNormalizer::Kind::Nfc:
        text = nfc(text);
        break;
      case HfNormalizer::Kind::Nfkc:
        text = nfkc(text);
        break;
    }
  }
  return text;
}

void HfPipeline::pre_tokenize(const std::string& text, bool first,
                              std::vector<std::string>& pieces) const {
  std::vector<std::string> cur{text}, next;
  for (const HfPreTokenizer& p : pre_tokenizers) {
    next.clear();
    for (std::string& s : cur) {
      switch (p.kind) {
        case HfPreTokenizer::Kind::Split:
          split_piece(p, s, next);
          break;
        case HfPreTokenizer::Kind::Metaspace: {
          replace_all(s, " ", p.replacement);
          const bool prepend = p.prepend == HfPreTokenizer::Prepend::Always ||
                               (p.prepend == HfPreTokenizer::Prepend::First && first);
          if (prepend && s.compare(0, p.replacement.size(), p.replacement) != 0)
            s = p.replacement + s;
          if (!p.split) {
            next.push_back(std::move(s));
            break;
          }
          size_t start = 0;
          for (size_t hit = s.find(p.replacement, 1); hit != std::string::npos;
               hit = s.find(p.replacement, hit + p.replacement.size())) {
            if (hit > start) next.push_back(s.substr(start, hit - start));
            start = hit;
          }
          if (start < s.size()) next.push_back(s.substr(start));
          break;
        }
        case HfPreTokenizer::Kind::ByteLevel: {
          if (!p.use_regex) {
            next.push_back(std::move(s));
            break;
          }
          const auto* b = reinterpret_cast<const uint8_t*>(s.data());
          for (size_t i = 0; i < s.size();) {
            const size_t j = next_piece(PreTokenizer::Gpt2, b, s.size(), i);
            next.push_back(s.substr(i, j - i));
            i = j;
          }
          break;
        }
      }
    }
    std::swap(cur, next);
  }
  for (std::string& s : cur)
    if (!s.empty()) pieces.push_back(std::move(s));
}

std::string HfPipeline::decode(std::vector<std::string> tokens) const {
  for (const HfDecoder& d : decoders) {
    switch (d.kind) {
      case HfDecoder::Kind::Replace:
        for (std::string& t : tokens) replace_all(t, d.pattern, d.content);
        break;
      case HfDecoder::Kind::ByteFallback: {
        std::vector<std::string> out;
        std::string bytes;
        bool in_bytes = false;
        for (std::string& t : tokens) {
          const bool is_byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
                               std::isxdigit(uint8_t(t[3])) && std::isxdigit(uint8_t(t[4]));
          if (is_byte) {
            bytes += char(std::stoi(t.substr(3, 2), nullptr, 16));
            in_bytes = true;
            continue;
          }
          if (in_bytes) out.push_back(utf8_replace_invalid(bytes)), bytes.clear(), in_bytes = false;
          out.push_back(std::move(t));
        }
        if (in_bytes) out.push_back(utf8_replace_invalid(bytes));
        tokens = std::move(out);
        break;
      }
      case HfDecoder::Kind::Fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case HfDecoder::Kind::Strip:
        for (std::string& t : tokens) {
          size_t b = 0, e = t.size();
          for (size_t k = 0; k < d.start && t.compare(b, d.content.size(), d.content) == 0; ++k)
            b += d.content.size();
          for (size_t k = 0; k < d.stop && e >= b + d.content.size() &&
                             t.compare(e - d.content.size(), d.content.size(), d.content) == 0;
               ++k)
            e -= d.content.size();
          t = t.substr(b, e - b);
        }
        break;
      case HfDecoder::Kind::Metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          replace_all(tokens[i], d.pattern, " ");
          if (i == 0 && d.strip_first && !tokens[i].empty() && tokens[i][0] == ' ')
            tokens[i].erase(0, 1);
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string HfPipeline::token_text(std::string_view token) const {
  if (token.size() == 6 && token.substr(0, 3) == "<0x" && token[5] == '>' &&
      std::isxdigit(uint8_t(token[3])) && std::isxdigit(uint8_t(token[4])))
    return std::string(1, char(std::stoi(std::string(token.substr(3, 2)), nullptr, 16)));
  std::string t(token);
  for (const HfDecoder& d : decoders) {
    if (d.kind == HfDecoder::Kind::Replace) replace_all(t, d.pattern, d.content);
    if (d.kind == HfDecoder::Kind::Metaspace) replace_all(t, d.pattern, " ");
  }
  return t;
}

}  // namespace loom::data
