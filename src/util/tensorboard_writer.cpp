#include "util/tensorboard_writer.h"

#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#ifdef VQA_WITH_TENSORBOARD
#include "tensorboard_event.pb.h"
#endif

namespace vqa::util {

namespace {

double seconds_since_epoch() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

uint32_t crc32c_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

#ifdef VQA_WITH_TENSORBOARD

bool tensorboard_writer_built() { return true; }

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  const double now = seconds_since_epoch();
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." +
          host_name() + "." + std::to_string(getpid());
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) {
    throw std::runtime_error("cannot create the TensorBoard event file " + path_ + ": " +
                             std::strerror(errno));
  }
  tensorboard::Event event;
  event.set_wall_time(now);
  event.set_file_version("brain.Event:2");
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::scalars(const std::vector<std::pair<std::string, double>>& values,
                                int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(seconds_since_epoch());
  event.set_step(step);
  for (const auto& [tag, value] : values) {
    auto* entry = event.mutable_summary()->add_value();
    entry->set_tag(tag);
    entry->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::text(const std::string& tag, const std::string& text, int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(seconds_since_epoch());
  event.set_step(step);
  auto* entry = event.mutable_summary()->add_value();
  entry->set_tag(tag);
  entry->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  auto* tensor = entry->mutable_tensor();
  tensor->set_dtype(7);  // DT_STRING; a scalar: no dimensions
  tensor->add_string_val(text);
  write_record(event.SerializeAsString());
}

#else

bool tensorboard_writer_built() { return false; }

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  throw std::runtime_error("no TensorBoard event file in " + dir +
                           ": this build has no TensorBoard writer (CMake found no Protocol "
                           "Buffers: Debian's libprotobuf-dev and protobuf-compiler)");
}

void TensorBoardWriter::scalars(const std::vector<std::pair<std::string, double>>&, int64_t) {}
void TensorBoardWriter::text(const std::string&, const std::string&, int64_t) {}

#endif

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write_record(const std::string& bytes) {
  unsigned char header[12];
  const uint64_t length = bytes.size();
  for (int i = 0; i < 8; ++i) header[i] = static_cast<unsigned char>(length >> (8 * i));
  const uint32_t length_crc = crc32c_masked(crc32c(header, 8));
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<unsigned char>(length_crc >> (8 * i));
  unsigned char footer[4];
  const uint32_t data_crc = crc32c_masked(crc32c(bytes.data(), bytes.size()));
  for (int i = 0; i < 4; ++i) footer[i] = static_cast<unsigned char>(data_crc >> (8 * i));
  const bool written = std::fwrite(header, 1, sizeof(header), file_) == sizeof(header) &&
                       std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size() &&
                       std::fwrite(footer, 1, sizeof(footer), file_) == sizeof(footer) &&
                       std::fflush(file_) == 0;
  if (!written) {
    throw std::runtime_error("cannot write the TensorBoard event file " + path_ + ": " +
                             std::strerror(errno));
  }
}

}  // namespace vqa::util
