#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "data/chat_tokens.h"
#include "data/indexed_dataset.h"
#include "data/line_reader.h"
#include "data/tokenize_job.h"
#include "temp_dir.h"

using namespace loom;
using namespace loom::data;

namespace {

const std::string kTok = std::string(LOOM_DATA_FIXTURES) + "/tokenizers";

std::string work_dir(const std::string& name) {
  std::string d = loom::test::this_test_dir() + "/" + name;
  remove_all(d);
  make_dirs(d);
  return d;
}

// Runs the CLI; returns its exit code, with stdout/stderr captured into *out / *err.
int run_cli(const std::string& args, std::string* out = nullptr, std::string* err = nullptr,
            const std::string& stdin_text = "") {
  // One folder per test: CTest may run this binary's tests as parallel processes.
  std::string dir = loom::test::this_test_dir() + "/io";
  make_dirs(dir);
  write_file_atomic(dir + "/stdin.txt", stdin_text);
  std::string cmd = std::string(LOOM_DATA_CLI) + " " + args + " < " + dir + "/stdin.txt > " + dir +
                    "/stdout.txt 2> " + dir + "/stderr.txt";
  int rc = std::system(cmd.c_str());
  if (out) *out = read_file(dir + "/stdout.txt");
  if (err) *err = read_file(dir + "/stderr.txt");
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

const BpeTokenizer& gpt2() {
  static BpeTokenizer t = load_gpt2_tokenizer(kTok + "/gpt2");
  return t;
}

std::string jsonl_line(const std::string& text) {
  std::string s = "{\"text\": ";
  json_escape(s, text);
  return s + ", \"meta\": 1}\n";
}

// Lines 1..8: good, bad JSON, good, missing field, invalid UTF-8, blank, good (special),
// non-string.
struct Input {
  std::string path;
  std::vector<std::string> good;
};
Input mixed_input(const std::string& dir) {
  Input in;
  in.good = {"Hello world", "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87", "end<|endoftext|>x"};
  std::string s = jsonl_line(in.good[0]);
  s += "{\"text\": \"unterminated\n";
  s += jsonl_line(in.good[1]);
  s += "{\"body\": \"no text field\"}\n";
  s += "{\"text\": \"bad \xff byte\"}\n";
  s += "\n";
  s += jsonl_line(in.good[2]);
  s += "{\"text\": 42}\n";
  in.path = dir + "/mixed.jsonl";
  write_file_atomic(in.path, s);
  return in;
}

std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> names;
  for (auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST(TokenizeCli, SkipModeWritesGoodDocumentsAndReportsBadLines) {
  std::string dir = work_dir("skip");
  Input in = mixed_input(dir);
  std::string out, err;
  int rc = run_cli("tokenize --input " + in.path + " --tokenizer gpt2:" + kTok + "/gpt2 --out " +
                       dir + "/out/corpus --append-eod --workers 2",
                   &out, &err);
  ASSERT_EQ(rc, 0) << err;
  for (const char* where : {"mixed.jsonl:2: bad JSON", "mixed.jsonl:4: missing field 'text'",
                            "mixed.jsonl:5: field 'text' is not valid UTF-8",
                            "mixed.jsonl:8: field 'text' is not a string"})
    EXPECT_NE(err.find(where), std::string::npos) << where << "\n" << err;
  EXPECT_NE(out.find("4 lines skipped"), std::string::npos) << out;
  IndexedDataset ds(dir + "/out/corpus");
  EXPECT_EQ(ds.dtype(), TokenDType::UInt16);
  ASSERT_EQ(ds.num_documents(), 3);
  for (size_t k = 0; k < in.good.size(); ++k) {
    auto expect = gpt2().encode(in.good[k]);
    expect.push_back(50256);
    EXPECT_EQ(ds.document(int64_t(k)), expect);
  }
  EXPECT_EQ(dir_entries(dir + "/out"), (std::vector<std::string>{"corpus.bin", "corpus.idx"}));
}

TEST(TokenizeCli, FailModeStopsAtFirstBadLineAndLeavesNoOutput) {
  std::string dir = work_dir("fail");
  Input in = mixed_input(dir);
  make_dirs(dir + "/out");
  std::string err;
  int rc = run_cli("tokenize --input " + in.path + " --tokenizer " + kTok + "/gpt2 --out " + dir +
                       "/out/corpus --on-error fail",
                   nullptr, &err);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("mixed.jsonl:2: bad JSON"), std::string::npos) << err;
  EXPECT_TRUE(dir_entries(dir + "/out").empty());
  EXPECT_NE(run_cli("tokenize --input " + in.path + " --tokenizer nowhere --out " + dir + "/x"), 0);
  EXPECT_NE(run_cli("tokenize --input " + dir + "/missing.jsonl --tokenizer " + kTok +
                    "/gpt2 --out " + dir + "/x"),
            0);
}

TEST(TokenizeJob, OutputDoesNotDependOnWorkersOrBlockSize) {
  std::string dir = work_dir("workers");
  std::string a, b;
  for (int i = 0; i < 400; ++i) a += jsonl_line("document " + std::to_string(i) + " about tokens.");
  for (int i = 0; i < 100; ++i) b += jsonl_line(std::string(size_t(i), 'x') + " second file");
  write_file_atomic(dir + "/a.jsonl", a);
  write_file_atomic(dir + "/b.jsonl", b);
  TokenizeOptions opt;
  opt.inputs = {dir + "/a.jsonl", dir + "/b.jsonl"};
  opt.append_eod = true;
  opt.progress = false;
  opt.output_prefix = dir + "/one";
  opt.workers = 1;
  TokenizeStats s1 = tokenize_jsonl(gpt2(), opt);
  opt.output_prefix = dir + "/many";
  opt.workers = 3;
  opt.block_bytes = 100;  // many blocks, finishing out of order
  TokenizeStats s2 = tokenize_jsonl(gpt2(), opt);
  EXPECT_EQ(s1.documents, 500);
  EXPECT_EQ(s2.tokens, s1.tokens);
  EXPECT_EQ(read_file(dir + "/one.bin"), read_file(dir + "/many.bin"));
  EXPECT_EQ(read_file(dir + "/one.idx"), read_file(dir + "/many.idx"));
}

TEST(TokenizeJob, LargeVocabularyWritesInt32) {
  std::string dir = work_dir("int32");
  write_file_atomic(dir + "/a.jsonl", jsonl_line("hello <|endofprompt|> world"));
  auto tok = load_tokenizer("tiktoken:" + kTok + "/cl100k_base.tiktoken");
  TokenizeOptions opt;
  opt.inputs = {dir + "/a.jsonl"};
  opt.output_prefix = dir + "/out";
  opt.progress = false;
  tokenize_jsonl(*tok, opt);
  IndexedDataset ds(dir + "/out");
  EXPECT_EQ(ds.dtype(), TokenDType::Int32);
  EXPECT_EQ(ds.document(0), tok->encode("hello <|endofprompt|> world"));
}

TEST(TokenizerCli, EncodeDecodeAndTrain) {
  std::string out;
  const std::string text = "Hello, world! <|endoftext|> I'm here.";
  ASSERT_EQ(run_cli("tokenizer encode --vocab " + kTok + "/gpt2", &out, nullptr, text), 0);
  Json ids = Json::parse(out, "stdout");
  std::vector<int32_t> got;
  for (auto& v : ids.as_array()) got.push_back(int32_t(v.as_int()));
  EXPECT_EQ(got, gpt2().encode(text));
  ASSERT_EQ(run_cli("tokenizer decode --vocab " + kTok + "/gpt2.tiktoken", &out, nullptr,
                    Json(ids).dump()),
            0);
  EXPECT_EQ(out, text);

  std::string dir = work_dir("train");
  std::string corpus;
  for (int i = 0; i < 200; ++i)
    corpus += jsonl_line("the loom trains the tokens " + std::to_string(i % 13));
  write_file_atomic(dir + "/c.jsonl", corpus);
  std::string err;
  ASSERT_EQ(run_cli("tokenizer train --input " + dir + "/c.jsonl --vocab-size 280 --out " + dir +
                        "/vocab --threads 2",
                    &out, &err),
            0)
      << err;
  auto tok = load_tokenizer("loom:" + dir + "/vocab");
  EXPECT_EQ(tok->vocab_size(), 280);
  ASSERT_EQ(run_cli("tokenize --input " + dir + "/c.jsonl --tokenizer loom:" + dir +
                        "/vocab --out " + dir + "/tok --append-eod",
                    &out, &err),
            0)
      << err;
  IndexedDataset ds(dir + "/tok");
  ASSERT_EQ(ds.num_documents(), 200);
  auto doc = ds.document(5);
  EXPECT_EQ(doc.back(), 279);
  doc.pop_back();
  EXPECT_EQ(tok->decode(doc), "the loom trains the tokens 5");
}

// A SentencePiece-style tokenizer.json (Llama 2's normalizer, decoder and <s> post-processor)
// through `tokenizer info|encode|decode` and `tokenize`.
TEST(TokenizerCli, SentencePieceStyleTokenizerJson) {
  const std::string dir = work_dir("spm");
  write_file_atomic(dir + "/tokenizer.json", R"({
    "added_tokens": [
      {"id": 0, "content": "<unk>", "special": true, "lstrip": false, "rstrip": false,
       "single_word": false, "normalized": false},
      {"id": 1, "content": "<s>", "special": true, "lstrip": false, "rstrip": false,
       "single_word": false, "normalized": false}],
    "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]},
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": false,
      "vocab": {"<unk>": 0, "<s>": 1, "▁": 2, "a": 3, "b": 4, "▁a": 5, "ab": 6, "▁ab": 7},
      "merges": ["▁ a", "a b", "▁a b"]}})");
  std::string out, err;
  ASSERT_EQ(run_cli("tokenizer info --vocab hf:" + dir, &out, &err), 0) << err;
  const Json info = Json::parse(out, "stdout");
  EXPECT_EQ(info.at("pretokenizer").as_string(), "tokenizer.json");
  EXPECT_FALSE(info.at("byte_level").as_bool());
  EXPECT_EQ(info.at("add_special_tokens").at("before").dump(), "[1]");
  ASSERT_EQ(run_cli("tokenizer encode --vocab " + dir, &out, &err, "ab a"), 0) << err;
  EXPECT_EQ(out, "[7,5]\n");
  ASSERT_EQ(run_cli("tokenizer encode --add-special-tokens --vocab " + dir, &out, &err, "ab c"), 0)
      << err;
  EXPECT_EQ(out, "[1,7,2,0]\n");  // c is not in the vocabulary: <unk>
  ASSERT_EQ(run_cli("tokenizer decode --vocab " + dir, &out, &err, "[1,7,5]"), 0) << err;
  EXPECT_EQ(out, "<s> ab a");
  ASSERT_EQ(run_cli("tokenizer decode --vocab " + dir, &out, &err, "[7,5]"), 0) << err;
  EXPECT_EQ(out, "ab a");
  write_file_atomic(dir + "/c.jsonl", jsonl_line("ab ab") + jsonl_line("a"));
  ASSERT_EQ(run_cli("tokenize --input " + dir + "/c.jsonl --tokenizer hf:" + dir + " --out " + dir +
                        "/tok",
                    &out, &err),
            0)
      << err;
  IndexedDataset ds(dir + "/tok");
  ASSERT_EQ(ds.num_documents(), 2);
  EXPECT_EQ(ds.document(0).size(), 2u);
}

// A model's own Jinja template (hf:PATH) renders chat lines with tools into token files.
TEST(TokenizeCli, ChatWithAModelsJinjaTemplate) {
  const std::string d = work_dir("chat_jinja");
  save_loom_tokenizer(byte_chatml_tokenizer(), d + "/tok");
  const std::string line =
      R"({"tools": [{"type": "function", "function": {"name": "add"}}], "messages": [)"
      R"({"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "", "tool_calls": )"
      R"([{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]}, )"
      R"({"role": "tool", "content": "4"}, {"role": "assistant", "content": "4"}]})";
  write_file_atomic(d + "/chat.jsonl", line + "\n");
  const std::string tpl =
      "hf:" + std::string(LOOM_DATA_FIXTURES) + "/../chat_templates/chatml_generation";
  std::string out, err;
  ASSERT_EQ(run_cli("tokenize --chat --input " + d + "/chat.jsonl --tokenizer loom:" + d +
                        "/tok --chat-template " + tpl + " --out " + d + "/chat",
                    &out, &err),
            0)
      << err;
  const BpeTokenizer tok = byte_chatml_tokenizer();
  const ChatExample want = parse_chat_example(Json::parse(line), ChatTemplate(tpl, tok), "line");
  const ChatExample got = ChatTokenFile(d + "/chat").example(0);
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.mask, want.mask);
  EXPECT_EQ(
      tok.decode(got.ids),
      "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<tool_call>add(a=2, b=2)"
      "</"
      "tool_call><|im_end|>\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n");
  // A template the subset does not support is refused naming the construct and the line.
  make_dirs(d + "/bad");
  write_file_atomic(d + "/bad/chat_template.jinja", "{{ messages }}\n{% extends 'base' %}");
  EXPECT_EQ(run_cli("tokenize --chat --input " + d + "/chat.jsonl --tokenizer loom:" + d +
                        "/tok --chat-template hf:" + d + "/bad --out " + d + "/bad/chat",
                    &out, &err),
            1);
  EXPECT_NE(err.find(d + "/bad/chat_template.jinja:2: the 'extends' tag is not supported"),
            std::string::npos)
      << err;
}

TEST(TokenizeJob, StaleTemporariesOfAKilledRunAreRemoved) {
  loom::test::TempDir dir("tokenize_stale");
  write_file_atomic(dir / "in.jsonl", jsonl_line("Hello world") + jsonl_line("again"));
  // A pid that is certainly gone: a child that has exited and been reaped.
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  std::string stale_bin = dir / ("out.bin.tmp." + std::to_string(dead));
  std::string stale_idx = dir / ("out.idx.tmp." + std::to_string(dead));
  std::string live = dir / ("out.bin.tmp." + std::to_string(::getppid()));  // a running process
  std::string other = dir / ("other.bin.tmp." + std::to_string(dead));      // another output
  for (auto* f : {&stale_bin, &stale_idx, &live, &other}) write_file_atomic(*f, "partial");
  TokenizeOptions opt;
  opt.inputs = {dir / "in.jsonl"};
  opt.output_prefix = dir / "out";
  opt.progress = false;
  tokenize_jsonl(gpt2(), opt);
  EXPECT_FALSE(file_exists(stale_bin));
  EXPECT_FALSE(file_exists(stale_idx));
  EXPECT_TRUE(file_exists(live));
  EXPECT_TRUE(file_exists(other));
  EXPECT_TRUE(file_exists(dir / "out.bin"));
  EXPECT_TRUE(file_exists(dir / "out.idx"));
}

// Issue 17: one line is held whole, so its length is bounded and the error names file and line
// (before, a file without newlines was held whole however large, and each 1 MiB block read
// searched the whole carried line again: quadratic time).
TEST(LineBlockReader, LineLongerThanTheBoundIsAnErrorNamingFileAndLine) {
  std::string dir = work_dir("long_line");
  const std::string path = dir + "/in.jsonl";
  write_file_atomic(path, "short\n" + std::string(5000, 'x') + "\nafter\n");
  LineBlockReader bounded({path}, /*block_bytes=*/256, /*max_line_bytes=*/1024);
  LineBlock b;
  std::string e;
  try {
    while (bounded.next(b)) {
    }
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find(path + ":2: line longer than 1024 bytes (too_large)"), std::string::npos) << e;
  // Within the bound the same file reads whole, every line once and in order.
  LineBlockReader roomy({path}, 256, 8192);
  std::vector<std::string> lines;
  while (roomy.next(b))
    for_each_line(b, [&](std::string_view l, int64_t) { lines.emplace_back(l); });
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "short");
  EXPECT_EQ(lines[1].size(), 5000u);
  EXPECT_EQ(lines[2], "after");
}
