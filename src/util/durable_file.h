// Files that are either complete or absent, whatever happens while they are
// written: checkpoints, best_model.pt, `latest`, config.ini, diagnosis.json,
// the timeline and DONE. The bytes go to PATH.tmp; only after fsync is the
// temporary renamed onto PATH and the directory fsync'ed, so a kill or a
// power cut leaves PATH as it was or as written, never half of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace vqa::util {

// "No space left on device (ENOSPC)": the text users search for and the name
// administrators know.
std::string system_error_text(int error);

// zlib's CRC-32 (the one of gzip and zip), continued from `crc` (0 to start).
uint32_t crc32_update(uint32_t crc, const void* data, size_t size);

// Writes one file durably (above), keeping the CRC-32 and byte count of what
// it wrote. The first failure is kept and later writes are accepted and
// dropped: LibTorch's zip writer, which calls write() back, may throw from
// its destructor while an exception unwinds, so failures are reported by
// finish() or commit() instead. Destroyed before commit() succeeded, it
// removes the temporary file. One thread.
class DurableFileWriter {
 public:
  // Creates PATH.tmp (truncating one a killed writer left).
  explicit DurableFileWriter(std::string path);
  ~DurableFileWriter();
  DurableFileWriter(const DurableFileWriter&) = delete;
  DurableFileWriter& operator=(const DurableFileWriter&) = delete;

  // Returns `size` always (the serialiser's contract), see above.
  size_t write(const void* data, size_t size);
  // Records a failure found outside (a serialiser's exception).
  void fail(const std::string& error);
  // fsync and close the temporary file. Throws std::runtime_error naming it
  // and the first failure ("... after 4096 bytes: No space left on device
  // (ENOSPC)"). Called by commit() when not called before.
  void finish();
  // Renames the temporary file onto PATH and fsyncs the directory. Throws
  // as finish(); PATH is untouched then.
  void commit();

  uint32_t crc32() const { return crc_; }
  uint64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  void record_system_error(const char* call);

  std::string path_;
  std::string temporary_;
  int fd_ = -1;
  bool finished_ = false;
  bool committed_ = false;
  uint32_t crc_ = 0;
  uint64_t bytes_ = 0;
  std::string error_;
};

// `text` as the whole of `path`, durably. Throws std::runtime_error naming the
// file and the system's error, after removing the temporary file.
void write_file_atomically(const std::string& path, const std::string& text);

// Streams the file to consume(data, size) in pieces of 1 MiB. Throws
// std::runtime_error whose text completes "PATH ..." ("does not exist",
// "cannot be read: Input/output error (EIO)").
void read_file_chunks(const std::string& path,
                      const std::function<void(const char* data, size_t size)>& consume);

}  // namespace vqa::util
