#include "curate/pii.h"

#include <vector>

#include "curate/stages.h"

namespace loom::curate {
namespace {

bool digit(char c) {
  return c >= '0' && c <= '9';
}
bool alpha(char c) {
  return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
}
bool alnum(char c) {
  return digit(c) || alpha(c);
}
bool hex(char c) {
  return digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}
bool local_char(char c) {
  return alnum(c) || c == '.' || c == '_' || c == '%' || c == '+' || c == '-';
}

// A matcher returns the length of a match starting at i (0 for none).
using Matcher = size_t (*)(std::string_view s, size_t i);

size_t match_email(std::string_view s, size_t i) {
  if (!local_char(s[i]) || s[i] == '.' || (i > 0 && local_char(s[i - 1]))) return 0;
  size_t j = i;
  while (j < s.size() && local_char(s[j])) ++j;
  if (j >= s.size() || s[j] != '@' || j == i) return 0;
  size_t k = j + 1, labels = 0, last_label_start = k;
  bool last_alpha = true;
  while (k < s.size()) {
    size_t b = k;
    while (k < s.size() && (alnum(s[k]) || s[k] == '-')) ++k;
    if (k == b) break;
    ++labels;
    last_label_start = b;
    last_alpha = true;
    for (size_t q = b; q < k; ++q) last_alpha &= alpha(s[q]);
    if (k + 1 < s.size() && s[k] == '.' && alnum(s[k + 1])) {
      ++k;
      continue;
    }
    break;
  }
  if (labels < 2 || !last_alpha || k - last_label_start < 2) return 0;
  return k - i;
}

size_t match_ipv4(std::string_view s, size_t i) {
  if (!digit(s[i]) || (i > 0 && (alnum(s[i - 1]) || s[i - 1] == '.'))) return 0;
  size_t j = i;
  for (int part = 0; part < 4; ++part) {
    if (part > 0) {
      if (j >= s.size() || s[j] != '.') return 0;
      ++j;
    }
    size_t b = j;
    int v = 0;
    while (j < s.size() && digit(s[j]) && j - b < 3) v = v * 10 + (s[j++] - '0');
    if (j == b || v > 255) return 0;
  }
  if (j < s.size() && (alnum(s[j]) || (s[j] == '.' && j + 1 < s.size() && digit(s[j + 1]))))
    return 0;
  return j - i;
}

size_t match_ipv6(std::string_view s, size_t i) {
  if (!(hex(s[i]) || s[i] == ':') || (i > 0 && (alnum(s[i - 1]) || s[i - 1] == ':'))) return 0;
  size_t j = i;
  while (j < s.size() && (hex(s[j]) || s[j] == ':')) ++j;
  if (j < s.size() && (alnum(s[j]) || (s[j] == '.' && j + 1 < s.size() && digit(s[j + 1]))))
    return 0;
  std::string_view run = s.substr(i, j - i);
  // Validate: groups of 1-4 hex digits, at most one "::", 8 groups or fewer with "::".
  size_t dbl = run.find("::");
  if (dbl != std::string_view::npos && run.find("::", dbl + 1) != std::string_view::npos) return 0;
  if (run.find(":::") != std::string_view::npos) return 0;
  int groups = 0, colons = 0;
  size_t k = 0;
  while (k < run.size()) {
    if (run[k] == ':') {
      ++colons;
      ++k;
      continue;
    }
    size_t b = k;
    while (k < run.size() && hex(run[k])) ++k;
    if (k - b > 4) return 0;
    ++groups;
  }
  if (colons < 2) return 0;
  bool has_dbl = dbl != std::string_view::npos;
  if (!has_dbl && (groups != 8 || run.front() == ':' || run.back() == ':')) return 0;
  if (has_dbl && (groups > 7 || groups < 1)) return 0;
  if (!has_dbl && colons != 7) return 0;
  return j - i;
}

size_t match_card(std::string_view s, size_t i) {
  if (!digit(s[i]) || (i > 0 && (alnum(s[i - 1]) || s[i - 1] == '-'))) return 0;
  char digits[20];
  size_t nd = 0;
  size_t j = i, end = i;
  while (j < s.size()) {
    if (digit(s[j])) {
      if (nd == 19) return 0;  // a 20th digit: too long for a card
      digits[nd++] = s[j++];
      end = j;
    } else if ((s[j] == ' ' || s[j] == '-') && j + 1 < s.size() && digit(s[j + 1])) {
      ++j;
    } else {
      break;
    }
  }
  if (end < s.size() && alnum(s[end])) return 0;
  if (nd < 13 || !luhn_valid(std::string_view(digits, nd))) return 0;
  return end - i;
}

size_t match_ssn(std::string_view s, size_t i) {
  if (i + 11 > s.size() || (i > 0 && (alnum(s[i - 1]) || s[i - 1] == '-'))) return 0;
  std::string_view c = s.substr(i, 11);
  for (int k : {0, 1, 2, 4, 5, 7, 8, 9, 10})
    if (!digit(c[static_cast<size_t>(k)])) return 0;
  if (c[3] != '-' || c[6] != '-') return 0;
  if (i + 11 < s.size() && (alnum(s[i + 11]) || s[i + 11] == '-')) return 0;
  int area = (c[0] - '0') * 100 + (c[1] - '0') * 10 + (c[2] - '0');
  if (area == 0 || area == 666 || area >= 900) return 0;
  if (c.substr(4, 2) == "00" || c.substr(7, 4) == "0000") return 0;
  return 11;
}

// North American numbers written with separators ((555) 123-4567, 555.123.4567, 1-555-123-4567)
// or international numbers with a leading '+' (+44 20 7946 0958): 8-15 digits in groups of at
// most 4. Bare digit runs and other groupings (card-like 4-4-4-4, dates) are not phones.
size_t match_phone(std::string_view s, size_t i) {
  char c = s[i];
  if (!(digit(c) || c == '+' || c == '(')) return 0;
  if (i > 0 && (alnum(s[i - 1]) || s[i - 1] == '+' || s[i - 1] == '-' || s[i - 1] == '.')) return 0;
  size_t j = i;
  bool plus = c == '+';
  if (plus) ++j;
  // Digit groups: the first few kept (the rules look at three or four), all counted.
  int groups[8];
  size_t ngroups = 0;
  bool big_group = false;  // a group of more than 4 digits
  auto push_group = [&](int g) {
    if (ngroups < 8) groups[ngroups] = g;
    ++ngroups;
    big_group |= g > 4;
  };
  int cur = 0, digits = 0;
  size_t end = j;
  while (j < s.size()) {
    char d = s[j];
    if (digit(d)) {
      ++cur;
      ++digits;
      ++j;
      end = j;
    } else if (d == ' ' || d == '-' || d == '.' || d == '(' || d == ')') {
      if (cur) push_group(cur);
      cur = 0;
      // A separator continues the number only if a digit follows (after at most one more).
      if (j + 1 < s.size() && (digit(s[j + 1]) || ((s[j + 1] == ' ' || s[j + 1] == '(') &&
                                                   j + 2 < s.size() && digit(s[j + 2]))))
        ++j;
      else
        break;
    } else {
      break;
    }
  }
  if (cur) push_group(cur);
  if (end < s.size() && alnum(s[end])) return 0;
  if (plus) {
    if (digits < 8 || digits > 15 || ngroups > 6) return 0;
    if (big_group && ngroups > 1) return 0;
  } else {
    bool nanp =
        (ngroups == 3 && groups[0] == 3 && groups[1] == 3 && groups[2] == 4) ||
        (ngroups == 4 && groups[0] == 1 && groups[1] == 3 && groups[2] == 3 && groups[3] == 4);
    if (!nanp) return 0;
  }
  return end - i;
}

// One pass of a matcher, tried only at `cands` (increasing positions that include every
// position where the matcher can match): the same result as trying every position left to
// right, skipping past each match. Returns false, leaving `out` alone, when nothing matched.
bool run_pass(std::string_view s, Matcher m, const std::vector<size_t>& cands,
              const char* placeholder, int64_t& count, std::string& out) {
  size_t copied = 0;
  bool any = false;
  for (size_t c : cands) {
    if (c < copied) continue;  // inside the previous match
    size_t n = m(s, c);
    if (n == 0) continue;
    if (!any) {
      out.clear();
      out.reserve(s.size());
      any = true;
    }
    out.append(s.substr(copied, c - copied));
    out += placeholder;
    ++count;
    copied = c + n;
  }
  if (any) out.append(s.substr(copied));
  return any;
}

bool quick_has(std::string_view s, char c) {
  return s.find(c) != std::string_view::npos;
}

// E-mail matches start where a maximal run of local-part characters ends at an '@'.
void email_candidates(std::string_view s, std::vector<size_t>& out) {
  out.clear();
  for (size_t j = s.find('@'); j != std::string_view::npos; j = s.find('@', j + 1)) {
    size_t i = j;
    while (i > 0 && local_char(s[i - 1])) --i;
    if (i < j) out.push_back(i);
  }
}

// IPv6 matches start at the beginning of a maximal run of hex digits and colons.
void ipv6_candidates(std::string_view s, std::vector<size_t>& out) {
  out.clear();
  for (size_t j = s.find(':'); j != std::string_view::npos; j = s.find(':', j)) {
    size_t i = j;
    while (i > 0 && (hex(s[i - 1]) || s[i - 1] == ':')) --i;
    out.push_back(i);
    while (j < s.size() && (hex(s[j]) || s[j] == ':')) ++j;
  }
}

// The numeric matchers (IPv4, card, SSN, phone) all start at a digit, '+' or '(' that does
// not follow a letter or digit.
void number_candidates(std::string_view s, std::vector<size_t>& out) {
  out.clear();
  bool prev_alnum = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool d = digit(c);
    if (!prev_alnum && (d || c == '+' || c == '(')) out.push_back(i);
    prev_alnum = d || alpha(c);
  }
}

}  // namespace

bool luhn_valid(std::string_view digits) {
  int sum = 0;
  bool dbl = false;
  for (size_t k = digits.size(); k-- > 0;) {
    int d = digits[k] - '0';
    if (dbl) {
      d *= 2;
      if (d > 9) d -= 9;
    }
    sum += d;
    dbl = !dbl;
  }
  return !digits.empty() && sum % 10 == 0;
}

std::string redact_pii(std::string_view text, const PiiOptions& opt, PiiCounts* counts) {
  PiiCounts local;
  PiiCounts& c = counts ? *counts : local;
  std::string s(text), next;
  thread_local std::vector<size_t> cands;
  bool any_digit = false;
  for (char ch : s) any_digit |= digit(ch);
  // Each pass sees the previous one's output; a pass that finds nothing copies nothing. A
  // kind's counter exists once its pass ran, as callers may list the kinds checked.
  auto pass = [&](Matcher m, const char* placeholder, const char* kind) {
    if (run_pass(s, m, cands, placeholder, c[kind], next)) s.swap(next);
  };
  if (opt.email && quick_has(s, '@')) {
    email_candidates(s, cands);
    pass(match_email, "<EMAIL>", "email");
  }
  if (opt.ip && quick_has(s, ':')) {
    ipv6_candidates(s, cands);
    pass(match_ipv6, "<IP_ADDRESS>", "ip_address");
  }
  if (!any_digit) return s;
  number_candidates(s, cands);
  auto numeric = [&](Matcher m, const char* placeholder, const char* kind) {
    if (run_pass(s, m, cands, placeholder, c[kind], next)) {
      s.swap(next);
      number_candidates(s, cands);  // positions moved
    }
  };
  if (opt.ip && quick_has(s, '.')) numeric(match_ipv4, "<IP_ADDRESS>", "ip_address");
  if (opt.credit_card) numeric(match_card, "<CREDIT_CARD>", "credit_card");
  if (opt.ssn && quick_has(s, '-')) numeric(match_ssn, "<SSN>", "ssn");
  if (opt.phone) numeric(match_phone, "<PHONE>", "phone");
  return s;
}

namespace {
class PiiStage : public Stage {
 public:
  explicit PiiStage(const StageParams& p) {
    opt_.email = p.get_bool("email", true);
    opt_.phone = p.get_bool("phone", true);
    opt_.ip = p.get_bool("ip_address", true);
    opt_.ssn = p.get_bool("ssn", true);
    opt_.credit_card = p.get_bool("credit_card", true);
  }
  std::string process(Doc& doc, StageContext& ctx) const override {
    PiiCounts counts;
    doc.text = redact_pii(doc.text, opt_, &counts);
    Json found = Json::object();
    for (auto& [k, v] : counts) {
      if (v == 0) continue;
      ctx.count(k, v);
      found[k] = v;
    }
    if (found.size()) {
      ctx.count("docs_with_pii");
      doc.record["pii_redacted"] = found;
    }
    return "";
  }

 private:
  PiiOptions opt_;
};
}  // namespace

std::unique_ptr<Stage> make_pii_stage(const StageParams& p) {
  return std::make_unique<PiiStage>(p);
}

}  // namespace loom::curate
