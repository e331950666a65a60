// PII redaction: e-mail addresses, phone numbers, IPv4/IPv6 addresses, US social security
// numbers and credit-card numbers (Luhn-checked) become typed placeholders (<EMAIL>,
// <PHONE>, <IP_ADDRESS>, <SSN>, <CREDIT_CARD>). Hand-written scanners, linear in the text.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace loom::curate {

struct PiiOptions {
  bool email = true, phone = true, ip = true, ssn = true, credit_card = true;
};

// Counts per kind ("email", "phone", "ip_address", "ssn", "credit_card").
using PiiCounts = std::map<std::string, int64_t>;

bool luhn_valid(std::string_view digits);
std::string redact_pii(std::string_view text, const PiiOptions& opt, PiiCounts* counts = nullptr);

}  // namespace loom::curate
