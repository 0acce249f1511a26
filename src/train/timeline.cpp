#include "train/timeline.h"

#include <nlohmann/json.hpp>

#include <filesystem>

#include "util/durable_file.h"  // write_file_atomically

namespace vqa::train {

namespace {

constexpr int kComputeTrack = 0;
constexpr int kAllreduceTrack = 1;

nlohmann::json complete_event(const std::string& name, int track, double begin, double end,
                              nlohmann::json args) {
  return {{"name", name},
          {"ph", "X"},
          {"tid", track},
          {"ts", 1e6 * begin},
          {"dur", 1e6 * (end - begin)},
          {"args", std::move(args)}};
}

}  // namespace

Timeline::Timeline(std::string path, int64_t first_step, int64_t steps)
    : path_(std::move(path)), first_step_(first_step), steps_(steps) {}

void Timeline::add_step(const StepTimes& step) {
  if (!active() || !in_window(step.step)) return;
  events_.push_back(complete_event("step " + std::to_string(step.step), kComputeTrack, step.begin,
                                   step.end, {{"step", step.step}})
                        .dump());
  for (const auto& segment : step.segments) {
    events_.push_back(complete_event(phase_name(segment.phase), kComputeTrack, segment.begin,
                                     segment.end, {{"step", step.step}})
                          .dump());
  }
}

void Timeline::add_collective(int64_t step, int64_t bucket, int64_t bytes, double begin,
                              double end) {
  if (!active() || !in_window(step)) return;
  events_.push_back(complete_event("allreduce bucket " + std::to_string(bucket), kAllreduceTrack,
                                   begin, end,
                                   {{"step", step}, {"bucket", bucket}, {"bytes", bytes}})
                        .dump());
}

void Timeline::write(runtime::Communicator& comm, const std::string& host) {
  if (!active()) return;
  written_ = true;
  const int rank = comm.rank();
  // One string per rank: its events as a JSON array, the process id filled in.
  nlohmann::json mine = nlohmann::json::array();
  mine.push_back({{"name", "process_name"},
                  {"ph", "M"},
                  {"pid", rank},
                  {"args", {{"name", "rank " + std::to_string(rank) + " (" + host + ")"}}}});
  mine.push_back({{"name", "process_sort_index"},
                  {"ph", "M"},
                  {"pid", rank},
                  {"args", {{"sort_index", rank}}}});
  for (const auto& [track, name] :
       {std::pair{kComputeTrack, "compute"}, std::pair{kAllreduceTrack, "allreduce"}}) {
    mine.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"tid", track},
                    {"args", {{"name", name}}}});
  }
  for (const auto& text : events_) {
    auto event = nlohmann::json::parse(text);
    event["pid"] = rank;
    mine.push_back(std::move(event));
  }
  events_.clear();
  const auto all = comm.gather_strings(mine.dump());
  if (rank != 0) return;
  nlohmann::json events = nlohmann::json::array();
  for (const auto& text : all) {
    for (auto& event : nlohmann::json::parse(text)) events.push_back(std::move(event));
  }
  const nlohmann::json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  const auto parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  util::write_file_atomically(path_, trace.dump() + "\n");
}

}  // namespace vqa::train
