#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

namespace vqa::model {

namespace {

struct DtypeInfo {
  const char* name;
  torch::ScalarType type;
  int64_t bytes;
};

constexpr DtypeInfo kDtypes[] = {{"F64", torch::kFloat64, 8}, {"F32", torch::kFloat32, 4},
                                 {"F16", torch::kFloat16, 2}, {"BF16", torch::kBFloat16, 2},
                                 {"I64", torch::kInt64, 8},   {"I32", torch::kInt32, 4},
                                 {"I16", torch::kInt16, 2},   {"I8", torch::kInt8, 1},
                                 {"U8", torch::kUInt8, 1},    {"BOOL", torch::kBool, 1}};

const DtypeInfo* dtype_info(const std::string& name) {
  for (const auto& info : kDtypes) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

const DtypeInfo* dtype_info(torch::ScalarType type) {
  for (const auto& info : kDtypes) {
    if (type == info.type) return &info;
  }
  return nullptr;
}

// The header is a few MB at most even for large models; more is a damaged length.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  try {
    open_and_validate();
  } catch (...) {
    release();
    throw;
  }
}

void SafetensorsFile::release() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

namespace {

// A JSON value for an error message: scalars and flat arrays as written (at
// most 80 characters), anything nested by its type alone. json::dump recurses
// once per level, and a header is untrusted: [[[[...]]]] 100,000 deep would
// overflow the stack.
std::string json_excerpt(const nlohmann::json& value) {
  const bool flat =
      !value.is_structured() ||
      (value.is_array() && std::all_of(value.begin(), value.end(), [](const nlohmann::json& item) {
         return item.is_primitive();
       }));
  if (!flat) return std::string("(a JSON ") + value.type_name() + ")";
  std::string text = value.dump();
  return text.size() <= 80 ? text : text.substr(0, 77) + "...";
}

// A name from the header for an error message, at most 80 characters.
std::string name_excerpt(const std::string& name) {
  return "'" + (name.size() <= 80 ? name : name.substr(0, 77) + "...") + "'";
}

}  // namespace

void SafetensorsFile::open_and_validate() {
  const std::string& path = path_;
  const auto fail = [this](const std::string& what) -> SafetensorsError {
    return SafetensorsError(path_ + ": " + what);
  };
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw fail(std::string("cannot be opened: ") + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd_, &info) != 0) throw fail(std::string("cannot be read: ") + std::strerror(errno));
  if (!S_ISREG(info.st_mode)) throw fail("is not a regular file");
  size_ = static_cast<size_t>(info.st_size);
  if (size_ < 8)
    throw fail("is " + std::to_string(size_) + " bytes, shorter than a safetensors header");
  void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (mapped == MAP_FAILED) throw fail(std::string("cannot be mapped: ") + std::strerror(errno));
  data_ = static_cast<const uint8_t*>(mapped);

  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | data_[i];  // little-endian
  // The first test keeps 8 + header_bytes from wrapping.
  if (header_bytes > kMaxHeaderBytes || 8 + header_bytes > size_) {
    throw fail("header length " + std::to_string(header_bytes) + " does not fit the file's " +
               std::to_string(size_) + " bytes (not a safetensors file, or truncated)");
  }
  data_begin_ = 8 + header_bytes;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(data_ + 8, data_ + data_begin_);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) {
    throw fail(std::string("header is a JSON ") + header.type_name() + ", not an object");
  }
  const uint64_t data_bytes = size_ - data_begin_;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw fail("__metadata__ is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          throw fail("__metadata__ " + name_excerpt(key) + " is " + json_excerpt(text) +
                     ", not a string");
        }
        metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor " + name_excerpt(name);
    if (!value.is_object()) throw fail(where + " is " + json_excerpt(value) + ", not an object");
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(field)) throw fail(where + " has no " + field);
    }
    Entry entry;
    const auto& dtype_value = value.at("dtype");
    if (!dtype_value.is_string()) {
      throw fail(where + ": dtype " + json_excerpt(dtype_value) + " is not a string");
    }
    entry.dtype = dtype_value.get<std::string>();
    const DtypeInfo* dtype = dtype_info(entry.dtype);
    if (!dtype) throw fail(where + ": dtype " + name_excerpt(entry.dtype) + " is not supported");

    // The byte count in 64 bits with every product checked: unchecked, a
    // shape [2^32, 2^32] of F32 wraps to 0 bytes and passes for data_offsets [0, 0].
    const auto& shape = value.at("shape");
    if (!shape.is_array()) throw fail(where + ": shape " + json_excerpt(shape) + " is not a list");
    uint64_t bytes = static_cast<uint64_t>(dtype->bytes);
    bool overflow = false;
    for (const auto& dimension : shape) {
      if (!dimension.is_number_unsigned() ||
          dimension.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw fail(where + ": shape " + json_excerpt(shape) + " is not a list of sizes");
      }
      entry.shape.push_back(dimension.get<int64_t>());
      // A zero dimension does not excuse the others: LibTorch counts them all too.
      if (entry.shape.back() != 0)
        overflow |= __builtin_mul_overflow(bytes, dimension.get<uint64_t>(), &bytes);
    }
    if (overflow) {
      throw fail(where + ": shape " + shape_text(entry.shape) + " of " + entry.dtype +
                 " has a byte count beyond 64 bits");
    }
    const bool empty = std::find(entry.shape.begin(), entry.shape.end(), 0) != entry.shape.end();
    if (empty) bytes = 0;

    const auto& offsets = value.at("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      throw fail(where + ": data_offsets " + json_excerpt(offsets) + " is not [begin, end]");
    }
    entry.begin = offsets[0].get<uint64_t>();
    entry.end = offsets[1].get<uint64_t>();
    if (entry.begin > entry.end) {
      throw fail(where + ": data_offsets " + json_excerpt(offsets) + " begin after they end");
    }
    if (entry.end > data_bytes) {
      throw fail(where + ": data_offsets " + json_excerpt(offsets) + " lie outside the " +
                 std::to_string(data_bytes) + " data bytes (truncated file?)");
    }
    if (entry.end - entry.begin != bytes) {
      throw fail(where + ": shape " + shape_text(entry.shape) + " of " + entry.dtype + " needs " +
                 std::to_string(bytes) + " bytes, data_offsets " + json_excerpt(offsets) +
                 " give " + std::to_string(entry.end - entry.begin));
    }
    ranges.push_back({entry.begin, entry.end, name});
    entries_.emplace(name, std::move(entry));
  }
  // Empty tensors hold no bytes and overlap nothing.
  ranges.erase(std::remove_if(ranges.begin(), ranges.end(),
                              [](const Range& range) { return range.begin == range.end; }),
               ranges.end());
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      throw fail("tensor " + name_excerpt(ranges[i].name) + " (data_offsets [" +
                 std::to_string(ranges[i].begin) + ", " + std::to_string(ranges[i].end) +
                 "]) overlaps tensor " + name_excerpt(ranges[i - 1].name) + " ([" +
                 std::to_string(ranges[i - 1].begin) + ", " + std::to_string(ranges[i - 1].end) +
                 "])");
    }
  }
}

SafetensorsFile::~SafetensorsFile() { release(); }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  for (const auto& item : entries_) result.push_back(item.first);
  return result;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  const auto found = entries_.find(name);
  if (found == entries_.end()) throw SafetensorsError(path_ + ": no tensor '" + name + "'");
  return found->second;
}

torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const Entry& e = entry(name);
  const DtypeInfo* dtype = dtype_info(e.dtype);
  auto result = torch::empty(e.shape, torch::TensorOptions().dtype(dtype->type));
  if (e.end > e.begin)
    std::memcpy(result.data_ptr(), data_ + data_begin_ + e.begin, e.end - e.begin);
  return result;
}

void safetensors_write(const std::map<std::string, torch::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(const void* data, size_t size)>& write) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const DtypeInfo* dtype = dtype_info(tensor.scalar_type());
    if (!dtype) {
      throw SafetensorsError("tensor '" + name + "': dtype " +
                             std::string(c10::toString(tensor.scalar_type())) +
                             " has no safetensors name here");
    }
    data.push_back(tensor.detach().to(torch::kCPU).contiguous());
    const uint64_t bytes = data.back().nbytes();
    header[name] = {{"dtype", dtype->name},
                    {"shape", std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end())},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  write(length, sizeof(length));
  write(text.data(), text.size());
  for (const auto& tensor : data) {
    if (tensor.nbytes() > 0) write(tensor.data_ptr(), tensor.nbytes());
  }
}

}  // namespace vqa::model
