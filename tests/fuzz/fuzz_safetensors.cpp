// Fuzz target: the safetensors reader (src/model/safetensors.cpp), which reads
// weight files users were handed (a converted M3AE release, a colleague's
// fine-tuned weights). The first byte picks how the rest becomes a file:
//   even: the rest is the file's bytes as they are;
//   odd:  the rest is the header's JSON, a newline, then the data; the 8-byte
//         length is written to match, so that mutations of the JSON reach
//         the checks behind the length instead of stopping at it.
// Checked: a refusal is a SafetensorsError whose message starts with the
// file; an accepted file's tensors come back with the dtype, shape and bytes
// its header gives, all inside the file; no other exception, crash or
// sanitizer report.
#include <cstring>
#include <fstream>
#include <string>

#include "fuzz_support.h"       // fuzz_require, fuzz_scratch_path
#include "model/safetensors.h"  // SafetensorsFile, SafetensorsError

namespace {

using vqa::fuzz::fuzz_require;
using vqa::model::SafetensorsError;
using vqa::model::SafetensorsFile;

std::string file_from_input(const uint8_t* data, size_t size) {
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) return rest;
  const size_t newline = rest.find('\n');
  const std::string header = rest.substr(0, newline);
  const std::string bytes = newline == std::string::npos ? "" : rest.substr(newline + 1);
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i)
    file[i] = static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  return file + header + bytes;
}

void check_accepted(const SafetensorsFile& file, const std::string& bytes) {
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<uint8_t>(bytes[i]);
  const uint64_t data_begin = 8 + header;
  fuzz_require(data_begin <= bytes.size(), "accepted a header longer than the file");
  for (const std::string& name : file.names()) {
    const SafetensorsFile::Entry& entry = file.entry(name);
    fuzz_require(entry.begin <= entry.end && entry.end <= bytes.size() - data_begin,
                 "tensor '" + name + "': accepted offsets outside the data");
    const torch::Tensor tensor = file.tensor(name);
    fuzz_require(tensor.sizes().vec() == entry.shape, "tensor '" + name + "': shape differs");
    fuzz_require(static_cast<uint64_t>(tensor.nbytes()) == entry.end - entry.begin,
                 "tensor '" + name + "': " + std::to_string(tensor.nbytes()) +
                     " bytes, data_offsets give " + std::to_string(entry.end - entry.begin));
    fuzz_require(tensor.nbytes() == 0 ||
                     std::memcmp(tensor.data_ptr(), bytes.data() + data_begin + entry.begin,
                                 tensor.nbytes()) == 0,
                 "tensor '" + name + "': bytes differ from the file's");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::string path = vqa::fuzz::fuzz_scratch_path("input.safetensors");
  const std::string bytes = file_from_input(data, size);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    fuzz_require(static_cast<bool>(out), "cannot write " + path);
  }
  try {
    const SafetensorsFile file(path);
    check_accepted(file, bytes);
  } catch (const SafetensorsError& e) {
    fuzz_require(std::string(e.what()).rfind(path + ": ", 0) == 0,
                 std::string("refusal does not start with the file: ") + e.what());
  } catch (const std::exception& e) {
    vqa::fuzz::fuzz_fail(std::string("not a SafetensorsError: ") + e.what());
  }
  return 0;
}
