// TensorBoard's event files, written by the job itself: `tensorboard
// --logdir runs/` shows every run directory that holds one, side by side.
//
// A file is a sequence of records (TensorFlow's TFRecord framing: the
// length as 8 bytes little-endian, its masked CRC-32C, the bytes, their
// masked CRC-32C), each an Event (tensorboard_event.proto): first the file
// version, then summaries of tagged scalars or texts at a global step. A
// resumed run writes a new file in the same directory; TensorBoard joins a
// directory's files by step, so the curves go on.
//
// Built where CMake found Protocol Buffers (libprotobuf and protoc); where
// it did not, tensorboard_writer_built() is false and the constructor
// throws, saying so.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace vqa::util {

bool tensorboard_writer_built();

// CRC-32C (Castagnoli) of `size` bytes, and TensorFlow's masked form of a
// CRC that the record framing stores.
uint32_t crc32c(const void* data, size_t size);
uint32_t crc32c_masked(uint32_t crc);

class TensorBoardWriter {
 public:
  // Creates <dir>/events.out.tfevents.<unix seconds>.<host>.<pid> and writes
  // the version record. Throws std::runtime_error naming the file.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  const std::string& path() const { return path_; }
  // One event at `step` with these scalars (stored as float32, as
  // TensorBoard's simple_value is).
  void scalars(const std::vector<std::pair<std::string, double>>& values, int64_t step);
  // One event at `step` holding `text` under `tag` for TensorBoard's text
  // plugin (Markdown).
  void text(const std::string& tag, const std::string& text, int64_t step);

 private:
  void write_record(const std::string& bytes);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace vqa::util
