// vqa_project: what a finished run would do on N ranks and another fabric,
// from the step profile its diagnosis.json holds (projection.h has the model).
//
//   build/vqa_project runs/quickstart/diagnosis.json --fabric ib-ndr
//   build/vqa_project runs/quickstart/diagnosis.json --fabric 0.117:50 --max-ranks 8 --json
//
// The rows assume the run's per-rank batch and phases; gradient buckets are re-cut
// to the size vqa_train's --bucket-mb 0 picks on that fabric (--bucket-mb).
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "train/projection.h"  // fabric_from_text, project_scaling, projection_lines
#include "util/options.h"      // OptionTable

namespace {

struct ProjectOptions {
  std::string diagnosis;
  std::string fabric = "ib-ndr";
  int max_ranks = 1024;
  double bucket_mb = 0.0;
  bool json = false;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "vqa_project: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  ProjectOptions options;
  vqa::util::OptionTable table("vqa_project options");
  table
      .add_required("diagnosis", &options.diagnosis, "a run's diagnosis.json (vqa_train writes it)")
      .add("fabric", &options.fabric,
           "a preset (nvlink-h100, ib-ndr, ib-hdr, 100gbe, 25gbe, 10gbe, 1gbe, pcie-no-p2p) "
           "or " VQA_FABRIC_TEXT_FORMAT
           ", e.g. 0.117:50 (CPU ranks: the "
           "allreduce's CPU microseconds per MB, and the bus bandwidth while backward computes "
           "on the same cores, as jobs/bench_projection.sh measures them)")
      .add("max-ranks", &options.max_ranks, "project 1, 2, 4, ... up to this many ranks (1..65536)")
      .add("bucket-mb", &options.bucket_mb,
           "re-cut the run's gradient buckets to this many MiB as sent (0: what vqa_train's "
           "--bucket-mb 0 would choose on the fabric; -1: the run's own buckets)")
      .add("json", &options.json, "print the projection as JSON instead of a table")
      .positional("diagnosis", 1);
  try {
    if (!table.parse(argc, argv)) {
      table.print_help(stdout, "usage: vqa_project DIAGNOSIS_JSON [options]");
      return 0;
    }
  } catch (const vqa::util::OptionError& e) {
    return fail(std::string(e.what()) + " (see --help)");
  }
  const auto fabric = vqa::train::fabric_from_text(options.fabric);
  if (!fabric)
    return fail("--fabric: no preset or " VQA_FABRIC_TEXT_FORMAT " '" + options.fabric + "'");
  if (!(options.bucket_mb >= -1) || options.bucket_mb > 1e6) {
    return fail("--bucket-mb must be -1, 0 or a size up to 1e6 MiB");
  }
  if (options.max_ranks < 1 || options.max_ranks > 65536) {
    return fail("--max-ranks must be in [1, 65536], got " + std::to_string(options.max_ranks));
  }
  std::ifstream in(options.diagnosis);
  if (!in) return fail(options.diagnosis + ": cannot be read");
  try {
    const auto diagnosis = nlohmann::json::parse(in);
    if (!diagnosis.contains("projection")) {
      return fail(options.diagnosis + ": no 'projection' (written by vqa_train with phase timers)");
    }
    auto profile = vqa::train::step_profile_from_json(diagnosis.at("projection").at("profile"));
    if (options.bucket_mb >= 0) {
      const double bytes = options.bucket_mb > 0 ? options.bucket_mb * 1024 * 1024
                                                 : vqa::train::auto_bucket_bytes(*fabric);
      profile = vqa::train::profile_with_bucket_bytes(profile, bytes);
    }
    const auto rows = vqa::train::project_scaling(profile, *fabric, options.max_ranks);
    if (options.json) {
      std::printf("%s\n", vqa::train::projection_json(profile, *fabric, rows).dump(2).c_str());
    } else {
      for (const auto& line : vqa::train::projection_lines(*fabric, rows)) {
        std::printf("%s\n", line.c_str());
      }
    }
  } catch (const std::exception& e) {
    return fail(options.diagnosis + ": " + e.what());
  }
  return 0;
}
