// A deterministic corpus of short web-like documents for the default pipeline's benchmark
// (bench_curate) and its equivalence tests: mostly English articles of 1-4 KB, with planted
// exact and near duplicates, PII, page furniture, repetitive and spam pages, short pages,
// foreign-language and mixed pages, mojibake, decomposed accents (not NFC) and a few empty
// records. The same seed gives the same bytes on every machine (no library distributions, no
// files read).
#pragma once

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "core/json.h"

namespace loom::curate::test {

struct WebDoc {
  std::string id, url, text;
  std::string kind;  // what the generator planted: "article", "pii", "dup", "near_dup", ...
};

class WebCorpus {
 public:
  explicit WebCorpus(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ULL + 1) {}

  // n documents; the text of each is at most a few KB.
  std::vector<WebDoc> make(size_t n) {
    std::vector<WebDoc> docs;
    docs.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      WebDoc d;
      char id[32];
      std::snprintf(id, sizeof id, "web-%06zu", i);
      d.id = id;
      d.url =
          "https://" + pick(kSites) + "/" + pick(kNouns) + "/" + std::to_string(next() % 100000);
      const uint64_t r = next() % 1000;
      if (r < 520 || docs.size() < 8) {
        d.kind = "article";
        d.text = article();
      } else if (r < 600) {
        d.kind = "pii";
        d.text = with_pii(article());
      } else if (r < 660) {
        d.kind = "dup";
        d.text = duplicate(docs[next() % docs.size()].text);
      } else if (r < 720) {
        d.kind = "near_dup";
        d.text = near_duplicate(docs[next() % docs.size()].text);
      } else if (r < 790) {
        d.kind = "foreign";
        d.text = foreign(next() % kLanguages, 4 + next() % 6);
      } else if (r < 815) {
        d.kind = "mixed";
        d.text = mixed();
      } else if (r < 835) {
        d.kind = "accents";
        d.text = accented();
      } else if (r < 850) {
        d.kind = "mojibake";
        d.text = mojibake(article());
      } else {
        d.kind = "junk";
        d.text = junk();
      }
      docs.push_back(std::move(d));
    }
    return docs;
  }

  // The documents as JSONL lines {"id", "url", "text"}.
  static std::string jsonl(const std::vector<WebDoc>& docs) {
    std::string out;
    for (auto& d : docs) {
      Json j = Json::object();
      j["id"] = d.id;
      j["url"] = d.url;
      j["text"] = d.text;
      out += j.dump();
      out += '\n';
    }
    return out;
  }

 private:
  uint64_t s_;
  uint64_t next() {  // splitmix64
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  template <size_t N>
  std::string pick(const char* const (&list)[N]) {
    return list[next() % N];
  }
  bool chance(int per_mille) { return static_cast<int>(next() % 1000) < per_mille; }

  static constexpr const char* kSites[] = {"example.com",       "news.example.org",
                                           "blog.example.net",  "shop.example.com",
                                           "forum.example.org", "wiki.example.net"};
  static constexpr const char* kDets[] = {"the",   "the", "the",   "a",   "this", "that",
                                          "every", "our", "their", "its", "some", "each"};
  static constexpr const char* kNouns[] = {
      "river",     "garden",    "morning",  "people",     "village",  "history",  "market",
      "winter",    "teacher",   "window",   "letter",     "station",  "mountain", "library",
      "kitchen",   "summer",    "doctor",   "bridge",     "harbor",   "forest",   "student",
      "country",   "evening",   "painter",  "journey",    "music",    "dinner",   "island",
      "castle",    "engine",    "valley",   "meadow",     "lantern",  "company",  "school",
      "system",    "program",   "question", "government", "number",   "problem",  "service",
      "family",    "community", "business", "research",   "council",  "software", "report",
      "weather",   "season",    "recipe",   "garden",     "vehicle",  "hospital", "network",
      "product",   "customer",  "election", "museum",     "festival", "argument", "evidence",
      "language",  "computer",  "building", "experience", "decision", "library",  "project",
      "committee", "industry",  "audience", "painting",   "coffee",   "bicycle",  "camera",
      "student",   "chapter",   "neighbor", "director",   "farmer",   "engineer", "price",
      "budget",    "policy",    "energy",   "water",      "city",     "road",     "team"};
  static constexpr const char* kAdjs[] = {
      "quiet",    "bright",   "careful",   "gentle",    "famous",    "ancient",   "modern",
      "small",    "large",    "local",     "national",  "simple",    "important", "early",
      "recent",   "public",   "private",   "strong",    "useful",    "common",    "popular",
      "serious",  "special",  "difficult", "different", "available", "beautiful", "old",
      "new",      "young",    "certain",   "clear",     "final",     "general",   "major",
      "official", "possible", "various",   "wooden",    "narrow",    "patient",   "honest"};
  static constexpr const char* kVerbs[] = {
      "opened",    "visited",  "painted",   "followed",  "noticed",   "remembered", "carried",
      "described", "built",    "changed",   "explained", "reported",  "announced",  "improved",
      "received",  "designed", "supported", "measured",  "collected", "repaired",   "discussed",
      "published", "reviewed", "organized", "planned",   "finished",  "studied",    "watched",
      "protected", "replaced", "offered",   "returned",  "created",   "shared",     "tested"};
  static constexpr const char* kPreps[] = {
      "of",      "in",      "near",  "with",   "for",    "from",  "across",  "toward",
      "beneath", "between", "after", "before", "during", "about", "without", "under"};
  static constexpr const char* kAdvs[] = {"quickly", "slowly", "finally",   "often",
                                          "usually", "rarely", "carefully", "recently",
                                          "already", "soon",   "also",      "still"};
  static constexpr const char* kLinks[] = {"and", "but",  "because", "while", "although",
                                           "so",  "when", "after",   "since", "until"};
  static constexpr const char* kOpeners[] = {
      "In the end,",  "For many years,",  "According to the report,",
      "Last week,",   "As a result,",     "On the other hand,",
      "In practice,", "At first,",        "Later that day,",
      "Even so,",     "For this reason,", "In most cases,"};

  std::string noun_phrase() {
    std::string s = pick(kDets) + " ";
    if (chance(450)) s += pick(kAdjs) + " ";
    s += pick(kNouns);
    if (chance(250)) s += " " + pick(kPreps) + " the " + pick(kNouns);
    return s;
  }
  std::string clause() {
    std::string s = noun_phrase();
    if (chance(300)) s += " " + pick(kAdvs);
    s += " " + pick(kVerbs) + " " + noun_phrase();
    if (chance(400)) s += " " + pick(kPreps) + " " + noun_phrase();
    return s;
  }
  std::string sentence() {
    std::string s;
    if (chance(200)) s = pick(kOpeners) + " ";
    s += clause();
    if (chance(350)) s += (chance(500) ? ", " : " ") + pick(kLinks) + " " + clause();
    if (chance(60)) s += " (" + std::to_string(1900 + next() % 125) + ")";
    s[0] = static_cast<char>(s[0] >= 'a' && s[0] <= 'z' ? s[0] - 32 : s[0]);
    s += chance(920) ? "." : (chance(500) ? "?" : "!");
    return s;
  }
  std::string paragraph(size_t sentences) {
    std::string p;
    for (size_t i = 0; i < sentences; ++i) p += (i ? " " : "") + sentence();
    return p;
  }
  std::string title() {
    std::string t = pick(kAdjs) + " " + pick(kNouns) + " " + pick(kPreps) + " the " + pick(kNouns);
    t[0] = static_cast<char>(t[0] - 32);
    return t;
  }
  std::string article() {
    std::string t = title() + "\n\n";
    const size_t paras = 3 + next() % 6;
    for (size_t i = 0; i < paras; ++i) t += (i ? "\n\n" : "") + paragraph(3 + next() % 4);
    if (chance(200)) t += "\n\nPosted on " + std::to_string(1 + next() % 28) + " March 2024.";
    return t;
  }

  std::string with_pii(std::string t) {
    static constexpr const char* kPii[] = {
        "Contact jane.doe@example.com for the full schedule.",
        "Call the office at (555) 123-4567 or write to info@example.org for details.",
        "The server at 192.168.10.24 handled the requests, and 10.0.0.7 was the backup.",
        "My card number 4111 1111 1111 1111 was charged twice for the same order.",
        "Her social security number 123-45-6789 was printed on the form by mistake.",
        "Send questions to press@news.example.org or call +44 20 7946 0958.",
        "The address 2001:db8::8a2e:370:7334 answered from the second network."};
    const size_t k = 1 + next() % 2;
    for (size_t i = 0; i < k; ++i) {
      size_t at = t.rfind("\n\n");
      std::string line = std::string(kPii[next() % std::size(kPii)]) + " ";
      if (at == std::string::npos || chance(500))
        t += "\n\n" + line + sentence();
      else
        t.insert(at + 2, line);
    }
    return t;
  }
  std::string duplicate(const std::string& t) {
    if (!chance(300)) return t;
    std::string u;  // the same text with different case and spacing: exact_dedup's key equal
    for (char c : t) {
      if (c == ' ' && chance(100)) u += "  ";
      u += c >= 'a' && c <= 'z' && chance(30) ? static_cast<char>(c - 32) : c;
    }
    return u;
  }
  std::string near_duplicate(std::string t) {
    if (chance(500)) {
      size_t sp = t.find(' ', t.size() / 2);
      if (sp != std::string::npos) t.insert(sp, " " + pick(kAdjs));
    } else {
      t += "\n\n" + sentence();
    }
    return t;
  }

  static constexpr size_t kLanguages = 8;
  std::string foreign(size_t lang, size_t paragraphs) {
    static constexpr const char* kFr[] = {
        "le",     "la",      "les",     "des",          "une",      "est",      "dans",     "pour",
        "avec",   "que",     "qui",     "nous",         "sont",     "été",      "très",     "après",
        "année",  "ville",   "travail", "gouvernement", "pays",     "français", "histoire", "école",
        "marché", "rivière", "musique", "déjà",         "être",     "où",       "mais",     "aussi",
        "leur",   "entre",   "pendant", "toujours",     "première", "société"};
    static constexpr const char* kDe[] = {
        "der",    "die",      "das",       "und",    "ist",        "nicht",  "mit",      "sich",
        "auf",    "für",      "eine",      "werden", "wurde",      "über",   "nach",     "bei",
        "Stadt",  "Jahr",     "Regierung", "Schule", "Geschichte", "Straße", "Menschen", "größer",
        "schön",  "während",  "zwischen",  "auch",   "können",     "müssen", "Arbeit",   "Wasser",
        "Brücke", "Gemeinde", "deutschen", "heute"};
    static constexpr const char* kEs[] = {
        "el",      "la",      "los",      "las",     "que",     "del",      "una",     "por",
        "con",     "para",    "está",     "año",     "ciudad",  "gobierno", "país",    "también",
        "según",   "después", "historia", "niños",   "escuela", "mañana",   "trabajo", "español",
        "música",  "río",     "siempre",  "durante", "entre",   "nuestro",  "cuando",  "pueblo",
        "mercado", "más",     "así",      "sobre"};
    static constexpr const char* kIt[] = {
        "il",     "della", "che",      "non",     "sono",  "nel",    "una",    "per",
        "con",    "anche", "città",    "governo", "paese", "storia", "scuola", "lavoro",
        "sempre", "dopo",  "italiano", "perché",  "più",   "già",    "della",  "questo",
        "quando", "fiume", "musica",   "mercato", "gli",   "degli",  "essere", "molto",
        "tutti",  "anni",  "prima",    "nostro"};
    static constexpr const char* kPt[] = {
        "não",    "uma",       "para",    "com",       "mais",     "como",   "são",      "está",
        "também", "cidade",    "governo", "país",      "história", "escola", "trabalho", "sempre",
        "depois", "português", "ação",    "ano",       "então",    "muito",  "nosso",    "quando",
        "rio",    "música",    "mercado", "dos",       "das",      "pelo",   "pela",     "foram",
        "já",     "às",        "até",     "informação"};
    static constexpr const char* kNl[] = {
        "het",      "een",          "van",      "zijn",   "niet",   "ook",
        "voor",     "maar",         "werd",     "deze",   "stad",   "regering",
        "land",     "geschiedenis", "school",   "werk",   "altijd", "nederlands",
        "jaar",     "wij",          "jullie",   "hebben", "worden", "naar",
        "uit",      "bij",          "gemeente", "rivier", "muziek", "markt",
        "kinderen", "tussen",       "tijdens",  "waar",   "hoe",    "goed"};
    static constexpr const char* kRu[] = {
        "и",       "в",     "не",     "на",     "что",           "это",
        "как",     "по",    "но",     "из",     "его",           "она",
        "они",     "был",   "была",   "город",  "правительство", "страна",
        "история", "школа", "работа", "всегда", "после",         "русский",
        "год",     "река",  "музыка", "рынок",  "люди",          "между",
        "время",   "также", "когда",  "очень",  "новый",         "сегодня"};
    static constexpr const char* kZh[] = {
        "我们", "他们", "中国", "政府", "城市", "历史", "学校", "工作", "今天",
        "经济", "发展", "社会", "文化", "问题", "已经", "因为", "所以", "但是",
        "非常", "重要", "人民", "国家", "时间", "市场", "音乐", "河流", "孩子",
        "研究", "技术", "世界", "地方", "这个", "没有", "可以", "以及", "进行"};
    std::string t;
    for (size_t p = 0; p < paragraphs; ++p) {
      if (p) t += "\n\n";
      const size_t sentences = 2 + next() % 4;
      for (size_t s = 0; s < sentences; ++s) {
        const size_t words = 7 + next() % 12;
        std::string sent;
        for (size_t w = 0; w < words; ++w) {
          std::string word;
          switch (lang) {
            case 0:
              word = pick(kFr);
              break;
            case 1:
              word = pick(kDe);
              break;
            case 2:
              word = pick(kEs);
              break;
            case 3:
              word = pick(kIt);
              break;
            case 4:
              word = pick(kPt);
              break;
            case 5:
              word = pick(kNl);
              break;
            case 6:
              word = pick(kRu);
              break;
            default:
              word = pick(kZh);
              break;
          }
          sent += (w && lang != 7 ? " " : "") + word;
        }
        if (sent[0] >= 'a' && sent[0] <= 'z') sent[0] = static_cast<char>(sent[0] - 32);
        t += (s ? " " : "") + sent + (lang == 7 ? "。" : ".");
      }
    }
    return t;
  }
  std::string mixed() {
    std::string t = title() + "\n\n";
    const size_t parts = 2 + next() % 4;
    const size_t lang = next() % kLanguages;
    for (size_t i = 0; i < parts; ++i)
      t += (i ? "\n\n" : "") + (chance(500) ? paragraph(2 + next() % 3) : foreign(lang, 1));
    return t;
  }
  // English with accented loan words, in NFC or decomposed (combining acute, U+0301).
  std::string accented() {
    static constexpr const char* kNfc[] = {"café",    "résumé", "naïve",  "fiancée",
                                           "déjà vu", "entrée", "soirée", "protégé"};
    static constexpr const char* kNfd[] = {"cafe\u0301",    "re\u0301sume\u0301",  "nai\u0308ve",
                                           "fiance\u0301e", "de\u0301ja\u0300 vu", "entre\u0301e",
                                           "soire\u0301e",  "prote\u0301ge\u0301"};
    std::string t = article();
    const bool decomposed = chance(500);
    for (int k = 0; k < 4; ++k) {
      size_t sp = t.find(' ', next() % t.size());
      if (sp == std::string::npos) continue;
      const size_t w = next() % std::size(kNfc);
      t.insert(sp + 1, std::string(decomposed ? kNfd[w] : kNfc[w]) + " ");
    }
    return t;
  }
  // UTF-8 text decoded as cp1252 and encoded again (the cleaner reverses it).
  std::string mojibake(std::string t) {
    static constexpr const char* kBad[] = {"\u00e2\u20ac\u2122", "caf\u00c3\u00a9",
                                           "\u00e2\u20ac\u0153quoted\u00e2\u20ac\u009d"};
    for (int k = 0; k < 3; ++k) {
      size_t sp = t.find(' ', next() % t.size());
      if (sp != std::string::npos) t.insert(sp + 1, std::string(pick(kBad)) + " ");
    }
    return t;
  }

  std::string junk() {
    switch (next() % 10) {
      case 0: {  // page furniture: many short lines
        static constexpr const char* kNav[] = {
            "Home",           "About us",     "Contact", "Login", "Sign up",
            "Privacy policy", "Terms of use", "Careers", "Shop",  "Cart (0)",
            "Search",         "Menu",         "Blog"};
        std::string t;
        for (size_t i = 0, n = 15 + next() % 30; i < n; ++i) t += pick(kNav) + "\n";
        return t + sentence();
      }
      case 1: {  // one line repeated
        std::string s = sentence(), t;
        for (size_t i = 0, n = 8 + next() % 20; i < n; ++i) t += s + "\n";
        return t;
      }
      case 2: {  // keyword spam
        std::string a = pick(kAdjs), b = pick(kNouns), t;
        for (size_t i = 0, n = 40 + next() % 60; i < n; ++i)
          t += (chance(700) ? "cheap " + b + " " : "best " + a + " " + b + " online ");
        return t;
      }
      case 3:  // too short
        return sentence();
      case 4: {  // hashtags
        std::string t = sentence() + "\n";
        for (size_t i = 0, n = 30 + next() % 30; i < n; ++i) t += "#" + pick(kNouns) + " ";
        return t;
      }
      case 5: {  // bullets
        std::string t;
        for (size_t i = 0, n = 10 + next() % 20; i < n; ++i) t += "- " + noun_phrase() + "\n";
        return t;
      }
      case 6: {  // numbers and codes
        std::string t;
        for (size_t i = 0, n = 30 + next() % 40; i < n; ++i)
          t += std::to_string(next() % 100000) + " | " + std::to_string(next() % 1000) + " | " +
               pick(kNouns).substr(0, 3) + (i % 4 == 3 ? "\n" : " ");
        return t;
      }
      case 7: {  // lorem ipsum
        static constexpr const char* kLorem[] = {
            "lorem",  "ipsum", "dolor",  "sit",     "amet",   "consectetur", "adipiscing",
            "elit",   "sed",   "do",     "eiusmod", "tempor", "incididunt",  "ut",
            "labore", "et",    "dolore", "magna",   "aliqua", "enim",        "minim"};
        std::string t;
        for (size_t i = 0, n = 80 + next() % 80; i < n; ++i)
          t += pick(kLorem) + (i % 12 == 11 ? ".\n" : " ");
        return t;
      }
      case 8: {  // trailing ellipses
        std::string t;
        for (size_t i = 0, n = 8 + next() % 8; i < n; ++i) {
          std::string s = sentence();
          t += s.substr(0, s.size() / 2) + "...\n";
        }
        return t;
      }
      default:  // blank or nearly
        return chance(500) ? std::string(" \n\t ") : std::string();
    }
  }
};

}  // namespace loom::curate::test
