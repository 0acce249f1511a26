#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

void SafetensorsFile::open_and_validate() {
  const std::string& path = path_;
  const auto fail = [this](const std::string& what) -> SafetensorsError {
    return SafetensorsError(path_ + ": " + what);
  };
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw fail(std::string("cannot be opened: ") + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd_, &info) != 0) throw fail(std::string("cannot be read: ") + std::strerror(errno));
  size_ = static_cast<size_t>(info.st_size);
  if (size_ < 8)
    throw fail("is " + std::to_string(size_) + " bytes, shorter than a safetensors header");
  void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (mapped == MAP_FAILED) throw fail(std::string("cannot be mapped: ") + std::strerror(errno));
  data_ = static_cast<const uint8_t*>(mapped);

  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | data_[i];  // little-endian
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
  if (!header.is_object()) throw fail("header is not a JSON object");
  const uint64_t data_bytes = size_ - data_begin_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw fail("__metadata__ is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) throw fail("__metadata__ '" + key + "' is not a string");
        metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets")) {
      throw fail(where + " lacks dtype, shape or data_offsets");
    }
    Entry entry;
    if (!value["dtype"].is_string()) throw fail(where + ": dtype is not a string");
    entry.dtype = value["dtype"].get<std::string>();
    const DtypeInfo* dtype = dtype_info(entry.dtype);
    if (!dtype) throw fail(where + ": dtype '" + entry.dtype + "' is not supported");
    int64_t elements = 1;
    if (!value["shape"].is_array()) throw fail(where + ": shape is not an array");
    for (const auto& dimension : value["shape"]) {
      if (!dimension.is_number_integer() || dimension.get<int64_t>() < 0) {
        throw fail(where + ": shape " + value["shape"].dump() + " is not a list of sizes");
      }
      entry.shape.push_back(dimension.get<int64_t>());
      elements *= entry.shape.back();
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      throw fail(where + ": data_offsets " + offsets.dump() + " is not [begin, end]");
    }
    entry.begin = offsets[0].get<uint64_t>();
    entry.end = offsets[1].get<uint64_t>();
    if (entry.begin > entry.end || entry.end > data_bytes) {
      throw fail(where + ": data_offsets " + offsets.dump() + " lie outside the " +
                 std::to_string(data_bytes) + " data bytes (truncated file?)");
    }
    if (entry.end - entry.begin != static_cast<uint64_t>(elements * dtype->bytes)) {
      throw fail(where + ": shape " + shape_text(entry.shape) + " of " + entry.dtype + " needs " +
                 std::to_string(elements * dtype->bytes) + " bytes, data_offsets give " +
                 std::to_string(entry.end - entry.begin));
    }
    ranges.emplace_back(entry.begin, entry.end);
    entries_.emplace(name, std::move(entry));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) throw fail("two tensors' data overlap");
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
