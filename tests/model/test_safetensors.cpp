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

TEST(Safetensors, RefusesDamagedFilesNamingWhatIsWrong) {
  const std::string data = bytes_of<float>({1.0f, 2.0f});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})",
       "lie outside the 8 data bytes"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       "shape [3] of F32 needs 12 bytes"},
      {R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", "dtype 'Q4' is not supported"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       "two tensors' data overlap"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", "tensor 'a' lacks dtype, shape or data_offsets"},
      {R"({"a": [1, 2)", "header is not JSON"},
  };
  for (const auto& [header, message] : cases) {
    SCOPED_TRACE(header);
    const std::string path = temp_path("bad.safetensors");
    write_file(path, header, data);
    try {
      vqa::model::SafetensorsFile file(path);
      ADD_FAILURE() << "accepted";
    } catch (const vqa::model::SafetensorsError& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    fs::remove(path);
  }
  // Shorter than its header says (a truncated download).
  const std::string path = temp_path("short.safetensors");
  write_file(path, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "");
  std::filesystem::resize_file(path, 20);
  EXPECT_THROW(vqa::model::SafetensorsFile{path}, vqa::model::SafetensorsError);
  fs::remove(path);
}

}  // namespace
