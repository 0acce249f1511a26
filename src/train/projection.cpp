#include "train/projection.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace vqa::train {

namespace {

// A share of the step under which a cost is not called the bottleneck.
constexpr double kBottleneckShare = 0.05;

double ring_seconds(double bytes, const Fabric& fabric, int ranks, double* latency_part) {
  if (ranks < 2) return 0.0;
  const double steps = 2.0 * (ranks - 1);
  const double bandwidth =
      fabric.bus_gbps > 0 ? steps / ranks * bytes / (fabric.bus_gbps * 1e9) : 0;
  const double latency = steps * fabric.latency_seconds;
  if (latency_part) *latency_part += latency;
  return bandwidth + latency;
}

}  // namespace

const std::vector<Fabric>& fabric_presets() {
  // Bus bandwidths as nccl-tests reports them for large allreduces; latencies
  // per ring step. docs/performance.md ("Projection to N ranks") gives the sources.
  static const std::vector<Fabric> presets = {
      {"nvlink-h100", 450.0, 5e-6,
       "8x H100/H200 SXM, NVLink 4 + NVSwitch: nccl-tests busbw 370-480 GB/s"},
      {"ib-ndr", 47.0, 8e-6, "InfiniBand NDR 400 Gb/s, one NIC per GPU: busbw ~46-48 GB/s"},
      {"ib-hdr", 24.0, 8e-6, "InfiniBand HDR 200 Gb/s, one NIC per GPU: busbw ~23-24 GB/s"},
      {"100gbe", 11.5, 15e-6, "100 Gbit/s Ethernet (RoCE): ~92% of 12.5 GB/s"},
      {"25gbe", 2.9, 30e-6, "25 Gbit/s Ethernet, TCP: ~93% of 3.125 GB/s"},
      {"10gbe", 1.17, 30e-6, "10 Gbit/s Ethernet, TCP: ~94% of 1.25 GB/s"},
      {"1gbe", 0.117, 50e-6, "1 Gbit/s Ethernet, TCP: ~94% of 0.125 GB/s"},
      {"pcie-no-p2p", 6.0, 10e-6,
       "consumer GPUs without peer-to-peer (PCIe through host memory): an estimate, measure yours "
       "with vqa_allreduce_bench --device cuda"},
  };
  return presets;
}

std::optional<Fabric> fabric_from_text(const std::string& text) {
  for (const auto& preset : fabric_presets()) {
    if (preset.name == text) return preset;
  }
  // BUSGBPS:LATENCYUS[:CPUUS_PER_MB[:BUSGBPS_IN_BACKWARD]], every field a number.
  std::vector<double> fields;
  size_t begin = 0;
  while (begin <= text.size() && fields.size() < 5) {
    const size_t colon = std::min(text.find(':', begin), text.size());
    const std::string field = text.substr(begin, colon - begin);
    char* end = nullptr;
    const double value = std::strtod(field.c_str(), &end);
    if (field.empty() || end != field.c_str() + field.size() || !std::isfinite(value)) {
      return std::nullopt;
    }
    fields.push_back(value);
    begin = colon + 1;
  }
  if (fields.size() < 2 || fields.size() > 4) return std::nullopt;
  const double gbps = fields[0], latency_us = fields[1];
  const double cpu_us_per_mb = fields.size() >= 3 ? fields[2] : 0.0;
  const double gbps_in_backward = fields.size() == 4 ? fields[3] : 0.0;
  if (gbps > 0 && gbps < 1e6 && latency_us >= 0 && latency_us < 1e6 && cpu_us_per_mb >= 0 &&
      cpu_us_per_mb < 1e7 &&
      (fields.size() < 4 || (gbps_in_backward > 0 && gbps_in_backward < 1e6))) {
    return Fabric{text,
                  gbps,
                  latency_us * 1e-6,
                  "given on the command line",
                  cpu_us_per_mb * 1e-12,
                  gbps_in_backward};
  }
  return std::nullopt;
}

std::vector<double> compute_spread_of(std::vector<double> seconds) {
  seconds.erase(std::remove_if(seconds.begin(), seconds.end(),
                               [](double s) { return !(s > 0) || !std::isfinite(s); }),
                seconds.end());
  if (seconds.size() < 2) return {};
  std::sort(seconds.begin(), seconds.end());
  double mean = 0.0;
  for (double s : seconds) mean += s;
  mean /= static_cast<double>(seconds.size());
  const size_t points = std::min(kSpreadPoints, seconds.size());
  std::vector<double> spread;
  for (size_t k = 0; k < points; ++k) {
    const size_t index = (k * (seconds.size() - 1) + (points - 1) / 2) / (points - 1);
    spread.push_back(seconds[index] / mean);
  }
  return spread;
}

double slowest_of(const std::vector<double>& spread, int ranks) {
  if (ranks < 2 || spread.empty()) return 1.0;
  // E[max of n] over the empirical distribution: the i-th of m sorted values
  // is the maximum with probability (i/m)^n - ((i-1)/m)^n.
  const auto m = static_cast<double>(spread.size());
  double expected = 0.0, mean = 0.0, below = 0.0;
  for (size_t i = 0; i < spread.size(); ++i) {
    const double at = std::pow(static_cast<double>(i + 1) / m, ranks);
    expected += spread[i] * (at - below);
    below = at;
    mean += spread[i] / m;
  }
  return mean > 0 ? std::max(1.0, expected / mean) : 1.0;
}

namespace {

struct LinkSchedule {
  double comm = 0.0, latency = 0.0;
  double end = 0.0;                // when the last bucket is done (from backward's start)
  double bytes_in_backward = 0.0;  // buffer bytes moved before backward ends
};

// The link serving the buckets in order, for a backward of `backward`
// seconds whose gradients arrive as in `profile`, stretched in proportion.
LinkSchedule link_schedule(const StepProfile& profile, const Fabric& fabric, int ranks,
                           double backward) {
  LinkSchedule link;
  const double stretch = profile.last_backward > 0 ? backward / profile.last_backward : 1.0;
  // Where the link is slower while backward computes, a bucket's bytes move
  // at that rate until backward ends and at the idle rate after it.
  const double in_backward = fabric.bus_gbps_in_backward > 0 && fabric.bus_gbps > 0
                                 ? fabric.bus_gbps / fabric.bus_gbps_in_backward
                                 : 1.0;
  for (const auto& bucket : profile.buckets) {
    const double ready = std::max(0.0, (profile.last_backward - bucket.ready_before_end) * stretch);
    const double idle = ring_seconds(bucket.bytes, fabric, ranks, &link.latency);
    const double start = std::max(link.end, ready);
    // idle seconds of the bucket's transfer that fit before backward ends,
    // each taking `in_backward` times as long there.
    const double before = std::clamp((backward - start) / in_backward, 0.0, idle);
    const double seconds = before * in_backward + (idle - before);
    link.comm += seconds;
    link.end = start + seconds;
    if (idle > 0) link.bytes_in_backward += bucket.bytes * before / idle;
  }
  return link;
}

}  // namespace

ProjectedStep project_step(const StepProfile& profile, const Fabric& fabric, int ranks) {
  ProjectedStep result;
  result.ranks = ranks;
  LinkSchedule link = link_schedule(profile, fabric, ranks, profile.last_backward);
  double backward = profile.last_backward;
  if (ranks > 1 && fabric.cpu_seconds_per_byte > 0) {
    // The CPU the allreduce takes while backward runs is backward's loss;
    // a longer backward hides more of the link, so the schedule is redone.
    const double traffic = 2.0 * (ranks - 1) / ranks;
    backward += fabric.cpu_seconds_per_byte * traffic * link.bytes_in_backward;
    link = link_schedule(profile, fabric, ranks, backward);
  }
  const double latency = link.latency;
  result.comm_seconds = link.comm;
  result.exposed_seconds = ranks > 1 ? std::max(0.0, link.end - backward) : 0.0;
  // The slowest rank's compute sets when the last bucket can go: every
  // bucket of the step waits for it, so the link schedule shifts whole.
  result.straggler_seconds = (slowest_of(profile.compute_spread, ranks) - 1.0) * profile.compute();
  result.step_seconds = profile.compute() + (backward - profile.last_backward) +
                        result.straggler_seconds + result.exposed_seconds;
  result.samples_per_second =
      result.step_seconds > 0
          ? static_cast<double>(ranks * profile.samples_per_rank_step) / result.step_seconds
          : 0.0;
  const double single = profile.compute();
  result.efficiency = result.step_seconds > 0 ? single / result.step_seconds : 0.0;
  if (result.exposed_seconds < kBottleneckShare * result.step_seconds) {
    result.bottleneck = result.straggler_seconds < kBottleneckShare * result.step_seconds
                            ? "compute"
                            : "stragglers";
  } else {
    result.bottleneck = latency > result.comm_seconds / 2 ? "link latency" : "link bandwidth";
  }
  return result;
}

std::vector<ProjectedStep> project_scaling(const StepProfile& profile, const Fabric& fabric,
                                           int max_ranks) {
  std::vector<ProjectedStep> rows;
  for (int ranks = 1; ranks <= max_ranks; ranks *= 2)
    rows.push_back(project_step(profile, fabric, ranks));
  return rows;
}

StepProfile profile_with_bucket_bytes(const StepProfile& profile, double bucket_bytes) {
  // The run's buckets as a curve of bytes ready against time before the end
  // of backward, linear between launches and starting at backward's start;
  // new buckets are cut from it every bucket_bytes (split or merged).
  std::vector<std::pair<double, double>> curve = {{0.0, profile.last_backward}};
  for (const auto& bucket : profile.buckets) {
    curve.push_back({curve.back().first + bucket.bytes, bucket.ready_before_end});
  }
  StepProfile cut = profile;
  cut.buckets.clear();
  const double total = curve.back().first;
  if (total <= 0 || bucket_bytes <= 0) return profile;
  const int pieces = std::max(1, static_cast<int>(std::ceil(total / bucket_bytes - 1e-9)));
  size_t segment = 1;
  double previous_end = 0.0;
  for (int k = 1; k <= pieces; ++k) {
    const double end = std::min(total, k * bucket_bytes);
    while (segment + 1 < curve.size() && curve[segment].first < end) ++segment;
    const auto& [bytes0, ready0] = curve[segment - 1];
    const auto& [bytes1, ready1] = curve[segment];
    const double t = bytes1 > bytes0 ? (end - bytes0) / (bytes1 - bytes0) : 1.0;
    cut.buckets.push_back({end - previous_end, ready0 + (ready1 - ready0) * t});
    previous_end = end;
  }
  return cut;
}

double auto_bucket_bytes(const Fabric& fabric) {
  constexpr double kMiB = 1024.0 * 1024.0;
  return kMiB *
         std::clamp(std::round(10.0 * fabric.bus_gbps * 1e9 * kAutoBucketSeconds / kMiB) / 10.0,
                    kAutoBucketMinMiB, kAutoBucketMaxMiB);
}

StepProfile profile_with_bytes_scaled(const StepProfile& profile, double factor) {
  StepProfile scaled = profile;
  for (auto& bucket : scaled.buckets) bucket.bytes *= factor;
  return scaled;
}

StepProfile profile_with_accumulation(const StepProfile& profile, int64_t factor) {
  StepProfile longer = profile;
  const auto f = static_cast<double>(factor);
  // Every micro-step's phases repeat; the optimiser and the allreduce do not.
  longer.data_wait *= f;
  longer.h2d *= f;
  longer.forward *= f;
  longer.backward *= f;
  longer.accumulation_steps *= factor;
  longer.samples_per_rank_step *= factor;
  return longer;
}

nlohmann::json projection_json(const StepProfile& profile, const Fabric& fabric,
                               const std::vector<ProjectedStep>& rows) {
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& bucket : profile.buckets) {
    buckets.push_back(
        {{"bytes", bucket.bytes}, {"ready_before_end_seconds", bucket.ready_before_end}});
  }
  nlohmann::json table = nlohmann::json::array();
  for (const auto& row : rows) {
    table.push_back({{"ranks", row.ranks},
                     {"step_seconds", row.step_seconds},
                     {"comm_seconds", row.comm_seconds},
                     {"exposed_seconds", row.exposed_seconds},
                     {"straggler_seconds", row.straggler_seconds},
                     {"samples_per_second", row.samples_per_second},
                     {"efficiency", row.efficiency},
                     {"bottleneck", row.bottleneck}});
  }
  return {{"fabric",
           {{"name", fabric.name},
            {"bus_gbps", fabric.bus_gbps},
            {"latency_seconds", fabric.latency_seconds},
            {"cpu_seconds_per_byte", fabric.cpu_seconds_per_byte},
            {"bus_gbps_in_backward", fabric.bus_gbps_in_backward},
            {"source", fabric.source}}},
          {"profile",
           {{"data_wait_seconds", profile.data_wait},
            {"h2d_seconds", profile.h2d},
            {"forward_seconds", profile.forward},
            {"backward_seconds", profile.backward},
            {"optimizer_seconds", profile.optimizer},
            {"accumulation_steps", profile.accumulation_steps},
            {"last_backward_seconds", profile.last_backward},
            {"samples_per_rank_step", profile.samples_per_rank_step},
            {"buckets", buckets},
            {"compute_spread", profile.compute_spread}}},
          {"rows", table}};
}

StepProfile step_profile_from_json(const nlohmann::json& json) {
  const auto field = [&](const nlohmann::json& object, const char* name) -> const nlohmann::json& {
    if (!object.is_object() || !object.contains(name)) {
      throw std::runtime_error(std::string("projection profile: no field '") + name + "'");
    }
    return object.at(name);
  };
  StepProfile profile;
  profile.data_wait = field(json, "data_wait_seconds").get<double>();
  profile.h2d = field(json, "h2d_seconds").get<double>();
  profile.forward = field(json, "forward_seconds").get<double>();
  profile.backward = field(json, "backward_seconds").get<double>();
  profile.optimizer = field(json, "optimizer_seconds").get<double>();
  profile.accumulation_steps = field(json, "accumulation_steps").get<int64_t>();
  profile.last_backward = field(json, "last_backward_seconds").get<double>();
  profile.samples_per_rank_step = field(json, "samples_per_rank_step").get<int64_t>();
  for (const auto& bucket : field(json, "buckets")) {
    profile.buckets.push_back({field(bucket, "bytes").get<double>(),
                               field(bucket, "ready_before_end_seconds").get<double>()});
  }
  // Written since the straggler term; older diagnosis files project without it.
  if (json.contains("compute_spread")) {
    profile.compute_spread = json.at("compute_spread").get<std::vector<double>>();
  }
  return profile;
}

std::vector<std::string> projection_lines(const Fabric& fabric,
                                          const std::vector<ProjectedStep>& rows) {
  std::vector<std::string> lines;
  char line[256];
  char in_backward[64] = "";
  if (fabric.bus_gbps_in_backward > 0) {
    std::snprintf(in_backward, sizeof(in_backward), ", %.3g GB/s during backward",
                  fabric.bus_gbps_in_backward);
  }
  std::snprintf(
      line, sizeof(line),
      "  projection on %s (bus %.3g GB/s%s, %.0f us per ring step; %s):", fabric.name.c_str(),
      fabric.bus_gbps, in_backward, fabric.latency_seconds * 1e6, fabric.source.c_str());
  lines.push_back(line);
  lines.push_back(
      "    ranks   step_ms  comm_ms  exposed_ms  straggler_ms   samples/s  efficiency  bottleneck");
  for (const auto& row : rows) {
    std::snprintf(line, sizeof(line), "    %5d %9.1f %8.1f %11.1f %13.1f %11.1f %11.3f  %s",
                  row.ranks, 1e3 * row.step_seconds, 1e3 * row.comm_seconds,
                  1e3 * row.exposed_seconds, 1e3 * row.straggler_seconds, row.samples_per_second,
                  row.efficiency, row.bottleneck.c_str());
    lines.push_back(line);
  }
  return lines;
}

}  // namespace vqa::train
