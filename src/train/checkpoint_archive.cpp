#include "train/checkpoint_archive.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "util/zip_records.h"  // zip_records, zip_record_bytes

namespace vqa::train {

namespace {

constexpr std::string_view kRootClass = "code/__torch__.py";
constexpr std::string_view kClassDirectory = "code/__torch__/___torch_mangle_";
constexpr std::string_view kDebugSuffix = ".debug_pkl";

// The line, printable and at most 60 characters, for a message.
std::string shown(std::string_view line) {
  std::string text;
  for (const char c : line.substr(0, 60)) {
    text += std::isprint(static_cast<unsigned char>(c)) != 0 ? c : '?';
  }
  return "\"" + text + (line.size() > 60 ? "...\"" : "\"");
}

bool consume(std::string_view& text, std::string_view prefix) {
  if (text.substr(0, prefix.size()) != prefix) return false;
  text.remove_prefix(prefix.size());
  return true;
}

bool all_digits(std::string_view text) {
  return !text.empty() && text.size() <= 9 &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A key as the archive quotes it: "state.next_epoch", "param_groups/0", "0".
bool read_quoted_key(std::string_view& text) {
  if (!consume(text, "\"")) return false;
  const size_t end = text.find('"');
  if (end == 0 || end == std::string_view::npos || end > 256) return false;
  const bool plain =
      std::all_of(text.begin(), text.begin() + static_cast<ptrdiff_t>(end), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' ||
               c == '/' || c == '-';
      });
  text.remove_prefix(end + 1);
  return plain;
}

bool is_keyword(std::string_view word) {
  static const std::set<std::string_view> keywords = {
      "False", "None",     "True",  "and",    "as",   "assert", "async",  "await",    "break",
      "class", "continue", "def",   "del",    "elif", "else",   "except", "finally",  "for",
      "from",  "global",   "if",    "import", "in",   "is",     "lambda", "nonlocal", "not",
      "or",    "pass",     "raise", "return", "try",  "while",  "with",   "yield"};
  return keywords.count(word) > 0;
}

// An attribute name written as a plain identifier; the dunder names appear
// only in the fixed forms the reader matches before.
bool is_attribute_name(std::string_view word) {
  if (word.empty() || word.size() > 256 || consume(word, "__") || is_keyword(word)) return false;
  if (std::isdigit(static_cast<unsigned char>(word.front())) != 0) return false;
  return std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
  });
}

bool is_basic_type(std::string_view type) {
  return type == "Tensor" || type == "int" || type == "float" || type == "bool" || type == "str";
}

// A type: a basic one, Tuple/List/Optional of basic ones, or another class
// of the archive (its number goes to `refers_to`).
bool read_type(std::string_view type, std::vector<long>& refers_to) {
  if (is_basic_type(type)) return true;
  if (consume(type, "__torch__.___torch_mangle_")) {
    const size_t dot = type.find('.');
    if (dot == std::string_view::npos || type.substr(dot) != ".Module") return false;
    if (!all_digits(type.substr(0, dot))) return false;
    refers_to.push_back(std::stol(std::string(type.substr(0, dot))));
    return true;
  }
  if (!(consume(type, "Tuple[") || consume(type, "List[") || consume(type, "Optional["))) {
    return false;
  }
  if (type.empty() || type.back() != ']') return false;
  type.remove_suffix(1);
  while (true) {
    const size_t comma = type.find(", ");
    if (!is_basic_type(type.substr(0, comma))) return false;
    if (comma == std::string_view::npos) return true;
    type.remove_prefix(comma + 2);
  }
}

// `[` then `"KEY", ` any number of times, then `]`.
bool read_key_list(std::string_view text) {
  if (!consume(text, "[")) return false;
  while (!consume(text, "]")) {
    if (!read_quoted_key(text) || !consume(text, ",")) return false;
    consume(text, " ");
  }
  return text.empty();
}

bool read_line(std::string_view line, std::vector<long>& refers_to) {
  if (consume(line, "__parameters__ = ") || consume(line, "__buffers__ = ")) {
    return read_key_list(line);
  }
  if (line == "__annotations__ = []") return true;
  if (consume(line, "__annotations__[")) {
    return read_quoted_key(line) && consume(line, "] = ") && read_type(line, refers_to);
  }
  const size_t colon = line.find(" : ");
  return colon != std::string_view::npos && is_attribute_name(line.substr(0, colon)) &&
         read_type(line.substr(colon + 3), refers_to);
}

// "" when `source` is a class file as vqa-hpc's archives hold; otherwise the
// line that is not.
std::string class_problem(std::string_view source, std::vector<long>& refers_to) {
  int number = 0;
  bool header = false;
  while (!source.empty()) {
    const size_t end = source.find('\n');
    const std::string_view full = source.substr(0, end);
    std::string_view line = full;
    source.remove_prefix(end == std::string_view::npos ? source.size() : end + 1);
    ++number;
    if (line.empty()) continue;
    const bool good = !header ? line == "class Module(Module):"
                              : consume(line, "  ") && read_line(line, refers_to);
    if (!good) return "line " + std::to_string(number) + ": " + shown(full);
    header = true;
  }
  return header ? "" : "is empty";
}

// The class file of mangle number `n`.
std::string class_file(long n) { return std::string(kClassDirectory) + std::to_string(n) + ".py"; }

// True when following the classes' references from `start` meets a cycle.
bool has_cycle(const std::map<std::string, std::vector<long>>& refers, const std::string& start,
               std::map<std::string, int>& state) {
  // 0 unseen, 1 on the current path, 2 done; an explicit stack, so that a
  // long chain cannot overflow ours.
  std::vector<std::pair<std::string, size_t>> stack{{start, 0}};
  state[start] = 1;
  while (!stack.empty()) {
    auto& [file, next] = stack.back();
    const std::vector<long>& children = refers.at(file);
    if (next == children.size()) {
      state[file] = 2;
      stack.pop_back();
      continue;
    }
    const std::string child = class_file(children[next++]);
    const int seen = state[child];
    if (seen == 1) return true;
    if (seen == 0) {
      state[child] = 1;
      stack.emplace_back(child, 0);
    }
  }
  return false;
}

}  // namespace

std::string torch_archive_problem(const std::string& bytes) {
  std::vector<util::ZipRecord> records;
  try {
    records = util::zip_records(bytes);
  } catch (const std::runtime_error& e) {
    return std::string("is not a LibTorch archive: it ") + e.what();
  }
  if (records.empty()) return "is not a LibTorch archive: it is an empty zip file";
  // Every record sits in one folder named after the file that was saved.
  const std::string folder = records.front().name.substr(0, records.front().name.find('/') + 1);
  std::set<std::string> names;
  for (const util::ZipRecord& record : records) {
    if (folder.size() < 2 || record.name.rfind(folder, 0) != 0) {
      return "is not a LibTorch archive: record " + shown(record.name) + " is outside " +
             shown(folder);
    }
    names.insert(record.name.substr(folder.size()));
  }
  std::map<std::string, std::vector<long>> refers;  // class file -> classes it names
  for (const util::ZipRecord& record : records) {
    const std::string name = record.name.substr(folder.size());
    std::string_view rest = name;
    // The tensors' bytes are not parsed, only copied: the sidecar guards them.
    if (consume(rest, "data/")) continue;
    std::string contents;
    try {
      contents = util::zip_record_bytes(bytes, record);
    } catch (const std::runtime_error& e) {
      return std::string("is corrupt: ") + e.what();
    }
    if (!consume(rest, "code/")) continue;
    std::string_view file = name;
    const bool debug = file.size() > kDebugSuffix.size() &&
                       file.substr(file.size() - kDebugSuffix.size()) == kDebugSuffix;
    if (debug) file.remove_suffix(kDebugSuffix.size());
    std::string_view number = file;
    const bool class_name =
        file == kRootClass || (consume(number, kClassDirectory) && number.size() > 3 &&
                               number.substr(number.size() - 3) == ".py" &&
                               all_digits(number.substr(0, number.size() - 3)));
    if (!class_name || (debug && names.count(std::string(file)) == 0)) {
      return "has a record vqa-hpc's archives do not hold: " + shown(name);
    }
    if (debug) continue;
    const std::string problem = class_problem(contents, refers[name]);
    if (!problem.empty()) {
      return "has TorchScript source vqa-hpc does not write: " + name + " " + problem;
    }
  }
  for (const auto& [file, children] : refers) {
    for (const long child : children) {
      if (refers.count(class_file(child)) == 0) {
        return "has TorchScript source that names a class it does not hold: " + file + " names " +
               class_file(child);
      }
    }
  }
  std::map<std::string, int> state;
  for (const auto& entry : refers) {
    if (state[entry.first] == 0 && has_cycle(refers, entry.first, state)) {
      return "has TorchScript classes that contain each other in a cycle, from " + entry.first;
    }
  }
  return "";
}

void torch_archive_load(const std::string& path, const std::string& bytes,
                        const torch::Device& device, torch::serialize::InputArchive& archive) {
  const std::string problem = torch_archive_problem(bytes);
  if (!problem.empty()) throw std::runtime_error("checkpoint " + path + " " + problem);
  // Through a read that stays inside `bytes`: LibTorch's own in-memory
  // reader copies from whatever offset its zip reader asks for.
  const auto read = [&bytes](uint64_t position, void* buffer, size_t count) -> size_t {
    if (position >= bytes.size()) return 0;
    const size_t available = std::min<uint64_t>(count, bytes.size() - position);
    std::memcpy(buffer, bytes.data() + position, available);
    return available;
  };
  try {
    archive.load_from(
        read, [&bytes] { return bytes.size(); }, device);
  } catch (const c10::Error& e) {
    throw std::runtime_error("checkpoint " + path +
                             " is unreadable: " + e.what_without_backtrace());
  } catch (const std::exception& e) {  // e.g. std::out_of_range from a table of LibTorch's
    throw std::runtime_error("checkpoint " + path + " is unreadable: " + e.what());
  }
}

}  // namespace vqa::train
