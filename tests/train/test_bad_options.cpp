// Wrong values on the command line of every program, under `mpirun -np 2`
// (vqa_prep and vqa_project, serial tools, alone; a numeric option's second
// and later wrong values in a single process, below): every one ends within
// seconds with exit status 2 and an error line that names the option and
// the value, never a signal, a core dump or std::terminate, and vqa_train
// leaves nothing in --out that a later --resume would trip on (at most an
// empty folder).
//
// The table: the five rows found by hand (--backend foo, --lr nan, an
// unwritable --timeline, --weight-decay -1, --threads -3), then every
// numeric option of vqa_train at a negative value, NaN, a huge value and
// zero where zero is not allowed, every mode at an unknown word, every path
// option at a place that cannot be written; and rows for vqa_prep,
// vqa_loader_bench, vqa_allreduce_bench and vqa_project. Beside it, a check
// that vqa_train --help keeps the test-only options apart from the user's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "process.h"  // run_process, mpirun_prefix, make_temp_dir, contains

namespace fs = std::filesystem;
using vqa::testing::contains;
using vqa::testing::run_process;

namespace {

struct Case {
  std::string program;              // the binary, with any fixed arguments before the bad one
  std::string bad;                  // the wrong option and value as typed
  std::string option;               // what the message must name ("--lr")
  std::vector<std::string> values;  // the message names one of these (as typed, or as printed)
  bool mpirun = true;
};

std::string directory() {
  static const std::string path = vqa::testing::make_temp_dir("bad-options");
  return path;
}

std::string dataset() {
  static const std::string path = [] {
    const std::string file = directory() + "/synth.h5";
    const auto made = run_process(
        std::string(VQA_PREP) + " synth -o " + file + " --train-questions 64 --test-questions 16",
        120);
    EXPECT_EQ(made.exit_code, 0) << made.output;
    return file;
  }();
  return path;
}

// How vqa_train prints a typed number back ("1e13" -> "1e+13", "-5" -> "-5").
std::string printed(const std::string& typed) {
  try {
    size_t used = 0;
    const double value = std::stod(typed, &used);
    if (used != typed.size() || std::isnan(value)) return typed;
    char text[64];
    std::snprintf(text, sizeof(text), "%.10g", value);
    return text;
  } catch (const std::exception&) {
    return typed;
  }
}

struct Numeric {
  const char* name;
  bool zero_invalid;
};

// Every numeric option of vqa_train.
const std::vector<Numeric> kTrainNumbers = {
    {"prefetch-depth", true},
    {"hidden", false},
    {"heads", false},
    {"ffn", false},
    {"vision-layers", false},
    {"text-layers", false},
    {"fusion-layers", false},
    {"patch-size", false},
    {"dropout", false},
    {"epochs", true},
    {"global-batch", true},
    {"batch-per-rank", true},
    {"lr", true},
    {"lr-fusion-multiplier", true},
    {"lr-head-multiplier", true},
    {"weight-decay", false},
    {"warmup-ratio", false},
    {"grad-clip", false},
    {"threads", false},
    {"bucket-mb", false},
    {"loss-scale-interval", true},
    {"comm-timeout", false},
    {"eval-every", false},
    {"save-every", false},
    {"keep-checkpoints", false},
    {"max-steps-per-epoch", false},
    {"log-every-steps", false},
    {"timeline-first-step", false},
    {"timeline-steps", true},
    {"predictions-top", true},
    {"crop-scale-min", true},
    {"crop-scale-max", true},
    {"crop-ratio-min", true},
    {"crop-ratio-max", true},
    {"augment-threads", false},
    {"test-nan-step", false},
    {"test-slow-rank", false},
    {"test-slow-ms", false},
    {"test-data-delay-ms", false},
};

std::vector<Case> cases() {
  // No other option: each row's option appears once on its command line.
  const std::string train =
      std::string(VQA_TRAIN) + " --train-data " + dataset() + " --out " + directory() + "/run";
  std::vector<Case> table = {
      {train, "--backend foo", "--backend", {"foo"}},
      {train, "--lr nan", "--lr", {"nan"}},
      {train, "--timeline /proc/x.json", "--timeline", {"/proc/x.json"}},
      {train, "--weight-decay -1", "--weight-decay", {"-1"}},
      {train, "--threads -3", "--threads", {"-3"}},
      // A prefix of an option (--epochs) is a typo, not that option.
      {train, "--epoch 2", "--epoch", {"unrecognised option '--epoch'"}},
  };
  for (const auto& [name, zero_invalid] : kTrainNumbers) {
    const std::string option = std::string("--") + name;
    std::vector<std::string> values = {"-5", "nan", "1e13"};
    if (zero_invalid) values.push_back("0");
    // Every option under mpirun -np 2 with its first wrong value, the others
    // in one process: each rank checks the same values with the same code,
    // and a run of two ranks costs twice the CPU of one (LibTorch's and Open
    // MPI's start, ~0.9 s a process) on a test of ~100 such lines.
    for (size_t i = 0; i < values.size(); ++i) {
      table.push_back(
          {train, option + " " + values[i], option, {values[i], printed(values[i])}, i == 0});
    }
  }
  for (const char* mode :
       {"device", "backend", "mpi-allreduce", "precision", "progress", "nonfinite",
        "optimizer-recipe", "augment", "preset", "packed-attention"}) {
    const std::string option = std::string("--") + mode;
    table.push_back({train, option + " bogus", option, {"bogus"}});
  }
  table.push_back({train, "--project-fabric 0:5", "--project-fabric", {"0:5"}});
  for (const char* place : {"/proc/vqa/run", "/proc/version/run"}) {
    // --out inside a file or a file system that refuses new files.
    table.push_back({std::string(VQA_TRAIN) + " --train-data " + dataset(),
                     std::string("--out ") + place,
                     "--out",
                     {place}});
  }
  table.push_back({train,
                   "--export-m3ae /proc/model.safetensors",
                   "--export-m3ae",
                   {"/proc/model.safetensors"}});
  table.push_back({train + " --eval-only --init-from x.pt",
                   "--predictions /proc/p.jsonl",
                   "--predictions",
                   {"/proc/p.jsonl"}});
  table.push_back({train, "--timeline " + directory(), "--timeline", {directory()}});
  table.push_back(
      {train, "--crop-scale-min 0.9 --crop-scale-max 0.5", "--crop-scale-min", {"0.9"}});
  table.push_back({train,
                   "--cuda-graph true --sparse-embedding-sync on",
                   "--sparse-embedding-sync",
                   {"--cuda-graph", "on"}});

  // The other programs.
  const std::string prep = std::string(VQA_PREP);
  const std::string build = fs::path(VQA_TRAIN).parent_path().string();
  for (const auto& [bad, option, value] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--image-size -5", "--image-size", "-5"},
           {"--train-questions 0", "--train-questions", "0"},
           {"--max-len nan", "--max-len", "nan"},
           {"--source-size 1e13", "--source-size", "1e13"}}) {
    table.push_back({prep + " synth -o " + directory() + "/bad.h5", bad, option, {value}, false});
  }
  table.push_back({prep + " convert --train-json a.json --test-json b.json --images i -o " +
                       directory() + "/bad.h5",
                   "--tokenizer bogus",
                   "--tokenizer",
                   {"bogus"},
                   false});
  table.push_back({prep + " convert --train-json a.json --test-json b.json --images i -o " +
                       directory() + "/bad.h5",
                   "--threads -3",
                   "--threads",
                   {"-3"},
                   false});
  table.push_back({prep + " inspect " + dataset(), "--records -1", "--records", {"-1"}, false});
  table.push_back(
      {build + "/vqa_loader_bench --data " + dataset(), "--augment bogus", "--augment", {"bogus"}});
  table.push_back(
      {build + "/vqa_loader_bench --data " + dataset(), "--batch -1", "--batch", {"-1"}});
  table.push_back({build + "/vqa_allreduce_bench", "--datatype half", "--datatype", {"half"}});
  table.push_back({build + "/vqa_allreduce_bench", "--iters 0", "--iters", {"0"}});
  table.push_back({build + "/vqa_allreduce_bench", "-e 1000G", "-e", {"1000G"}});
  // vqa_project reads a file and starts no MPI: run alone.
  table.push_back({build + "/vqa_project " + directory() + "/none.json",
                   "--max-ranks 0",
                   "--max-ranks",
                   {"0"},
                   false});
  table.push_back({build + "/vqa_project " + directory() + "/none.json",
                   "--fabric bogus",
                   "--fabric",
                   {"bogus"},
                   false});
  return table;
}

// Files a --resume auto would read: a checkpoint, its pointer, the DONE mark.
std::vector<std::string> resume_leftovers(const std::string& out) {
  std::vector<std::string> found;
  std::error_code error;
  if (!fs::exists(out, error)) return found;
  for (const auto& entry : fs::recursive_directory_iterator(out, error)) {
    const std::string name = entry.path().filename().string();
    const bool checkpoint = name.size() > 3 && name.compare(name.size() - 3, 3, ".pt") == 0;
    if (name == "DONE" || name == "latest" || checkpoint) {
      found.push_back(entry.path().string());
    }
  }
  return found;
}

TEST(BadOptions, EveryWrongValueEndsEveryRankWithExit2AndOneLineNamingIt) {
  const auto table = cases();
  // Three command lines at a time: part of each one's 2.5 s is mpirun
  // starting and tearing down (the rest, loading LibTorch, takes the cores).
  // Each of the three has its own Open MPI session folder: Open MPI 4.1
  // removes the shared top folder (ompi.HOST.UID) when its last job ends,
  // and a job starting at that moment fails ("A call to mkdir was unable to
  // create the desired directory ... File exists", exit 1), as one CI run did.
  constexpr size_t kParallel = 3;
  std::vector<std::string> session_bases;
  for (size_t slot = 0; slot < kParallel; ++slot) {
    session_bases.push_back(directory() + "/ompi-session-" + std::to_string(slot));
    fs::create_directories(session_bases.back());
  }
  std::vector<vqa::testing::ProcessResult> results(table.size());
  for (size_t first = 0; first < table.size(); first += kParallel) {
    std::vector<std::future<vqa::testing::ProcessResult>> running;
    for (size_t i = first; i < std::min(table.size(), first + kParallel); ++i) {
      const std::string command =
          "OMPI_MCA_orte_tmpdir_base=" + session_bases[i - first] + " " +
          (table[i].mpirun ? vqa::testing::mpirun_prefix(2) : std::string()) + table[i].program +
          " " + table[i].bad;
      running.push_back(
          std::async(std::launch::async, [command] { return run_process(command, 60); }));
    }
    for (size_t i = first; i < std::min(table.size(), first + kParallel); ++i) {
      results[i] = running[i - first].get();
    }
  }
  int checked = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    const Case& c = table[i];
    const auto& result = results[i];
    SCOPED_TRACE(c.program + " " + c.bad);
    EXPECT_FALSE(result.timed_out) << result.output;
    EXPECT_LT(result.seconds, 30.0) << result.output;
    EXPECT_EQ(result.exit_code, 2) << result.output;
    bool named = false;
    for (const auto& value : c.values) named = named || contains(result.output, value);
    EXPECT_TRUE(contains(result.output, c.option) && named)
        << "the message names neither the option nor the value:\n"
        << result.output;
    for (const char* crash : {"terminate called", "Signal:", "Aborted", "core dumped",
                              "Segmentation fault", "what():"}) {
      EXPECT_FALSE(contains(result.output, crash)) << crash << "\n" << result.output;
    }
    EXPECT_EQ(resume_leftovers(directory() + "/run"), std::vector<std::string>{});
    ++checked;
  }
  std::printf("%d wrong command lines: each exit 2 with a message naming option and value\n",
              checked);
  EXPECT_GT(checked, 150);
  // Nothing was left that a core dump would be: no core files in the folder.
  for (const auto& entry : fs::directory_iterator(directory())) {
    EXPECT_NE(entry.path().filename().string().rfind("core", 0), 0u) << entry.path();
  }
}

// vqa_train --help lists the test-only options (help "testing only: ...")
// apart, under their own heading after every other option, and nothing else
// there: a user reading the option table does not meet them among theirs.
TEST(Help, TestOnlyOptionsComeLastUnderTheirOwnHeading) {
  const auto help = run_process(std::string(VQA_TRAIN) + " --help", 60);
  ASSERT_EQ(help.exit_code, 0) << help.output;
  const size_t heading = help.output.find("Testing and fault injection");
  ASSERT_NE(heading, std::string::npos) << help.output;
  const std::string users = help.output.substr(0, heading);
  const std::string tests = help.output.substr(heading);
  EXPECT_FALSE(contains(users, "testing only")) << "a test-only option among the user's:\n"
                                                << users;
  size_t options = 0, test_only = 0;
  for (size_t at = tests.find("\n  --"); at != std::string::npos; at = tests.find("\n  --", at + 1))
    ++options;
  for (size_t at = tests.find("testing only"); at != std::string::npos;
       at = tests.find("testing only", at + 1))
    ++test_only;
  EXPECT_GT(options, 0u) << tests;
  EXPECT_EQ(options, test_only) << "an option that is not test-only in the testing group:\n"
                                << tests;
}

}  // namespace
