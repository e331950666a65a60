#include "curate/readers.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/json.h"
#include "curate/input.h"
#include "curate/text.h"

namespace loom::curate {
namespace fs = std::filesystem;

static uint64_t file_size_or_zero(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

static bool wanted(const std::string& path, const std::string& format) {
  std::string name = fs::path(path).filename().string();
  if (name.empty() || name[0] == '.') return false;
  if (format == "html") {
    std::string l = ascii_lower(name);
    return ends_with(l, ".html") || ends_with(l, ".htm") || ends_with(l, ".xhtml") ||
           ends_with(l, ".html.gz") || ends_with(l, ".htm.gz");
  }
  return true;
}

// The wanted files under dir, recursively. Errors (a subdirectory that cannot be opened, an
// entry whose type cannot be read) name the path: the iterator's own exception does not.
static std::vector<std::string> list_input_dir(const std::string& dir, const std::string& format) {
  std::vector<std::string> found;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  LOOM_CHECK(!ec, "cannot read input directory '", dir, "': ", ec.message());
  while (it != end) {
    const fs::path entry = it->path();
    bool regular = it->is_regular_file(ec);
    LOOM_CHECK(!ec, "cannot read input '", entry.string(), "': ", ec.message());
    if (regular && wanted(entry.string(), format)) found.push_back(entry.string());
    it.increment(ec);
    // A failed increment is opening the entry just seen (a subdirectory) or reading its parent.
    LOOM_CHECK(!ec, "cannot read input directory '", entry.string(), "': ", ec.message());
  }
  return found;
}

std::vector<InputShard> plan_shards(const std::vector<std::string>& paths,
                                    const std::string& format, int files_per_shard) {
  std::vector<std::string> files;
  for (auto& p : paths) {
    std::vector<std::string> matches;
    if (p.find_first_of("*?[") != std::string::npos) {
      glob_t g;
      int rc = ::glob(p.c_str(), 0, nullptr, &g);
      if (rc == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) matches.push_back(g.gl_pathv[i]);
      globfree(&g);
      LOOM_CHECK(!matches.empty(), "input pattern '", p, "' matches no files");
    } else {
      std::error_code ec;
      bool there = fs::exists(p, ec);
      LOOM_CHECK(!ec, "input path '", p, "': ", ec.message());
      LOOM_CHECK(there, "input path '", p, "' does not exist");
      matches.push_back(p);
    }
    for (auto& m : matches) {
      std::error_code ec;
      bool dir = fs::is_directory(m, ec);
      LOOM_CHECK(!ec, "input path '", m, "': ", ec.message());
      if (dir) {
        std::vector<std::string> found = list_input_dir(m, format);
        std::sort(found.begin(), found.end());
        files.insert(files.end(), found.begin(), found.end());
      } else {
        files.push_back(m);
      }
    }
  }
  LOOM_CHECK(!files.empty(), "no input files found");
  std::vector<InputShard> shards;
  bool per_file = format == "jsonl" || format == "warc";
  size_t group = per_file ? 1 : static_cast<size_t>(std::max(1, files_per_shard));
  for (size_t i = 0; i < files.size(); i += group) {
    InputShard s;
    s.index = static_cast<int>(shards.size());
    for (size_t k = i; k < std::min(files.size(), i + group); ++k) {
      s.files.push_back(files[k]);
      s.bytes += file_size_or_zero(files[k]);
    }
    shards.push_back(std::move(s));
  }
  return shards;
}

namespace {

std::string json_scalar_to_string(const Json& v) {
  if (v.is_string()) return v.as_string();
  if (v.type() == Json::Type::Int) return std::to_string(v.as_int());
  return v.dump();
}

// Keeps a bounded copy of malformed input in the rejected record so it can be inspected.
std::string preview(const std::string& s) {
  return s.size() > 2000 ? s.substr(0, 2000) : s;
}

class JsonlReader : public DocReader {
 public:
  JsonlReader(std::string path, const ReaderOptions& opt)
      : path_(std::move(path)), opt_(opt), lines_(open_source(path_), opt.max_line_bytes) {}

  bool next(Doc& doc, std::string& reject) override {
    if (dead_) return false;
    std::string line;
    bool too_long = false;
    for (;;) {
      bool got;
      try {
        got = lines_.next(line, too_long);
      } catch (const Error& e) {
        if (opt_.fail_on_error) throw;
        const std::string where = cat(path_, ":", lines_.line_number() + 1);
        errors.push_back({where, cat(e.what(), " (the rest of the file is unread)")});
        // A corrupt stream cannot be resynchronised. As in the WARC reader, the bytes decoded
        // since the last whole line become a document rejected as stream_error (decoded bytes,
        // the unit of every document's input_bytes), and the file's bytes past what was read
        // are unread (on-disk bytes: compressed ones for .gz/.zst).
        dead_ = true;
        ++stream_errors;
        const uint64_t size = file_size_or_zero(path_);
        unread_bytes += size > lines_.position() ? size - lines_.position() : 0;
        const uint64_t partial = lines_.buffered();
        if (partial == 0) return false;
        doc = Doc();
        doc.source = doc.id = where;
        doc.input_bytes = static_cast<int64_t>(partial);
        doc.record = Json::object();
        doc.record["id_derived"] = true;
        reject = "stream_error";
        return true;
      }
      if (!got) return false;
      if (!too_long && trim_view(line).empty()) continue;  // blank lines are not documents
      break;
    }
    uint64_t lineno = lines_.line_number();
    doc = Doc();
    doc.source = cat(path_, ":", lineno);
    doc.input_bytes = static_cast<int64_t>(line.size()) + 1;
    auto bad = [&](const std::string& reason, const std::string& msg) {
      if (opt_.fail_on_error) fail(doc.source, ": ", msg);
      errors.push_back({doc.source, msg});
      doc.id = doc.source;
      doc.record = Json::object();
      doc.record[opt_.id_field] = doc.id;
      doc.record["id_derived"] = true;
      doc.record["raw"] = preview(line);
      reject = reason;
      return true;
    };
    if (too_long)
      return bad("line_too_long",
                 cat("line longer than max_line_bytes (", opt_.max_line_bytes, ")"));
    try {
      doc.record = Json::parse(line, doc.source);
    } catch (const Error& e) {
      std::string msg = e.what();
      return bad("malformed_json", cat("malformed JSON (", msg.substr(doc.source.size() + 2), ")"));
    }
    if (!doc.record.is_object()) return bad("not_an_object", "JSON line is not an object");
    auto& obj = doc.record.as_object();
    auto it = obj.find(opt_.text_field);
    if (it == obj.end() || !it->second.is_string())
      return bad("missing_text_field", cat("no string field '", opt_.text_field, "'"));
    doc.text = it->second.as_string();
    obj.erase(it);
    auto id = obj.find(opt_.id_field);
    if (id != obj.end() && !id->second.is_null()) {
      doc.id = json_scalar_to_string(id->second);
    } else {
      doc.id = doc.source;
      obj["id_derived"] = true;
    }
    reject.clear();
    return true;
  }
  uint64_t position() const override { return lines_.position(); }

 private:
  std::string path_;
  ReaderOptions opt_;
  LineReader lines_;
  bool dead_ = false;  // a stream error ended the file
};

// One document per file (text or HTML).
class FileDocReader : public DocReader {
 public:
  FileDocReader(const InputShard& shard, const ReaderOptions& opt) : shard_(shard), opt_(opt) {}
  bool next(Doc& doc, std::string& reject) override {
    if (i_ >= shard_.files.size()) return false;
    const std::string& path = shard_.files[i_++];
    doc = Doc();
    doc.source = path;
    doc.id = path;
    doc.record = Json::object();
    reject.clear();
    try {
      auto src = open_source(path);
      std::string data, buf(1 << 16, '\0');
      bool over = false;
      for (size_t r; (r = src->read(buf.data(), buf.size())) > 0;) {
        if (data.size() + r > opt_.max_doc_bytes) {
          over = true;
          break;
        }
        data.append(buf, 0, r);
      }
      doc.input_bytes = static_cast<int64_t>(data.size());
      if (over) {
        if (opt_.fail_on_error) fail(path, ": file larger than max_doc_bytes");
        errors.push_back({path, "file larger than max_doc_bytes"});
        reject = "document_too_large";
        return true;
      }
      doc.text = std::move(data);
    } catch (const Error& e) {
      if (opt_.fail_on_error) throw;
      errors.push_back({path, e.what()});
      reject = "unreadable_file";
    }
    pos_ += file_size_or_zero(path);
    if (opt_.format == "html") doc.record["content_type"] = "text/html";
    return true;
  }
  uint64_t position() const override { return pos_; }

 private:
  InputShard shard_;
  ReaderOptions opt_;
  size_t i_ = 0;
  uint64_t pos_ = 0;
};

// Strict decimal byte count: digits only, no sign, fits in int64 (strtoll would read "-5" as
// a negative length and " 12x" as 12).
bool parse_length(const std::string& s, int64_t& out) {
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  out = v;
  return true;
}

// WARC/1.0 (and 1.1) records: response records become documents holding the HTTP body
// (HTML, content_type text/html), conversion records (WET) hold plain text; request, metadata
// and warcinfo records are not documents and are only counted.
//
// Every byte read belongs to exactly one record: a record runs from its header line through
// the blank lines after its payload. Junk between records, a header without a usable
// Content-Length, a truncated record and the part of a record cut by a stream error become
// documents rejected with a reason (and an error naming the place); after junk or a bad
// header the reader resynchronises on the next line starting "WARC/".
class WarcReader : public DocReader {
 public:
  WarcReader(std::string path, const ReaderOptions& opt)
      : path_(std::move(path)), opt_(opt), in_(open_source(path_), 1 << 20) {}

  bool next(Doc& doc, std::string& reject) override {
    if (dead_) return false;
    try {
      return next_record(doc, reject);
    } catch (const Error& e) {
      if (opt_.fail_on_error) throw;
      // The stream cannot be read past this point: what was decoded of the record becomes a
      // rejected document, the rest of the file is reported as unread.
      dead_ = true;
      ++stream_errors;
      uint64_t size = file_size_or_zero(path_);
      unread_bytes += size > in_.position() ? size - in_.position() : 0;
      std::string where = cat(path_, " record ", records_ + 1);
      errors.push_back({where, cat(e.what(), " (the rest of the file is unread)")});
      uint64_t partial = record_end() - record_start_;
      if (partial == 0) return false;
      reject_doc(doc, where, partial, "");
      reject = "stream_error";
      return true;
    }
  }
  uint64_t position() const override { return in_.position(); }

 private:
  void reject_doc(Doc& doc, const std::string& where, uint64_t bytes, const std::string& raw) {
    doc = Doc();
    doc.source = where;
    doc.id = where;
    doc.input_bytes = static_cast<int64_t>(bytes);
    doc.record = Json::object();
    doc.record["id_derived"] = true;
    if (!raw.empty()) doc.record["raw"] = preview(raw);
  }

  // The next non-blank line and the offset where the record it starts begins (after the
  // previous record's trailing blank lines, which belong to that record).
  bool header_line(std::string& line, uint64_t& lineno) {
    if (has_pending_) {
      has_pending_ = false;
      line = std::move(pending_);
      lineno = pending_lineno_;
      record_start_ = pending_at_;
      return true;
    }
    record_start_ = in_.consumed();
    bool too_long;
    do {
      if (!in_.next(line, too_long)) return false;
    } while (trim_view(line).empty());
    lineno = in_.line_number();
    return true;
  }
  // Reads on to the first line for which stop(line) holds and keeps it for the next record.
  template <class Stop>
  void read_until(Stop stop) {
    std::string line;
    bool too_long;
    for (;;) {
      uint64_t at = in_.consumed();
      if (!in_.next(line, too_long)) return;
      if (stop(line, too_long)) {
        pending_ = std::move(line);
        pending_at_ = at;
        pending_lineno_ = in_.line_number();
        has_pending_ = true;
        return;
      }
    }
  }
  // Where the current record ends: before a header line already read for the next one.
  uint64_t record_end() const { return has_pending_ ? pending_at_ : in_.consumed(); }
  void end_of_record() {
    read_until([](const std::string& l, bool) { return !trim_view(l).empty(); });
  }
  void resync() {
    read_until(
        [](const std::string& l, bool too_long) { return !too_long && starts_with(l, "WARC/"); });
  }

  bool next_record(Doc& doc, std::string& reject) {
    for (;;) {
      std::string line;
      uint64_t lineno = 0;
      if (!header_line(line, lineno)) return false;
      ++records_;
      std::string where = cat(path_, ":", lineno);
      auto bad = [&](const char* why, const std::string& msg, const std::string& raw) {
        if (opt_.fail_on_error) fail(where, ": ", msg);
        errors.push_back({where, msg});
        reject_doc(doc, where, record_end() - record_start_, raw);
        reject = why;
        return true;
      };
      if (!starts_with(line, "WARC/")) {
        resync();
        return bad("not_a_warc_record",
                   cat("expected a WARC record header, got '", line.substr(0, 40), "': skipped ",
                       record_end() - record_start_, " bytes to the next record"),
                   line);
      }
      std::string type, uri, date, rid, content_type, length_text;
      bool has_length = false, too_long;
      for (;;) {
        if (!in_.next(line, too_long))
          return bad("truncated_record", "truncated WARC header (the file ends inside it)", "");
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) break;
        size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string key = ascii_lower(trim_view(std::string_view(line).substr(0, colon)));
        std::string val(trim_view(std::string_view(line).substr(colon + 1)));
        if (key == "warc-type")
          type = val;
        else if (key == "warc-target-uri")
          uri = val;
        else if (key == "warc-date")
          date = val;
        else if (key == "warc-record-id")
          rid = val;
        else if (key == "content-type")
          content_type = val;
        else if (key == "content-length") {
          length_text = val;
          has_length = true;
        }
      }
      int64_t length = 0;
      if (!parse_length(length_text, length)) {
        resync();
        return bad("bad_record_header",
                   cat(has_length ? cat("Content-Length '", length_text.substr(0, 40),
                                        "' is not a byte count")
                                  : std::string("WARC record without Content-Length"),
                       ": skipped ", record_end() - record_start_, " bytes to the next record"),
                   "");
      }
      const uint64_t claimed = static_cast<uint64_t>(length);
      const bool is_doc = type == "response" || type == "conversion" || type == "resource";
      // A payload is held only when it may become a document; a lying Content-Length costs
      // reading to the end of the file, never memory.
      std::string payload;
      const bool hold = is_doc && claimed <= opt_.max_doc_bytes;
      uint64_t got =
          hold ? in_.read_exact(payload, static_cast<size_t>(claimed)) : in_.skip(claimed);
      if (got < claimed)
        return bad("truncated_record",
                   cat("truncated WARC record: Content-Length ", claimed, " but only ", got,
                       " bytes before the end of the file"),
                   "");
      end_of_record();
      const uint64_t bytes = record_end() - record_start_;
      if (!is_doc) {
        ++non_document_records;
        non_document_bytes += static_cast<int64_t>(bytes);
        continue;
      }
      doc = Doc();
      doc.source = where;
      doc.id = rid.empty() ? where : rid;
      doc.input_bytes = static_cast<int64_t>(bytes);
      doc.record = Json::object();
      if (!uri.empty()) doc.record["url"] = uri;
      if (!date.empty()) doc.record["warc_date"] = date;
      reject.clear();
      if (!hold) {
        reject = "document_too_large";
        return true;
      }
      std::string body_type;
      if (type == "response" && starts_with(content_type, "application/http")) {
        size_t end = payload.find("\r\n\r\n");
        size_t skip = 4;
        if (end == std::string::npos) {
          end = payload.find("\n\n");
          skip = 2;
        }
        std::string headers = ascii_lower(payload.substr(0, end));
        size_t ct = headers.find("\ncontent-type:");
        if (ct != std::string::npos) {
          size_t eol = headers.find('\n', ct + 1);
          body_type = std::string(trim_view(std::string_view(headers).substr(
              ct + 14, (eol == std::string::npos ? headers.size() : eol) - ct - 14)));
        }
        payload = end == std::string::npos ? std::string() : payload.substr(end + skip);
      } else {
        body_type = ascii_lower(content_type);
      }
      if (body_type.empty()) body_type = "text/html";
      doc.record["content_type"] = body_type.substr(0, body_type.find(';'));
      if (!starts_with(body_type, "text/") && body_type.find("html") == std::string::npos) {
        reject = "unsupported_content_type";
        return true;
      }
      if (payload.size() > opt_.max_doc_bytes) {
        reject = "document_too_large";
        return true;
      }
      doc.text = std::move(payload);
      return true;
    }
  }

  std::string path_;
  ReaderOptions opt_;
  LineReader in_;
  int64_t records_ = 0;
  uint64_t record_start_ = 0;  // in_.consumed() where the current record began
  std::string pending_;        // a header line read while finding the end of the last record
  uint64_t pending_at_ = 0, pending_lineno_ = 0;
  bool has_pending_ = false, dead_ = false;
};

// Reads the files of a shard one after another.
class MultiFileReader : public DocReader {
 public:
  MultiFileReader(const InputShard& shard, const ReaderOptions& opt) : shard_(shard), opt_(opt) {}
  bool next(Doc& doc, std::string& reject) override {
    for (;;) {
      if (!cur_) {
        if (i_ >= shard_.files.size()) return false;
        const std::string& f = shard_.files[i_++];
        if (opt_.format == "warc")
          cur_ = std::make_unique<WarcReader>(f, opt_);
        else
          cur_ = std::make_unique<JsonlReader>(f, opt_);
      }
      bool ok = cur_->next(doc, reject);
      for (auto& e : cur_->errors) errors.push_back(e);
      cur_->errors.clear();
      unread_bytes += std::exchange(cur_->unread_bytes, 0);
      stream_errors += std::exchange(cur_->stream_errors, 0);
      non_document_records += std::exchange(cur_->non_document_records, 0);
      non_document_bytes += std::exchange(cur_->non_document_bytes, 0);
      if (ok) return true;
      done_ += cur_->position();
      cur_.reset();
    }
  }
  uint64_t position() const override { return done_ + (cur_ ? cur_->position() : 0); }

 private:
  InputShard shard_;
  ReaderOptions opt_;
  size_t i_ = 0;
  uint64_t done_ = 0;
  std::unique_ptr<DocReader> cur_;
};

}  // namespace

std::unique_ptr<DocReader> open_reader(const InputShard& shard, const ReaderOptions& opt) {
  if (opt.format == "jsonl" || opt.format == "warc")
    return std::make_unique<MultiFileReader>(shard, opt);
  if (opt.format == "text" || opt.format == "html")
    return std::make_unique<FileDocReader>(shard, opt);
  fail("unknown input format '", opt.format, "' (expected jsonl, text, html or warc)");
}

}  // namespace loom::curate
