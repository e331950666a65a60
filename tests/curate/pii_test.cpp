#include <gtest/gtest.h>

#include "curate/pii.h"
#include "helpers.h"

using namespace loom::curate;

static std::string redact(const std::string& s, PiiCounts* c = nullptr) {
  return redact_pii(s, PiiOptions(), c);
}

TEST(Pii, Emails) {
  PiiCounts c;
  EXPECT_EQ(redact("Write to jane.doe+news@mail.example.co.uk or bob@x.org.", &c),
            "Write to <EMAIL> or <EMAIL>.");
  EXPECT_EQ(c["email"], 2);
  EXPECT_EQ(redact("not an address: user@localhost, @handle, a@b.c"),
            "not an address: user@localhost, @handle, a@b.c");
}

TEST(Pii, PhoneNumbers) {
  PiiCounts c;
  EXPECT_EQ(redact("Call (555) 123-4567 or +1 555 123 4567 or 555.123.4567 today.", &c),
            "Call <PHONE> or <PHONE> or <PHONE> today.");
  EXPECT_EQ(c["phone"], 3);
  // Bare digit runs (ids), years, decimals and short numbers are not phones.
  EXPECT_EQ(redact("order 5551234567, year 2023-2024, pi 3.14159265358, room 12-34"),
            "order 5551234567, year 2023-2024, pi 3.14159265358, room 12-34");
}

TEST(Pii, IpAddresses) {
  PiiCounts c;
  EXPECT_EQ(redact("hosts 192.168.0.1 and 2001:db8::8a2e:370:7334 and fe80:0:0:0:0:0:0:1.", &c),
            "hosts <IP_ADDRESS> and <IP_ADDRESS> and <IP_ADDRESS>.");
  EXPECT_EQ(c["ip_address"], 3);
  EXPECT_EQ(redact("version 1.2.3.4.5, 256.1.1.1, time 12:30:45, ratio a:b"),
            "version 1.2.3.4.5, 256.1.1.1, time 12:30:45, ratio a:b");
}

TEST(Pii, SocialSecurityNumbers) {
  PiiCounts c;
  EXPECT_EQ(redact("SSN 123-45-6789 on file.", &c), "SSN <SSN> on file.");
  EXPECT_EQ(c["ssn"], 1);
  // Invalid areas/groups/serials (000, 666, 9xx, 00, 0000) are not SSNs.
  EXPECT_EQ(redact("000-12-3456 666-12-3456 912-12-3456 123-00-4567 123-45-0000"),
            "000-12-3456 666-12-3456 912-12-3456 123-00-4567 123-45-0000");
}

TEST(Pii, CreditCardsOnlyWhenLuhnValid) {
  EXPECT_TRUE(luhn_valid("4111111111111111"));
  EXPECT_FALSE(luhn_valid("4111111111111112"));
  PiiCounts c;
  EXPECT_EQ(redact("card 4111 1111 1111 1111 and 5500-0000-0000-0004 ok", &c),
            "card <CREDIT_CARD> and <CREDIT_CARD> ok");
  EXPECT_EQ(c["credit_card"], 2);
  EXPECT_EQ(redact("card 4111 1111 1111 1112 and 5500-0000-0000-0005 ok"),
            "card 4111 1111 1111 1112 and 5500-0000-0000-0005 ok");
}

TEST(Pii, StageCountsAndAnnotates) {
  auto r =
      test::run_stage("type = \"pii\"\nphone = false", "mail a@example.com, call (555) 123-4567");
  EXPECT_EQ(r.reason, "");
  EXPECT_EQ(r.text, "mail <EMAIL>, call (555) 123-4567");
  EXPECT_EQ(r.stats.counters["email"], 1);
  EXPECT_EQ(r.doc.record.at("pii_redacted").at("email").as_int(), 1);
}

// The scanners are tried only where a match can start (after an '@' run, at a hex/colon run,
// at a digit, '+' or '(' that follows no letter or digit); neighbours and repeats must still
// all be found, and text around them copied unchanged.
TEST(Pii, AdjacentAndRepeatedMatches) {
  PiiCounts c;
  EXPECT_EQ(redact("a.b@example.com,c@example.org d@x.io", &c), "<EMAIL>,<EMAIL> <EMAIL>");
  EXPECT_EQ(c["email"], 3);
  EXPECT_EQ(redact(".a@example.com"), ".a@example.com");  // a local part cannot start with '.'
  EXPECT_EQ(redact("call 555-123-4567 or 555.123.4567, card 4111 1111 1111 1111; ssn 123-45-6789."),
            "call <PHONE> or <PHONE>, card <CREDIT_CARD>; ssn <SSN>.");
  EXPECT_EQ(redact("4111111111111111, 555-123-4567"), "<CREDIT_CARD>, <PHONE>");
  // A space joins digit groups into one card candidate: 26 digits are not a card.
  EXPECT_EQ(redact("4111111111111111 555-123-4567"), "4111111111111111 <PHONE>");
  EXPECT_EQ(redact("version 1.2.3.4.5 and 10.0.0.1"), "version 1.2.3.4.5 and <IP_ADDRESS>");
  EXPECT_EQ(redact("x1.2.3.4 a10.0.0.1"), "x1.2.3.4 a10.0.0.1");  // glued to a word: not an IP
  PiiCounts none;
  EXPECT_EQ(redact("no personal data: 12:30, 2024-01-02, v3.1", &none),
            "no personal data: 12:30, 2024-01-02, v3.1");
  for (auto& [kind, n] : none) EXPECT_EQ(n, 0) << kind;
}
