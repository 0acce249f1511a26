// Reading the safetensors format (the tensor file the model ecosystem reads
// and writes; github.com/huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON {"name": {"dtype", "shape",
// "data_offsets": [begin, end]}, ..., "__metadata__": {...}}, then the raw
// little-endian bytes, offsets relative to the end of the header.
// The file is memory-mapped; tensors are copied out on request.
// safetensors_write produces the same format.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace vqa::model {

// A file that is not valid safetensors: what() names the file, the tensor or
// header field and the value.
struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class SafetensorsFile {
 public:
  // Opens and validates the header, which is untrusted input: a JSON object;
  // known dtypes (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL); shapes
  // of sizes whose byte count fits 64 bits (checked, never wrapped) and equals
  // end - begin of data_offsets; begin <= end <= the data section's size; no
  // two tensors overlapping. Throws SafetensorsError naming the file, the
  // tensor, the field and its value; never reads outside the file.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte offsets into the data section
  };

  const std::string& path() const { return path_; }
  // Tensor names in the header, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const Entry& entry(const std::string& name) const;  // throws SafetensorsError for an unknown name
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A CPU tensor holding a copy of the named tensor, in its stored dtype.
  torch::Tensor tensor(const std::string& name) const;

 private:
  void open_and_validate();
  void release();

  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;  // the mapped file
  size_t size_ = 0;
  uint64_t data_begin_ = 0;  // 8 + header length
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// "[577, 768]".
std::string shape_text(const std::vector<int64_t>& shape);

// Serialises `tensors` (any device, a dtype of the list above, each made
// contiguous on the CPU) in name order, the header padded with spaces so that
// the data starts 8-byte aligned, as the Python writer does. `write` gets the
// file's bytes in order; it owns where they go (a durable file, a buffer).
// Throws SafetensorsError for a dtype the format cannot hold here.
void safetensors_write(const std::map<std::string, torch::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(const void* data, size_t size)>& write);

}  // namespace vqa::model
