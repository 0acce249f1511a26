// Reading what a vqa_train run wrote, for the tests that start one.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace vqa::testing {

// The records of <out>/metrics.jsonl, one per epoch, in order; empty when
// the file is missing.
inline std::vector<nlohmann::json> read_metrics(const std::string& out) {
  std::vector<nlohmann::json> records;
  std::ifstream file(out + "/metrics.jsonl");
  std::string line;
  while (std::getline(file, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

}  // namespace vqa::testing
