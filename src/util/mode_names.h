// The text of each value of a mode (an enum option such as --device or
// --precision): one table per enum, next to it, read by the option table
// (parsing, --help, the saved configuration) and by whatever prints a mode.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace vqa::util {

// Each value and its text, in the order --help lists them.
template <typename Enum>
using ModeNames = std::vector<std::pair<std::string, Enum>>;

// The text of `value` ("?" when the table lacks it).
template <typename Enum>
std::string mode_name(Enum value, const ModeNames<Enum>& names) {
  for (const auto& [text, entry] : names) {
    if (entry == value) return text;
  }
  return "?";
}

}  // namespace vqa::util
