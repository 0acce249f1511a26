// Replays fuzz inputs through a target's LLVMFuzzerTestOneInput without
// libFuzzer (any compiler): every file of every folder named on the command
// line (the seed corpus and the regression inputs of tests/fuzz). A crash, a
// sanitizer report or a violated invariant (abort) fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_support.h"  // LLVMFuzzerTestOneInput

namespace {

std::vector<std::string>& folders() {
  static std::vector<std::string> list;
  return list;
}

TEST(FuzzReplay, EveryInputRunsCleanly) {
  ASSERT_FALSE(folders().empty()) << "usage: replay FOLDER...";
  size_t inputs = 0;
  for (const std::string& folder : folders()) {
    ASSERT_TRUE(std::filesystem::is_directory(folder)) << folder;
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(folder)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && name != "README.md" && name[0] != '.') {
        files.push_back(entry.path());
      }
    }
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      SCOPED_TRACE(file.string());
      std::ifstream stream(file, std::ios::binary);
      ASSERT_TRUE(stream) << file;
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(stream)),
                                       std::istreambuf_iterator<char>());
      EXPECT_EQ(LLVMFuzzerTestOneInput(bytes.data(), bytes.size()), 0);
      ++inputs;
    }
  }
  // An empty corpus would make this test pass without running anything.
  EXPECT_GT(inputs, 0u);
  std::printf("replayed %zu inputs\n", inputs);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) folders().push_back(argv[i]);
  return RUN_ALL_TESTS();
}
