#include "train/step_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <utility>

#include "runtime/check.h"       // VQA_CHECK
#include "train/comm_setup.h"    // allreduce_bus_gbps
#include "util/printf_format.h"  // format

namespace vqa::train {

namespace {

using util::format;

// "1.25 GiB", "214.3 MiB", "1.1 MiB".
std::string bytes_text(int64_t bytes) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const double mib = static_cast<double>(bytes) / kMiB;
  return mib >= 1024.0 ? format("%.2f GiB", mib / 1024.0) : format("%.1f MiB", mib);
}

double share(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

std::string phase_key(int phase) { return phase_name(static_cast<Phase>(phase)); }

// "~1.24x" of a gain.
std::string gain_text(double gain) { return format("~%.2fx", gain); }

struct Remedy {
  std::string option;  // what to set
  double exposed_seconds = 0.0;
  double step_seconds = 0.0;
  double gain = 1.0;  // samples/s with it over samples/s now
};

// The communication-bound rule's remedies, each priced by the projection
// model at this run's measured bus bandwidth: the measured step less its
// exposed communication, plus what the model exposes with the remedy. Only
// remedies not already on and worth kMinimumGainShare are named. Returns the
// text and the list as JSON.
std::pair<std::string, nlohmann::json> communication_remedies(const EpochReport& report) {
  const RemedySettings& settings = report.settings;
  const StepProfile& profile = report.profile;
  const double step = report.step.mean;
  const double exposed = report.phases[static_cast<int>(Phase::kCommExposed)].mean;
  const bool priced = !profile.buckets.empty() && report.bus_gbps > 0;
  const Fabric measured{"measured", report.bus_gbps, 0.0, "this run's gradient allreduces"};
  const auto exposed_with = [&](const StepProfile& changed) {
    return project_step(changed, measured, report.world_size).exposed_seconds;
  };
  const auto priced_remedy = [&](std::string option, const StepProfile& changed) {
    Remedy remedy;
    remedy.option = std::move(option);
    remedy.exposed_seconds = exposed_with(changed);
    remedy.step_seconds =
        step - exposed + (changed.compute() - profile.compute()) + remedy.exposed_seconds;
    const double samples_factor =
        static_cast<double>(changed.samples_per_rank_step) /
        static_cast<double>(std::max<int64_t>(1, profile.samples_per_rank_step));
    remedy.gain = remedy.step_seconds > 0 ? samples_factor * step / remedy.step_seconds : 1.0;
    return remedy;
  };

  std::vector<Remedy> remedies;
  if (!settings.bf16_allreduce) {
    remedies.push_back(
        priced ? priced_remedy("--bf16-allreduce", profile_with_bytes_scaled(profile, 0.5))
               : Remedy{"--bf16-allreduce"});
  }
  if (priced) {
    Remedy best;
    const double wire = settings.bf16_allreduce ? 0.5 : 1.0;
    for (double mb = settings.bucket_mb / 2; mb >= 0.5; mb /= 2) {
      Remedy candidate = priced_remedy(format("--bucket-mb %g", mb),
                                       profile_with_bucket_bytes(profile, mb * 1024 * 1024 * wire));
      if (candidate.gain > best.gain) best = candidate;
    }
    if (!best.option.empty()) remedies.push_back(best);
  } else if (settings.bucket_mb > 1) {
    remedies.push_back(Remedy{format("--bucket-mb %g", settings.bucket_mb / 4)});
  }
  const std::string accumulation =
      format("--global-batch %.0f", 2.0 * static_cast<double>(settings.global_batch)) +
      format(" (%.0f accumulation steps, or --batch-per-rank ", 2.0 * settings.accumulation_steps) +
      format("%.0f where memory allows; a larger batch per optimiser step: retune --lr)",
             2.0 * static_cast<double>(settings.batch_per_rank));
  remedies.push_back(priced ? priced_remedy(accumulation, profile_with_accumulation(profile, 2))
                            : Remedy{accumulation});

  std::string text;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& remedy : remedies) {
    if (priced && remedy.gain < 1.0 + kMinimumGainShare) continue;
    if (priced) {
      text += (text.empty() ? "" : "; ") + remedy.option +
              format(": exposed %.0f -> ~%.0f ms, ", 1e3 * exposed, 1e3 * remedy.exposed_seconds) +
              gain_text(remedy.gain) + " samples/s";
      list.push_back({{"option", remedy.option},
                      {"exposed_seconds", remedy.exposed_seconds},
                      {"step_seconds", remedy.step_seconds},
                      {"gain", remedy.gain}});
    } else {
      text += (text.empty() ? "" : "; ") + remedy.option;
      list.push_back({{"option", remedy.option}});
    }
  }
  if (text.empty()) {
    return {
        "No option gains 5% or more here: the link is the limit (see the projection for "
        "faster fabrics).",
        list};
  }
  return {
      (priced ? "Remedies (expected, from the measured phases and bandwidth): " : "Remedies: ") +
          text + ".",
      list};
}

}  // namespace

RankSummary rank_summary_build(int rank, const std::vector<StepTimes>& steps,
                               int64_t samples_per_step, double eval_seconds,
                               double allreduce_seconds, double compute_cpu_seconds) {
  RankSummary summary;
  summary.rank = rank;
  summary.allreduce_seconds = allreduce_seconds;
  summary.steps = static_cast<int64_t>(steps.size());
  summary.eval_seconds = eval_seconds;
  if (steps.empty()) return summary;
  std::vector<double> totals;
  for (const auto& step : steps) {
    totals.push_back(step.total());
    for (int p = 0; p < kPhaseCount; ++p) summary.phase_mean[p] += step.seconds[p];
  }
  for (auto& mean : summary.phase_mean) mean /= static_cast<double>(steps.size());
  const Summary step = summarize(totals);
  summary.step_mean = step.mean;
  summary.step_p50 = step.p50;
  summary.step_p95 = step.p95;
  summary.own_mean = summary.step_mean - summary.phase_mean[static_cast<int>(Phase::kCommExposed)];
  summary.samples_per_second = share(static_cast<double>(samples_per_step), step.mean);
  const double compute_wall = (summary.phase_mean[static_cast<int>(Phase::kForward)] +
                               summary.phase_mean[static_cast<int>(Phase::kBackward)]) *
                              static_cast<double>(steps.size());
  summary.compute_cpu_share =
      compute_cpu_seconds > 0 ? share(compute_cpu_seconds, compute_wall) : 0.0;
  return summary;
}

std::vector<RankSummary> rank_summaries_gather(runtime::Communicator& comm,
                                               const RankSummary& mine) {
  std::ostringstream text;
  text.precision(17);
  text << mine.rank << ' ' << mine.steps << ' ' << mine.step_mean << ' ' << mine.step_p50 << ' '
       << mine.step_p95 << ' ' << mine.own_mean << ' ' << mine.samples_per_second << ' '
       << mine.eval_seconds << ' ' << mine.allreduce_seconds << ' ' << mine.peak_memory_bytes << ' '
       << mine.compute_cpu_share;
  for (double mean : mine.phase_mean) text << ' ' << mean;
  const auto all = comm.gather_strings(text.str());
  std::vector<RankSummary> summaries;
  if (comm.rank() != 0) return summaries;
  for (const auto& line : all) {
    std::istringstream in(line);
    RankSummary summary;
    in >> summary.rank >> summary.steps >> summary.step_mean >> summary.step_p50 >>
        summary.step_p95 >> summary.own_mean >> summary.samples_per_second >>
        summary.eval_seconds >> summary.allreduce_seconds >> summary.peak_memory_bytes >>
        summary.compute_cpu_share;
    for (double& mean : summary.phase_mean) in >> mean;
    VQA_CHECK(!in.fail(), "malformed rank summary: " + line);
    summaries.push_back(summary);
  }
  return summaries;
}

StepProfile step_profile_build(const EpochReport& report, std::vector<BucketProfile> buckets) {
  StepProfile profile;
  // Rank 0's own phases: its buckets' launch times are measured against its
  // backward, which on a loaded host can differ from the other ranks'.
  const auto phase = [&](Phase p) {
    const int index = static_cast<int>(p);
    return report.ranks.empty() ? report.phases[index].mean
                                : report.ranks.front().phase_mean[index];
  };
  profile.data_wait = phase(Phase::kDataWait);
  profile.h2d = phase(Phase::kHostToDevice);
  profile.forward = phase(Phase::kForward);
  profile.backward = phase(Phase::kBackward);
  profile.optimizer = phase(Phase::kOptimizer);
  profile.accumulation_steps = std::max<int64_t>(1, report.settings.accumulation_steps);
  profile.last_backward = profile.backward / static_cast<double>(profile.accumulation_steps);
  profile.samples_per_rank_step = report.settings.batch_per_rank * profile.accumulation_steps;
  profile.buckets = std::move(buckets);
  return profile;
}

EpochReport epoch_report_build(int64_t epoch, bool gpu, const std::vector<RankSummary>& ranks,
                               int64_t allreduce_bytes_per_step, double reference_bus_gbps,
                               int64_t reference_bytes, const RemedySettings& settings,
                               std::vector<BucketProfile> buckets) {
  EpochReport report;
  report.settings = settings;
  report.epoch = epoch;
  report.gpu = gpu;
  report.world_size = static_cast<int>(ranks.size());
  report.ranks = ranks;
  report.allreduce_bytes_per_step = allreduce_bytes_per_step;
  report.reference_bus_gbps = reference_bus_gbps;
  report.reference_bytes = reference_bytes;
  if (ranks.empty()) return report;
  double fastest_allreduce = ranks.front().allreduce_seconds;
  for (const auto& rank : ranks) {
    fastest_allreduce = std::min(fastest_allreduce, rank.allreduce_seconds);
  }
  report.allreduce_seconds_per_step = fastest_allreduce;
  report.bus_gbps =
      allreduce_bus_gbps(allreduce_bytes_per_step, report.world_size, fastest_allreduce);

  std::vector<double> steps, own;
  for (const auto& rank : ranks) {
    steps.push_back(rank.step_mean);
    own.push_back(rank.own_mean);
    report.samples_per_second += rank.samples_per_second;
  }
  for (int p = 0; p < kPhaseCount; ++p) {
    std::vector<double> values;
    for (const auto& rank : ranks) values.push_back(rank.phase_mean[p]);
    report.phases[p] = summarize(values);
  }
  report.step = summarize(steps);
  const auto slowest = std::max_element(ranks.begin(), ranks.end(),
                                        [](auto& a, auto& b) { return a.own_mean < b.own_mean; });
  report.slowest_rank = slowest->rank;
  report.slowest_excess = share(slowest->own_mean, summarize(own).p50) - 1.0;
  report.profile = step_profile_build(report, std::move(buckets));
  epoch_report_diagnose(report);
  return report;
}

void epoch_report_diagnose(EpochReport& report) {
  report.diagnoses.clear();
  const double step = report.step.mean;
  if (step <= 0 || report.ranks.empty()) return;
  const auto phase = [&](Phase p) { return report.phases[static_cast<int>(p)].mean; };
  const double comm = phase(Phase::kCommExposed);
  const double data = phase(Phase::kDataWait);
  const double compute = phase(Phase::kForward) + phase(Phase::kBackward);

  if (report.world_size > 1 && share(comm, step) > kCommBoundShare) {
    const auto remedies = communication_remedies(report);
    report.diagnoses.push_back(
        {"communication-bound",
         format("communication-bound: %.0f%% of each step (%.1f ms of %.1f ms) waits for gradient "
                "allreduces after backward (threshold %.0f%%). ",
                100 * share(comm, step), 1e3 * comm, 1e3 * step, 100 * kCommBoundShare) +
             format("%.1f MB per step at %.3g GB/s bus bandwidth (start-up probe: %.3g GB/s). ",
                    report.allreduce_bytes_per_step / 1e6, report.bus_gbps,
                    report.reference_bus_gbps) +
             remedies.first,
         {{"share", share(comm, step)},
          {"comm_exposed_seconds", comm},
          {"step_seconds", step},
          {"threshold", kCommBoundShare},
          {"allreduce_bytes_per_step", report.allreduce_bytes_per_step},
          {"bus_gbps", report.bus_gbps},
          {"reference_bus_gbps", report.reference_bus_gbps},
          {"remedies", remedies.second}}});
  }
  if (share(data, step) > kDataBoundShare) {
    const double gain = share(step, step - data);
    report.diagnoses.push_back(
        {"data-bound",
         format("data-bound: %.0f%% of each step (%.1f ms of %.1f ms) waits for the next batch "
                "(threshold %.0f%%); hidden, ",
                100 * share(data, step), 1e3 * data, 1e3 * step, 100 * kDataBoundShare) +
             gain_text(gain) +
             " samples/s. Remedies: a deeper --prefetch-depth, image features instead of pixels "
             "in the dataset (vqa_prep), the dataset on faster storage or in memory.",
         {{"share", share(data, step)},
          {"data_wait_seconds", data},
          {"step_seconds", step},
          {"gain", gain},
          {"threshold", kDataBoundShare}}});
  }
  if (report.world_size > 1 && report.slowest_excess > kStragglerMargin) {
    const auto& slow = *std::find_if(report.ranks.begin(), report.ranks.end(),
                                     [&](auto& r) { return r.rank == report.slowest_rank; });
    const double lost = slow.own_mean - slow.own_mean / (1.0 + report.slowest_excess);
    const double gain = share(step, step - lost);
    if (gain >= 1.0 + kMinimumGainShare) {
      report.diagnoses.push_back(
          {"straggler",
           "straggler: rank " + std::to_string(report.slowest_rank) +
               format(" takes %.1f ms per step of its own (step minus exposed communication), "
                      "%.0f%% more than the median rank (threshold %.0f%%); the other ranks wait "
                      "for it in every allreduce; at the median's pace ",
                      1e3 * slow.own_mean, 100 * report.slowest_excess, 100 * kStragglerMargin) +
               gain_text(gain) +
               " samples/s. Check that rank's host: other jobs on its cores, CPU binding (mpirun "
               "--bind-to), GPU clocks and temperature, its storage.",
           {{"rank", report.slowest_rank},
            {"own_seconds", slow.own_mean},
            {"excess", report.slowest_excess},
            {"gain", gain},
            {"threshold", kStragglerMargin}}});
    }
  }
  // Compute slowed by contention: the rank whose main thread got the least
  // of its core during forward + backward (CPU backend; the share is 0 when
  // unknown).
  if (report.settings.cpu_backend) {
    const RankSummary* contended = nullptr;
    for (const auto& rank : report.ranks) {
      if (rank.compute_cpu_share <= 0) continue;
      if (!contended || rank.compute_cpu_share < contended->compute_cpu_share) contended = &rank;
    }
    if (contended && contended->compute_cpu_share < kContentionCpuShare) {
      const double wall = contended->phase_mean[static_cast<int>(Phase::kForward)] +
                          contended->phase_mean[static_cast<int>(Phase::kBackward)];
      const double lost = wall * (1.0 - contended->compute_cpu_share);
      const double gain = share(step, step - lost);
      if (share(lost, step) >= kMinimumGainShare) {
        report.diagnoses.push_back(
            {"compute-contention",
             "compute-contention: rank " + std::to_string(contended->rank) +
                 format("'s compute thread ran %.0f%% of its forward + backward time (threshold "
                        "%.0f%%): %.1f ms per step it waited for a core held by another thread or "
                        "process (the allreduce progress thread, the loader, other jobs); with a "
                        "core of its own ",
                        100 * contended->compute_cpu_share, 100 * kContentionCpuShare, 1e3 * lost) +
                 gain_text(gain) +
                 " samples/s. Remedies: fewer ranks or --threads per host than cores, so the "
                 "progress thread has a core (jobs/launch_local.sh binds one rank per core), no "
                 "other jobs on the node.",
             {{"rank", contended->rank},
              {"cpu_share", contended->compute_cpu_share},
              {"lost_seconds", lost},
              {"gain", gain},
              {"threshold", kContentionCpuShare}}});
      }
    }
  }
  double eval_min = report.ranks.front().eval_seconds, eval_max = eval_min;
  int eval_slowest = report.ranks.front().rank;
  for (const auto& rank : report.ranks) {
    eval_min = std::min(eval_min, rank.eval_seconds);
    if (rank.eval_seconds > eval_max) {
      eval_max = rank.eval_seconds;
      eval_slowest = rank.rank;
    }
  }
  if (report.world_size > 1 && eval_max - eval_min > kEvalImbalanceMinSeconds &&
      share(eval_max, eval_min) - 1.0 > kEvalImbalanceMargin) {
    report.diagnoses.push_back(
        {"eval-imbalance",
         "eval-imbalance: rank " + std::to_string(eval_slowest) +
             format(" evaluates for %.2f s, the fastest rank for %.2f s (threshold +%.0f%%); the "
                    "others wait for it before the next epoch. Remedies: check that rank's "
                    "host; evaluate less often (--eval-every).",
                    eval_max, eval_min, 100 * kEvalImbalanceMargin),
         {{"rank", eval_slowest},
          {"max_seconds", eval_max},
          {"min_seconds", eval_min},
          {"threshold", kEvalImbalanceMargin}}});
  }
  const bool explained = !report.diagnoses.empty();
  const bool gpu_tiny = report.gpu && compute < kSmallBatchGpuSeconds;
  // Twice the batch: compute doubles, the fixed costs do not.
  const double double_batch_gain = share(2.0 * step, step + compute);
  if ((gpu_tiny || (!explained && share(compute, step) < kSmallBatchComputeShare)) &&
      double_batch_gain >= 1.0 + kMinimumGainShare) {
    report.diagnoses.push_back(
        {"small-batch",
         format("small-batch: forward + backward take %.1f ms, %.0f%% of the %.1f ms step "
                "(threshold %.0f%%",
                1e3 * compute, 100 * share(compute, step), 1e3 * step,
                100 * kSmallBatchComputeShare) +
             format(", or under %.0f ms on a GPU); fixed per-step costs (optimiser %.1f ms, "
                    "copies, kernel launches, allreduce latency) dominate. Remedy: a larger "
                    "--batch-per-rank (",
                    1e3 * kSmallBatchGpuSeconds, 1e3 * phase(Phase::kOptimizer)) +
             format("%.0f: ", 2.0 * static_cast<double>(report.settings.batch_per_rank)) +
             gain_text(double_batch_gain) + " samples/s).",
         {{"compute_seconds", compute},
          {"step_seconds", step},
          {"share", share(compute, step)},
          {"gain", double_batch_gain},
          {"threshold", kSmallBatchComputeShare}}});
  }
}

std::vector<std::string> epoch_report_lines(const EpochReport& report) {
  std::vector<std::string> lines;
  std::string phases = "  step " + format("%.1f ms", 1e3 * report.step.mean) + " =";
  for (int p = 0; p < kPhaseCount; ++p) {
    phases += " " + phase_key(p) + format(" %.1f", 1e3 * report.phases[p].mean);
  }
  lines.push_back(phases + " (ms, mean over ranks)");
  std::string throughput =
      format("  %.1f samples/s in total, %.1f per rank; ", report.samples_per_second,
             report.samples_per_second / std::max(1, report.world_size));
  if (report.world_size > 1) {
    throughput += "slowest rank " + std::to_string(report.slowest_rank) +
                  format(" (%+.0f%% own time vs median); ", 100 * report.slowest_excess);
  }
  throughput += format("allreduce %.2f MB/step", report.allreduce_bytes_per_step / 1e6);
  if (report.world_size > 1 && report.allreduce_seconds_per_step > 0) {
    throughput += format(", %.2f GB/s bus bandwidth (start-up probe at %.1f MB: %.2f GB/s)",
                         report.bus_gbps, report.reference_bytes / 1e6, report.reference_bus_gbps);
  }
  lines.push_back(throughput);
  if (!report.ranks.empty() && report.ranks.front().peak_memory_bytes > 0) {
    const auto [low, high] = std::minmax_element(report.ranks.begin(), report.ranks.end(),
                                                 [](const RankSummary& a, const RankSummary& b) {
                                                   return a.peak_memory_bytes < b.peak_memory_bytes;
                                                 });
    const auto& m = report.memory;
    const int64_t rest = high->peak_memory_bytes - m.parameters - m.gradients - m.optimizer_state;
    lines.push_back("  memory per rank: peak " + bytes_text(high->peak_memory_bytes) + " (rank " +
                    std::to_string(high->rank) + ", lowest " + bytes_text(low->peak_memory_bytes) +
                    "; " + m.source + ") = parameters " + bytes_text(m.parameters) +
                    " + gradient buckets " + bytes_text(m.gradients) + " + optimizer state " +
                    bytes_text(m.optimizer_state) + " + activations and the rest " +
                    bytes_text(rest));
  }
  for (const auto& diagnosis : report.diagnoses)
    lines.push_back("  diagnosis: " + diagnosis.message);
  return lines;
}

nlohmann::json epoch_report_json(const EpochReport& report) {
  nlohmann::json phases = nlohmann::json::object();
  for (int p = 0; p < kPhaseCount; ++p) {
    phases[phase_key(p)] = {{"mean", report.phases[p].mean},
                            {"p50", report.phases[p].p50},
                            {"p95", report.phases[p].p95}};
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& rank : report.ranks) {
    nlohmann::json rank_phases = nlohmann::json::object();
    for (int p = 0; p < kPhaseCount; ++p) rank_phases[phase_key(p)] = rank.phase_mean[p];
    ranks.push_back({{"rank", rank.rank},
                     {"steps", rank.steps},
                     {"step_mean", rank.step_mean},
                     {"step_p50", rank.step_p50},
                     {"step_p95", rank.step_p95},
                     {"own_mean", rank.own_mean},
                     {"samples_per_second", rank.samples_per_second},
                     {"eval_seconds", rank.eval_seconds},
                     {"allreduce_seconds", rank.allreduce_seconds},
                     {"peak_memory_bytes", rank.peak_memory_bytes},
                     {"compute_cpu_share", rank.compute_cpu_share},
                     {"phases", rank_phases}});
  }
  nlohmann::json diagnoses = nlohmann::json::array();
  for (const auto& diagnosis : report.diagnoses) {
    diagnoses.push_back(
        {{"rule", diagnosis.rule}, {"message", diagnosis.message}, {"numbers", diagnosis.numbers}});
  }
  return {{"epoch", report.epoch},
          {"ranks", report.world_size},
          {"phases", phases},
          {"step_seconds",
           {{"mean", report.step.mean}, {"p50", report.step.p50}, {"p95", report.step.p95}}},
          {"per_rank", ranks},
          {"slowest_rank", report.slowest_rank},
          {"slowest_rank_excess", report.slowest_excess},
          {"timed_samples_per_second", report.samples_per_second},
          {"allreduce_bytes_per_step", report.allreduce_bytes_per_step},
          {"allreduce_seconds_per_step", report.allreduce_seconds_per_step},
          {"bus_gbps", report.bus_gbps},
          {"reference_bus_gbps", report.reference_bus_gbps},
          {"reference_bytes", report.reference_bytes},
          {"diagnosis", diagnoses},
          {"allreduce_tuning", report.allreduce_tuning},
          {"memory",
           {{"source", report.memory.source},
            {"parameters_bytes", report.memory.parameters},
            {"gradients_bytes", report.memory.gradients},
            {"optimizer_state_bytes", report.memory.optimizer_state}}},
          {"thresholds",
           {{"communication_bound_share", kCommBoundShare},
            {"data_bound_share", kDataBoundShare},
            {"straggler_margin", kStragglerMargin},
            {"eval_imbalance_margin", kEvalImbalanceMargin},
            {"eval_imbalance_min_seconds", kEvalImbalanceMinSeconds},
            {"small_batch_compute_share", kSmallBatchComputeShare},
            {"small_batch_gpu_seconds", kSmallBatchGpuSeconds},
            {"contention_cpu_share", kContentionCpuShare},
            {"minimum_gain_share", kMinimumGainShare}}}};
}

}  // namespace vqa::train
