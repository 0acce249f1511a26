// The safetensors reader on files written here byte by byte from the format's
// description: values of every float dtype come back exactly, and each kind
// of damage is refused with a message naming the file and what is wrong;
// what safetensors_write writes reads back exactly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/safetensors.h"  // SafetensorsFile, SafetensorsError, safetensors_write

namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("vqa-safetensors-" + name)).string();
}

// 8-byte little-endian header length, the header, the data.
void write_file(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((length >> (8 * i)) & 0xff));
  out << header << data;
}

template <typename T>
std::string bytes_of(std::initializer_list<T> values) {
  std::string bytes;
  for (T v : values) bytes.append(reinterpret_cast<const char*>(&v), sizeof(T));
  return bytes;
}

TEST(Safetensors, ReadsEveryFloatDtypeExactly) {
  const std::string path = temp_path("good.safetensors");
  // 1.5 and -2.0 in float16 (0x3e00, 0xc000) and bfloat16 (0x3fc0, 0xc000).
  const std::string data = bytes_of<float>({1.0f, -0.5f, 3.25f, 7.0f, 0.0f, -1e-3f}) +
                           bytes_of<uint16_t>({0x3e00, 0xc000}) +
                           bytes_of<uint16_t>({0x3fc0, 0xc000});
  write_file(path,
             R"({"__metadata__":{"format":"pt"},)"
             R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
             R"("h":{"dtype":"F16","shape":[2],"data_offsets":[24,28]},)"
             R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[28,32]}})",
             data);
  vqa::model::SafetensorsFile file(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"a", "b", "h"}));
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_TRUE(torch::equal(file.tensor("a"),
                           torch::tensor({1.0f, -0.5f, 3.25f, 7.0f, 0.0f, -1e-3f}).view({2, 3})));
  EXPECT_TRUE(torch::equal(file.tensor("h").to(torch::kFloat32), torch::tensor({1.5f, -2.0f})));
  EXPECT_TRUE(torch::equal(file.tensor("b").to(torch::kFloat32), torch::tensor({1.5f, -2.0f})));
  EXPECT_THROW(file.tensor("missing"), vqa::model::SafetensorsError);
  fs::remove(path);
}

TEST(Safetensors, WrittenFilesReadBackExactly) {
  const std::string path = temp_path("written.safetensors");
  const std::map<std::string, torch::Tensor> tensors = {
      {"b.weight", torch::randn({3, 5})},
      {"a.ids", torch::arange(7, torch::kInt64).unsqueeze(0)},
      {"c.scalar", torch::tensor(2.5f)},
      {"d.empty", torch::zeros({0, 4})},
      {"e.strided", torch::randn({4, 6}).t()}};  // not contiguous
  std::string bytes;
  vqa::model::safetensors_write(tensors, {{"format", "pt"}},
                                [&bytes](const void* data, size_t size) {
                                  bytes.append(static_cast<const char*>(data), size);
                                });
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + header) % 8, 0u) << "the data starts 8-byte aligned";
  std::ofstream(path, std::ios::binary) << bytes;
  vqa::model::SafetensorsFile file(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  ASSERT_EQ(file.names().size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    EXPECT_EQ(file.tensor(name).scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(file.tensor(name), tensor)) << name;
  }
  EXPECT_THROW(vqa::model::safetensors_write({{"x", torch::zeros({2}, torch::kComplexFloat)}}, {},
                                             [](const void*, size_t) {}),
               vqa::model::SafetensorsError);
  fs::remove(path);
}

// Writes `bytes` to a file of its own, opens it, and checks that the reader
// refuses it with a message that starts with the file and holds `message`.
void expect_refused(const std::string& bytes, const std::string& message) {
  const std::string path = temp_path("bad.safetensors");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  try {
    vqa::model::SafetensorsFile file(path);
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const vqa::model::SafetensorsError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos)
        << e.what() << "\n  expected: " << message;
  }
  fs::remove(path);
}

// 8-byte little-endian header length, the header, the data, in memory.
std::string file_bytes(const std::string& header, const std::string& data) {
  std::string bytes;
  const uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return bytes + header + data;
}

TEST(Safetensors, RefusesDamagedHeadersNamingTensorFieldAndValue) {
  const std::string data = bytes_of<float>({1.0f, 2.0f});  // 8 data bytes
  const std::vector<std::pair<std::string, std::string>> cases = {
      // Offsets past the end of the data section, or reversed.
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})",
       "tensor 'a': data_offsets [0,16] lie outside the 8 data bytes"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551615,8]}})",
       "tensor 'a': data_offsets [18446744073709551615,8] begin after they end"},
      {R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})",
       "tensor 'a': data_offsets [8,0] begin after they end"},
      // Overlapping tensors: both named, with their offsets.
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       "tensor 'b' (data_offsets [2, 6]) overlaps tensor 'a' ([0, 4])"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
       "tensor 'b' (data_offsets [4, 6]) overlaps tensor 'a' ([0, 8])"},
      // A dtype or shape that does not match the byte count.
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       "tensor 'a': shape [3] of F32 needs 12 bytes, data_offsets [0,8] give 8"},
      {R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})",
       "tensor 'a': shape [2] of F64 needs 16 bytes, data_offsets [0,8] give 8"},
      // Sizes whose byte count overflows 64 bits: unchecked, 2^32 * 2^32 * 4
      // wraps to 0 and matches data_offsets [0, 0].
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
       "tensor 'a': shape [4294967296, 4294967296] of F32 has a byte count beyond 64 bits"},
      {R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})",
       "tensor 'a': shape [4611686018427387904] of F32 has a byte count beyond 64 bits"},
      {R"({"a":{"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})",
       "tensor 'a': shape [0, 4294967296, 4294967296] of U8 has a byte count beyond 64 bits"},
      {R"({"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,8]}})",
       "tensor 'a': shape [9223372036854775808] is not a list of sizes"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
       "tensor 'a': shape [-2] is not a list of sizes"},
      {R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})",
       "tensor 'a': shape [2.5] is not a list of sizes"},
      {R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})",
       "tensor 'a': shape \"2\" is not a list"},
      // Unknown dtypes, fields missing or of the wrong type.
      {R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})",
       "tensor 'a': dtype 'Q4' is not supported"},
      {R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})",
       "tensor 'a': dtype 4 is not a string"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", "tensor 'a' has no data_offsets"},
      {R"({"a":{"shape":[2],"data_offsets":[0,8]}})", "tensor 'a' has no dtype"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})",
       "tensor 'a': data_offsets [0,-8] is not [begin, end]"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})",
       "tensor 'a': data_offsets [0,4,8] is not [begin, end]"},
      {R"({"a":[1,2]})", "tensor 'a' is [1,2], not an object"},
      {R"({"__metadata__":{"format":1}})", "__metadata__ 'format' is 1, not a string"},
      // Header JSON that is not an object, or not JSON.
      {R"([{"dtype":"F32","shape":[2],"data_offsets":[0,8]}])",
       "header is a JSON array, not an object"},
      {R"("a")", "header is a JSON string, not an object"},
      {R"({"a": [1, 2)", "header is not JSON"},
  };
  for (const auto& [header, message] : cases) {
    SCOPED_TRACE(header);
    expect_refused(file_bytes(header, data), message);
  }
}

TEST(Safetensors, RefusesNestingWithoutRecursingIntoIt) {
  // json::dump recurses once per level: a shape nested 200,000 deep, written
  // into the message, would overflow the stack.
  const std::string nested = std::string(200000, '[') + std::string(200000, ']');
  expect_refused(
      file_bytes(R"({"a":{"dtype":"F32","shape":)" + nested + R"(,"data_offsets":[0,8]}})",
                 bytes_of<float>({1.0f, 2.0f})),
      "tensor 'a': shape (a JSON array) is not a list of sizes");
}

TEST(Safetensors, RefusesTruncatedAndShortFiles) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string whole = file_bytes(header, bytes_of<float>({1.0f, 2.0f}));
  // Cut inside the data (a truncated download): the tensor's offsets say where.
  expect_refused(whole.substr(0, whole.size() - 3),
                 "tensor 'a': data_offsets [0,8] lie outside the 5 data bytes (truncated file?)");
  // Cut inside the header.
  expect_refused(whole.substr(0, 20), "header length " + std::to_string(header.size()) +
                                          " does not fit the file's 20 bytes");
  // A header length that would wrap 8 + length around 2^64.
  expect_refused(std::string(8, '\xff') + "{}", "header length 18446744073709551615 does not fit");
  expect_refused("abc", "is 3 bytes, shorter than a safetensors header");
  expect_refused("", "is 0 bytes, shorter than a safetensors header");
}

TEST(Safetensors, AcceptsEmptyTensorsAnywhere) {
  // Zero bytes overlap nothing, whatever their offset (the Python writer
  // gives them the offset of the next tensor).
  const std::string path = temp_path("empty.safetensors");
  std::ofstream(path, std::ios::binary)
      << file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]}})",
                    bytes_of<float>({1.0f, 2.0f}));
  vqa::model::SafetensorsFile file(path);
  EXPECT_EQ(file.tensor("e").sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(torch::equal(file.tensor("a"), torch::tensor({1.0f, 2.0f})));
  fs::remove(path);
}

}  // namespace
