#include "train/allreduce_autotune.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "util/durable_file.h"  // write_file_atomically

namespace vqa::train {

namespace {

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

constexpr double kMiB = 1024.0 * 1024.0;

std::string format_mib(double mib) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g MiB", mib);
  return text;
}

std::string format_ms(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f ms", seconds * 1e3);
  return text;
}

// The stored record, or null when absent or unreadable (then the run tunes).
nlohmann::json read_stored(const std::string& path) {
  std::ifstream file(path);
  if (!file) return nullptr;
  try {
    return nlohmann::json::parse(file);
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace

int AutotuneSchedule::candidate_at(int64_t step) const {
  if (!in_window(step)) return -1;
  if (step < first_step_ + kAutotuneWarmupSteps) return 0;
  const int64_t trial = step - first_step_ - kAutotuneWarmupSteps;
  const int64_t round = trial / candidates_;
  return static_cast<int>((trial % candidates_ + round) % candidates_);
}

int autotune_rounds(int candidates, int64_t max_steps, int64_t steps_left) {
  if (candidates < 2) return 0;
  const auto share = static_cast<int64_t>(kAutotuneMaxShare * static_cast<double>(steps_left));
  const int64_t budget = std::min(max_steps, share);
  const int64_t rounds =
      std::min<int64_t>(kAutotuneRounds, (budget - kAutotuneWarmupSteps) / candidates);
  return rounds >= kAutotuneMinRounds ? static_cast<int>(rounds) : 0;
}

AutotuneResult autotune_decide(const std::vector<std::vector<double>>& rank_seconds,
                               const std::vector<std::vector<double>>& rank_exposed, int rounds) {
  AutotuneResult result;
  const size_t candidates = rank_seconds.empty() ? 0 : rank_seconds.front().size();
  result.seconds.assign(candidates, 0.0);
  result.exposed_seconds.assign(candidates, 0.0);
  for (size_t r = 0; r < rank_seconds.size(); ++r) {
    for (size_t c = 0; c < candidates; ++c) {
      // Every step waits for the slowest rank.
      result.seconds[c] = std::max(result.seconds[c], rank_seconds[r][c]);
      result.exposed_seconds[c] = std::max(result.exposed_seconds[c], rank_exposed[r][c]);
    }
  }
  for (size_t c = 1; c < candidates; ++c) {
    if (result.seconds[c] < result.seconds[result.choice]) result.choice = static_cast<int>(c);
  }
  for (size_t c = 0; c < candidates; ++c) {
    result.seconds_lost += rounds * (result.seconds[c] - result.seconds[result.choice]);
  }
  return result;
}

std::string autotune_key(int world_size, const std::vector<int64_t>& bucket_sizes) {
  std::string key = std::to_string(world_size) + " ranks, buckets";
  for (const int64_t bytes : bucket_sizes) key += " " + std::to_string(bytes);
  return key;
}

std::string autotune_key_tuned_size(int world_size, int64_t bytes_per_step) {
  return std::to_string(world_size) + " ranks, " + std::to_string(bytes_per_step) +
         " bytes per step, bucket size tuned";
}

std::vector<double> autotune_bucket_sizes(double start_mb, double gradient_mb) {
  const double effective = std::min(start_mb, gradient_mb);
  std::vector<double> sizes;
  for (const double factor : {0.5, 2.0}) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.3g", effective * factor);
    sizes.push_back(std::strtod(text, nullptr));
  }
  return sizes;
}

std::vector<int64_t> AllreduceAutotune::layout_classes() const {
  std::vector<int64_t> classes;
  for (const int64_t bytes : gradients_->bucket_bytes()) {
    if (comm_.allreduce_methods(bytes).empty()) continue;
    if (std::find(classes.begin(), classes.end(), bytes) == classes.end()) classes.push_back(bytes);
  }
  return classes;
}

void AllreduceAutotune::record_rank_choices() {
  std::string in_use;
  for (const auto& [bytes, method] : json_["methods"].items()) {
    in_use += (in_use.empty() ? "" : ", ") + comm_.allreduce_method_in_use(std::stoll(bytes));
  }
  json_["rank_methods"] = comm_.gather_strings(in_use);
  char size_text[32];
  std::snprintf(size_text, sizeof(size_text), "%.17g", gradients_->bucket_mb());
  std::vector<double> rank_sizes;
  for (const auto& text : comm_.gather_strings(size_text)) rank_sizes.push_back(std::stod(text));
  json_["rank_bucket_mb"] = rank_sizes;
}

bool AllreduceAutotune::reuse_stored(const std::string& key) {
  // Rank 0's copy, for every rank.
  const std::string stored_text =
      comm_.rank() == 0 ? read_stored(setup_.stored_path).dump() : std::string();
  const auto stored = nlohmann::json::parse(comm_.gather_strings(stored_text).front());
  if (!stored.is_object() || stored.value("key", "") != key || !stored.contains("methods")) {
    return false;
  }
  if (tune_size_ && stored.contains("bucket_mb")) {
    gradients_->rebucket(stored["bucket_mb"].get<double>());
  }
  for (const int64_t bytes : layout_classes()) {
    const std::string method = stored["methods"].value(std::to_string(bytes), std::string());
    if (!method.empty() && method != comm_.allreduce_method_in_use(bytes)) {
      comm_.allreduce_method_set(bytes, method);
    }
  }
  json_ = stored;
  json_["reused_from"] = setup_.stored_path;
  json_["methods"] = nlohmann::json::object();  // as applied to the buckets laid out now
  for (const int64_t bytes : layout_classes()) {
    json_["methods"][std::to_string(bytes)] = comm_.allreduce_method_in_use(bytes);
  }
  record_rank_choices();
  decided_ = true;
  log_.info("allreduce tuning: " + stored.value("choice", std::string("?")) +
            (tune_size_ ? " (buckets " + format_mib(gradients_->bucket_mb()) + ")" : "") +
            ", the choice stored in " + setup_.stored_path + " (not tried again)");
  return true;
}

void AllreduceAutotune::start(GradientSynchronizer& gradients, bool tune_bucket_size) {
  gradients_ = &gradients;
  if (setup_.max_steps <= 0 || comm_.world_size() < 2) return;
  const double start_mb = gradients.bucket_mb();
  if (tune_bucket_size && gradients.sharded()) {
    log_.info("allreduce tuning: the bucket size stays " + format_mib(start_mb) +
              " under --shard-optimizer (the parameters and the optimiser's shards are views "
              "of the buckets); only the methods are tried");
  }
  tune_size_ = tune_bucket_size && !gradients.sharded();
  // The layouts tried: the start-up one, then each other size that lays out
  // other buckets.
  std::vector<double> sizes{start_mb};
  std::vector<std::vector<int64_t>> layouts{gradients.bucket_bytes()};
  if (tune_size_) {
    const double gradient_mb = static_cast<double>(gradients.gradient_bytes()) / kMiB;
    for (const double mb : autotune_bucket_sizes(start_mb, gradient_mb)) {
      const auto layout = gradients.bucket_bytes_at(mb);
      if (std::find(layouts.begin(), layouts.end(), layout) != layouts.end()) continue;
      sizes.push_back(mb);
      layouts.push_back(layout);
    }
  }
  // The size classes the backend chooses a method for, in any layout, each once.
  std::vector<std::string> methods;
  for (const auto& layout : layouts) {
    for (const int64_t bytes : layout) {
      const auto offered = comm_.allreduce_methods(bytes);
      if (offered.empty() || std::find(classes_.begin(), classes_.end(), bytes) != classes_.end()) {
        continue;
      }
      classes_.push_back(bytes);
      methods = offered;
    }
  }
  if (classes_.empty() && sizes.size() < 2) return;  // nothing to choose between
  int64_t bytes_per_step = 0;
  for (const int64_t bytes : layouts.front()) bytes_per_step += bytes;
  key_ = tune_size_ ? autotune_key_tuned_size(comm_.world_size(), bytes_per_step)
                    : autotune_key(comm_.world_size(), layouts.front());
  if (reuse_stored(key_)) return;

  AutotuneCandidate start{"start-up choice", start_mb, {}};
  for (const int64_t bytes : classes_)
    start.methods.push_back(comm_.allreduce_method_in_use(bytes));
  candidates_.push_back(start);
  for (const auto& method : methods) {
    AutotuneCandidate uniform{method, start_mb, std::vector<std::string>(classes_.size(), method)};
    // The start-up choice already is this one: tried once, under its name.
    if (uniform.methods == start.methods) {
      candidates_.front().name = "start-up choice (" + method + ")";
      continue;
    }
    candidates_.push_back(uniform);
  }
  for (size_t k = 1; k < sizes.size(); ++k) {
    candidates_.push_back(
        {"start-up methods, " + format_mib(sizes[k]) + " buckets", sizes[k], start.methods});
  }
  const int count = static_cast<int>(candidates_.size());
  if (!setup_.timers) {
    log_.info(
        "allreduce tuning: off (--phase-timers false: no step times); the start-up "
        "choice stays");
    return;
  }
  const int rounds = autotune_rounds(count, setup_.max_steps, setup_.steps_left);
  if (rounds == 0) {
    log_.info("allreduce tuning: off (" + std::to_string(count) + " candidates need " +
              std::to_string(kAutotuneWarmupSteps + count * kAutotuneMinRounds) +
              " steps, more than --allreduce-tune-steps " + std::to_string(setup_.max_steps) +
              " or a quarter of the " + std::to_string(setup_.steps_left) +
              " steps left); the start-up choice stays");
    return;
  }
  schedule_ = AutotuneSchedule(setup_.first_step, count, rounds);
  seconds_.assign(count, {});
  exposed_.assign(count, {});
  std::string names;
  for (const auto& candidate : candidates_) names += (names.empty() ? "" : ", ") + candidate.name;
  log_.info("allreduce tuning: steps " + std::to_string(schedule_.first_step()) + "-" +
            std::to_string(schedule_.end_step() - 1) + " try " + names + " (" +
            std::to_string(rounds) + " steps each after " + std::to_string(kAutotuneWarmupSteps) +
            " warm-up steps" +
            (tune_size_ ? "; " + format_mib(start_mb) + " buckets unless named" : "") + ")");
}

void AllreduceAutotune::apply(const AutotuneCandidate& candidate) {
  if (gradients_ != nullptr && candidate.bucket_mb != gradients_->bucket_mb()) {
    gradients_->rebucket(candidate.bucket_mb);
  }
  for (size_t k = 0; k < classes_.size(); ++k) {
    if (comm_.allreduce_method_in_use(classes_[k]) != candidate.methods[k]) {
      comm_.allreduce_method_set(classes_[k], candidate.methods[k]);
    }
  }
}

void AllreduceAutotune::before_step(int64_t step) {
  if (decided_) return;
  const int candidate = schedule_.candidate_at(step);
  if (candidate >= 0) apply(candidates_[candidate]);
}

void AllreduceAutotune::record(const StepTimes& times) {
  if (decided_ || !schedule_.measured(times.step)) return;
  const int candidate = schedule_.candidate_at(times.step);
  seconds_[candidate].push_back(times.total() - times.seconds[static_cast<int>(Phase::kDataWait)]);
  exposed_[candidate].push_back(times.seconds[static_cast<int>(Phase::kCommExposed)]);
}

void AllreduceAutotune::decide() {
  // This rank's medians, exactly (hex floats), to every rank.
  std::string mine;
  for (size_t c = 0; c < candidates_.size(); ++c) {
    char text[80];
    std::snprintf(text, sizeof(text), "%a %a ", median(seconds_[c]), median(exposed_[c]));
    mine += text;
  }
  std::vector<std::vector<double>> rank_seconds, rank_exposed;
  for (const auto& entry : comm_.gather_strings(mine)) {
    std::istringstream in(entry);
    rank_seconds.emplace_back();
    rank_exposed.emplace_back();
    std::string seconds, exposed;
    while (in >> seconds >> exposed) {
      rank_seconds.back().push_back(std::strtod(seconds.c_str(), nullptr));
      rank_exposed.back().push_back(std::strtod(exposed.c_str(), nullptr));
    }
  }
  const AutotuneResult result = autotune_decide(rank_seconds, rank_exposed, schedule_.rounds());
  const AutotuneCandidate& chosen = candidates_[result.choice];
  apply(chosen);
  decided_ = true;

  json_ = nlohmann::json::object();
  json_["key"] = key_;
  json_["measure"] =
      "step time without data wait, the slowest rank's median of each candidate's steps";
  json_["first_step"] = schedule_.first_step();
  json_["steps_spent"] = schedule_.steps();
  json_["seconds_lost"] = result.seconds_lost;
  json_["choice"] = chosen.name;
  json_["bucket_mb"] = gradients_->bucket_mb();
  json_["bucket_size_tuned"] = tune_size_;
  // The methods of the chosen layout's buckets; what each rank's
  // communicator uses for them and its bucket size, for the record: the
  // same on every rank.
  json_["methods"] = nlohmann::json::object();
  for (const int64_t bytes : layout_classes()) {
    json_["methods"][std::to_string(bytes)] = comm_.allreduce_method_in_use(bytes);
  }
  record_rank_choices();
  std::string text;
  json_["candidates"] = nlohmann::json::array();
  for (size_t c = 0; c < candidates_.size(); ++c) {
    json_["candidates"].push_back({{"name", candidates_[c].name},
                                   {"bucket_mb", candidates_[c].bucket_mb},
                                   {"step_seconds", result.seconds[c]},
                                   {"exposed_seconds", result.exposed_seconds[c]},
                                   {"steps", seconds_[c].size()}});
    text += "; " + candidates_[c].name + " " + format_ms(result.seconds[c]) + " (exposed " +
            format_ms(result.exposed_seconds[c]) + ")";
  }
  char cost[160];
  std::snprintf(cost, sizeof(cost), "; %lld steps spent, %.2f s lost against the choice",
                static_cast<long long>(schedule_.steps()), result.seconds_lost);
  log_.info("allreduce tuning (step time without data wait, slowest rank's median of " +
            std::to_string(schedule_.rounds()) + ")" + text + " -> " + chosen.name +
            (tune_size_ && chosen.bucket_mb == candidates_.front().bucket_mb
                 ? ", " + format_mib(chosen.bucket_mb) + " buckets"
                 : "") +
            cost);
  if (comm_.rank() == 0) {
    try {  // a record that cannot be written costs the reuse on resume, not the run
      util::write_file_atomically(setup_.stored_path, json_.dump(2) + "\n");
    } catch (const std::exception& e) {
      log_.warn("cannot write " + setup_.stored_path + " (" + e.what() +
                "); a resumed run tunes again");
    }
  }
}

}  // namespace vqa::train
