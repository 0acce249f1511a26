// printf-style text from up to four numbers: the sentences of the step
// report and of the profile summary.
#pragma once

#include <cstdio>
#include <string>

namespace vqa::util {

// `pattern` takes at most four double conversions; the text is cut at 511
// characters.
inline std::string format(const char* pattern, double a, double b = 0, double c = 0, double d = 0) {
  char text[512];
  std::snprintf(text, sizeof(text), pattern, a, b, c, d);
  return text;
}

}  // namespace vqa::util
