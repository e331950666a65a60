#include "data/normalize.h"

#include <cstdlib>

#include "core/error.h"

#ifdef LOOM_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

namespace loom::data {

bool nfc_available() {
#ifdef LOOM_HAVE_UTF8PROC
  return true;
#else
  return false;
#endif
}

namespace {

std::string utf8proc_form(std::string_view text, bool compat) {
  bool ascii = true;
  for (char c : text) ascii &= (static_cast<unsigned char>(c) < 0x80);
  if (ascii) return std::string(text);  // ASCII is its own NFC and NFKC
#ifdef LOOM_HAVE_UTF8PROC
  int opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
  if (compat) opt |= UTF8PROC_COMPAT;
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &out,
                                          static_cast<utf8proc_option_t>(opt));
  if (n < 0) return std::string(text);  // invalid UTF-8: left as bytes
  std::string s(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return s;
#else
  fail(compat ? "NFKC" : "NFC",
       " normalisation needs utf8proc, which this build did not find (scripts/setup.sh)");
#endif
}

}  // namespace

std::string nfc(std::string_view text) {
  return utf8proc_form(text, false);
}
std::string nfkc(std::string_view text) {
  return utf8proc_form(text, true);
}

}  // namespace loom::data
