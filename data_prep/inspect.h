// `vqa_prep inspect FILE`: a summary and a full validation of a dataset file.
#pragma once

#include <cstdint>
#include <string>

namespace vqa::prep {

// Prints counts, the open/closed split, the most frequent answers and the
// first `records` questions of every split, validating the whole file as the
// loader does. Throws DataFormatError on a bad file.
void inspect_run(const std::string& path, int64_t records);

}  // namespace vqa::prep
