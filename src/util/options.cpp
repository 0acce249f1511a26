#include "util/options.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace po = boost::program_options;

namespace vqa::util {

std::string Range::describe() const {
  const auto bound = [](double value) {
    if (value >= 1e18) return std::string("inf");
    return option_text(value);
  };
  return "in " + std::string(low_open ? "(" : "[") + bound(low) + ", " + bound(high) + "]";
}

OptionTable::OptionTable(const std::string& caption) : description_(caption) {
  description_.add_options()("help,h", "print this help and exit");
}

OptionTable& OptionTable::add_list(const char* name, std::vector<std::string>* field,
                                   const char* help, bool required) {
  auto* semantic = po::value(field)->multitoken();
  if (required) semantic->required();
  current_group().add_options()(name, semantic, help);
  remember(name, [field] {
    std::string text;
    for (const auto& value : *field) text += (text.empty() ? "" : " ") + value;
    return text;
  });
  return *this;
}

OptionTable& OptionTable::add_choice(const char* name, std::string* field, const char* help,
                                     std::vector<std::string> choices, const char* implicit) {
  std::string listed;
  for (const auto& choice : choices) listed += (listed.empty() ? "" : " | ") + choice;
  const std::string text = std::string(help) + " [" + listed + "]";
  auto* semantic = po::value(field)->default_value(*field, *field);
  if (implicit) semantic->implicit_value(implicit, implicit);
  current_group().add_options()(name, semantic, text.c_str());
  remember(name, [field] { return *field; });
  check(name, [field, choices, listed]() -> std::string {
    if (std::find(choices.begin(), choices.end(), *field) != choices.end()) return "";
    return "must be one of " + listed + ", got '" + *field + "'";
  });
  return *this;
}

void OptionTable::check(const char* name, std::function<std::string()> problem) {
  std::string long_name(name);
  checks_.emplace_back(long_name.substr(0, long_name.find(',')), std::move(problem));
}

OptionTable& OptionTable::positional(const char* name, int count) {
  positional_.add(name, count);
  has_positional_ = true;
  return *this;
}

OptionTable& OptionTable::config_file_option(const char* name) {
  config_option_ = name;
  return not_saved(name);
}

OptionTable& OptionTable::not_saved(const char* name) {
  not_saved_.emplace_back(name);
  return *this;
}

OptionTable& OptionTable::group(const std::string& caption) {
  groups_.push_back(std::make_unique<po::options_description>(caption));
  return *this;
}

po::options_description& OptionTable::current_group() {
  return groups_.empty() ? description_ : *groups_.back();
}

po::options_description OptionTable::all_options() const {
  po::options_description all(description_);
  for (const auto& group : groups_) all.add(*group);
  return all;
}

void OptionTable::remember(const char* name, std::function<std::string()> printer) {
  std::string long_name(name);
  long_name = long_name.substr(0, long_name.find(','));
  printers_.emplace_back(long_name, std::move(printer));
}

bool OptionTable::parse(const std::vector<std::string>& arguments) {
  // --help wins over everything else, missing required options included.
  for (const auto& argument : arguments) {
    if (argument == "--help" || argument == "-h") return false;
  }
  po::variables_map values;
  const po::options_description options = all_options();  // the parsers keep a pointer to it
  try {
    po::command_line_parser parser(arguments);
    // No abbreviations: Boost would take a typo such as --epoch for --epochs
    // and run with it; an option must be spelt out.
    parser.style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing);
    parser.options(options);
    if (has_positional_) parser.positional(positional_);
    po::store(parser.run(), values);
    if (!config_option_.empty() && values.count(config_option_)) {
      const std::string path = values[config_option_].as<std::string>();
      if (!path.empty()) {
        std::ifstream file(path);
        if (!file) throw OptionError("--" + config_option_ + ": cannot open '" + path + "'");
        po::store(po::parse_config_file(file, options), values);
      }
    }
    po::notify(values);
  } catch (const po::error& e) {
    throw OptionError(e.what());
  }
  for (const auto& [name, problem] : checks_) {
    const std::string text = problem();
    if (!text.empty()) throw OptionError("--" + name + " " + text);
  }
  return true;
}

bool OptionTable::parse(int argc, char** argv) {
  return parse(std::vector<std::string>(argv + 1, argv + argc));
}

void OptionTable::print_help(std::FILE* out, const std::string& usage) const {
  std::ostringstream text;
  text << all_options();
  std::fprintf(out, "%s\n%s", usage.c_str(), text.str().c_str());
  std::fflush(out);
}

std::vector<std::pair<std::string, std::string>> OptionTable::values() const {
  std::vector<std::pair<std::string, std::string>> result;
  for (const auto& [name, print] : printers_) {
    if (std::find(not_saved_.begin(), not_saved_.end(), name) == not_saved_.end()) {
      result.emplace_back(name, print());
    }
  }
  return result;
}

}  // namespace vqa::util
