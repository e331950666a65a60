// `loom curate`: runs a curation pipeline (config file of stages) over input shards, or trains
// the fastText-style quality classifier its quality_classifier stage uses.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "cli/command.h"
#include "cli/options.h"
#include "comm/communicator.h"
#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "curate/classifier.h"
#include "curate/input.h"
#include "curate/pipeline.h"

namespace loom::cli {

static int curate_run(const Args& args) {
  Options o(
      "loom curate --config FILE [--set key=value ...] [--workers N] [--restart]",
      "Runs the curation pipeline described by FILE (see docs/curate.md): readers, cleaning,\n"
      "filters, PII redaction, dedup, language ID, quality scoring. Writes kept and rejected\n"
      "JSONL and a report to output.dir; rerunning resumes, skipping finished shards.");
  o.value("config", "", "pipeline config (TOML subset with [input], [output], [stage.N])", true)
      .multi("set", "override a config key, e.g. --set stage.2.min_doc_words=100")
      .value("workers", "0", "worker threads (0: pipeline.workers from the config, else all cores)")
      .flag("restart", "discard a previous (partial) run in output.dir and start over")
      .value("progress", "5", "seconds between progress lines (0: none)");
  if (!o.parse(args)) return 0;
  Config cfg = Config::load(o.get("config"));
  for (auto& s : o.all("set")) cfg.set_override(s);
  curate::Pipeline p(cfg);
  curate::RunOptions ro;
  ro.workers = o.get_int32("workers", 0, kMaxThreads);
  ro.restart = o.has("restart");
  ro.progress_interval = o.get_double("progress");
  if (const char* c = std::getenv("LOOM_CURATE_CRASH_AFTER_DOCS"))
    ro.crash_after_docs = std::atoll(c);
  // Under a launcher the shards are divided among the ranks (docs/curate.md). A rank that
  // fails ends the whole job, naming itself, instead of leaving the others in a collective.
  comm::Communicator& world = comm::world();
  Json report;
  if (world.size() > 1) {
    try {
      report = p.run(ro);
    } catch (const std::exception& e) {
      comm::abort_job(e.what());
    }
  } else {
    report = p.run(ro);
  }
  if (world.rank() == 0) {
    std::fputs(curate::report_text(report).c_str(), stdout);
    std::printf("\nreport: %s/report.json, report.txt, report.html\n", p.out_dir().c_str());
  }
  return 0;
}

static int curate_train(const Args& args) {
  Options o("loom curate train-classifier --input FILE.jsonl --output MODEL [options]",
            "Trains a fastText-style classifier (hashed word + bigram features, averaged\n"
            "embeddings, softmax, SGD) on labelled JSONL and saves it for the quality_classifier\n"
            "stage. Prints the loss per epoch and accuracy on a held-out fraction.");
  o.value("input", "", "labelled JSONL: one object per line with text and label fields", true)
      .value("output", "", "model file to write", true)
      .value("text-field", "text", "field holding the text")
      .value("label-field", "label", "field holding the label (string)")
      .value("dim", "16", "embedding dimension")
      .value("buckets", "262144", "hash buckets for word and bigram features")
      .value("epochs", "5", "passes over the training data")
      .value("lr", "0.5", "initial learning rate (decays linearly to 0)")
      .value("valid-fraction", "0.1", "fraction held out to report accuracy")
      .value("seed", "1", "seed for initialisation, shuffling and the held-out split");
  if (!o.parse(args)) return 0;
  // Every number is checked before the input is read: a held-out fraction past 1 cut the
  // examples before their start (SIGSEGV), a negative one became a huge size_t, and
  // --dim x --buckets sized a table past memory (std::bad_alloc as an "internal error").
  const double valid_fraction = o.get_double("valid-fraction");
  LOOM_CHECK(valid_fraction >= 0 && valid_fraction < 1,
             "--valid-fraction = ", o.get("valid-fraction"), " is out of range [0, 1)");
  curate::ClassifierOptions co;
  co.dim = o.get_int32("dim", 1, 1024);
  co.buckets = o.get_int32("buckets", 1, 1 << 26);
  co.epochs = o.get_int32("epochs", 1, 1000000);
  co.lr = o.get_double("lr");
  LOOM_CHECK(co.lr > 0 && co.lr <= 1000, "--lr = ", o.get("lr"), " is out of range (0, 1000]");
  co.seed = static_cast<uint64_t>(o.get_int("seed"));
  constexpr int64_t kMaxTable = int64_t{1} << 28;  // floats: 1 GiB
  LOOM_CHECK(int64_t{co.dim} * co.buckets <= kMaxTable, "--dim x --buckets = ", co.dim, " x ",
             co.buckets, " floats is past the table limit of ", kMaxTable, " (1 GiB)");
  std::string path = o.get("input");
  std::vector<curate::LabelledText> data;
  curate::LineReader lines(curate::open_source(path), 64u << 20);
  std::string line;
  bool too_long = false;
  while (lines.next(line, too_long)) {
    std::string where = cat(path, ":", lines.line_number());
    LOOM_CHECK(!too_long, where, ": line longer than 64 MiB");
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json j = Json::parse(line, where);
    LOOM_CHECK(j.is_object(), where, ": expected a JSON object");
    LOOM_CHECK(j.contains(o.get("text-field")) && j.at(o.get("text-field")).is_string(), where,
               ": no string field '", o.get("text-field"), "'");
    LOOM_CHECK(j.contains(o.get("label-field")), where, ": no field '", o.get("label-field"), "'");
    const Json& l = j.at(o.get("label-field"));
    data.push_back(
        {j.at(o.get("text-field")).as_string(), l.is_string() ? l.as_string() : l.dump()});
  }
  std::mt19937_64 rng(co.seed);
  std::shuffle(data.begin(), data.end(), rng);
  size_t nvalid = static_cast<size_t>(valid_fraction * static_cast<double>(data.size()));
  std::vector<curate::LabelledText> valid(data.end() - static_cast<long>(nvalid), data.end());
  data.resize(data.size() - nvalid);
  log_info("train-classifier: ", data.size(), " training and ", valid.size(), " held-out examples");
  auto model = curate::TextClassifier::train(
      data, co, [](const std::string& s) { log_info("train-classifier: ", s); });
  std::printf("labels:");
  for (auto& l : model.labels()) std::printf(" %s", l.c_str());
  std::printf("\ntrain accuracy %.4f\n", model.accuracy(data));
  if (!valid.empty())
    std::printf("held-out accuracy %.4f (%zu examples)\n", model.accuracy(valid), valid.size());
  model.save(o.get("output"));
  std::printf("saved %s\n", o.get("output").c_str());
  return 0;
}

int run_curate(const Args& args) {
  if (!args.empty() && args[0] == "train-classifier")
    return curate_train(Args(args.begin() + 1, args.end()));
  if (!args.empty() && args[0] == "report") {
    Options o("loom curate report OUTPUT_DIR", "Prints the summary of a finished curation run.");
    o.positional("dir", "the pipeline's output.dir");
    if (!o.parse(Args(args.begin() + 1, args.end()))) return 0;
    std::fputs(read_file(o.get("dir") + "/report.txt").c_str(), stdout);
    return 0;
  }
  return curate_run(args);
}

}  // namespace loom::cli
