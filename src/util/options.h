// One option table per program (vqa_train, vqa_prep's commands, the
// benchmarks): each option is declared once, with the field it fills, its
// help text and its default (the field's value when it is declared), and
// --help, the command-line and INI parsers and the resolved values all come
// from that one declaration. Boost.ProgramOptions underneath.
#pragma once

#include <boost/program_options.hpp>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "util/mode_names.h"  // ModeNames, mode_name

namespace vqa::util {

// A bad command line or INI file: an unknown option, a missing required
// one, a value that does not parse. what() names the option and the value.
struct OptionError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The text an option's value is shown and saved as ("true", "0.001", ...).
inline std::string option_text(const std::string& value) { return value; }
inline std::string option_text(bool value) { return value ? "true" : "false"; }
inline std::string option_text(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.10g", value);
  return text;
}
template <typename Integer, typename = std::enable_if_t<std::is_integral_v<Integer>>>
std::string option_text(Integer value) {
  return std::to_string(value);
}

// The values a numeric option accepts: low <= value <= high (low < value
// when low_open); NaN never. OptionTable::parse checks them.
struct Range {
  double low, high;
  bool low_open = false;
  std::string describe() const;  // "in [0, 1]", "in (0, 10]"
};

class OptionTable {
 public:
  // `caption` heads the --help listing ("vqa_train options").
  explicit OptionTable(const std::string& caption);

  // An option with a default: the field's current value. `name` is "long"
  // or "long,s" (a one-letter short form). A bool option alone means true
  // (`--strict`); `--strict false` sets it false.
  template <typename T>
  OptionTable& add(const char* name, T* field, const char* help) {
    auto* semantic =
        boost::program_options::value(field)->default_value(*field, option_text(*field));
    if constexpr (std::is_same_v<T, bool>) semantic->implicit_value(true, "true");
    current_group().add_options()(name, semantic, help);
    remember(name, [field] { return option_text(*field); });
    return *this;
  }
  // A numeric option with the range of values it accepts (help shows it).
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  OptionTable& add(const char* name, T* field, const char* help, Range range) {
    const std::string text = std::string(help) + " [" + range.describe() + "]";
    auto* semantic =
        boost::program_options::value(field)->default_value(*field, option_text(*field));
    current_group().add_options()(name, semantic, text.c_str());
    remember(name, [field] { return option_text(*field); });
    check(name, [field, range]() -> std::string {
      const auto value = static_cast<double>(*field);
      const bool above_low = range.low_open ? value > range.low : value >= range.low;
      if (std::isnan(value) || !above_low || !(value <= range.high)) {
        return "must be " + range.describe() + ", got " + option_text(*field);
      }
      return "";
    });
    return *this;
  }
  // A text option that takes one of `choices` (help lists them); with
  // `implicit`, the option alone (`--name`) means that choice.
  OptionTable& add_choice(const char* name, std::string* field, const char* help,
                          std::vector<std::string> choices, const char* implicit = nullptr);
  // A mode: the command line and the INI file give one of the texts in
  // `names`, parse() sets the field to its value; help lists the texts, and
  // values() prints the field's value (also when it changed after parsing).
  template <typename Enum, typename = std::enable_if_t<std::is_enum_v<Enum>>>
  OptionTable& add_choice(const char* name, Enum* field, const char* help, ModeNames<Enum> names,
                          const char* implicit = nullptr) {
    std::string& text =
        *mode_texts_.emplace_back(std::make_unique<std::string>(mode_name(*field, names)));
    std::vector<std::string> choices;
    for (const auto& entry : names) choices.push_back(entry.first);
    add_choice(name, &text, help, std::move(choices), implicit);
    printers_.back().second = [field, names] { return mode_name(*field, names); };
    // After add_choice's check has refused any other text.
    check(name, [field, &text, names]() -> std::string {
      for (const auto& [entry_text, value] : names) {
        if (entry_text == text) *field = value;
      }
      return "";
    });
    return *this;
  }
  // An option that must be given.
  template <typename T>
  OptionTable& add_required(const char* name, T* field, const char* help) {
    current_group().add_options()(name, boost::program_options::value(field)->required(), help);
    remember(name, [field] { return option_text(*field); });
    return *this;
  }
  // One or more values (`--name a b`); required or not.
  OptionTable& add_list(const char* name, std::vector<std::string>* field, const char* help,
                        bool required);
  // Arguments without an option name fill option `name` (declared before),
  // `count` of them (-1: all).
  OptionTable& positional(const char* name, int count);
  // After the command line, read INI "key = value" lines from the file that
  // option `name` names, when given; the command line wins.
  OptionTable& config_file_option(const char* name);
  // Leaves option `name` out of values() (e.g. the config file's own name).
  OptionTable& not_saved(const char* name);
  // The options declared after this call are listed in --help apart, under
  // `caption`, after all the others (the test-only options, say); parsing,
  // the INI file and values() take them as any other.
  OptionTable& group(const std::string& caption);

  // Parses and fills the fields. Returns false, filling nothing, when --help
  // or -h is among the arguments (print_help then). Throws OptionError, also
  // for a value outside its Range or choices ("--lr nan: must be ...").
  bool parse(const std::vector<std::string>& arguments);
  bool parse(int argc, char** argv);  // argv[0] is the program

  void print_help(std::FILE* out, const std::string& usage) const;
  // "name" -> value text, in declaration order, after parse().
  std::vector<std::pair<std::string, std::string>> values() const;

 private:
  void remember(const char* name, std::function<std::string()> printer);
  // After parsing: `problem` returns "" when option `name`'s value is fine,
  // else what is wrong with it.
  void check(const char* name, std::function<std::string()> problem);
  // Where add() and its kin put an option: the last group(), else the table's own.
  boost::program_options::options_description& current_group();
  // The table's own options with every group after them: what parse() reads
  // and print_help() lists.
  boost::program_options::options_description all_options() const;

  boost::program_options::options_description description_;
  std::vector<std::unique_ptr<boost::program_options::options_description>> groups_;
  boost::program_options::positional_options_description positional_;
  bool has_positional_ = false;
  std::string config_option_;
  std::vector<std::pair<std::string, std::function<std::string()>>> printers_;
  std::vector<std::string> not_saved_;
  std::vector<std::pair<std::string, std::function<std::string()>>> checks_;
  std::vector<std::unique_ptr<std::string>> mode_texts_;  // the texts modes are parsed into
};

}  // namespace vqa::util
