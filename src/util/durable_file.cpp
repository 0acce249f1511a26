#include "util/durable_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

namespace vqa::util {

namespace {

// Makes a rename inside `directory` durable. Some network file systems
// refuse fsync on a directory (EINVAL); their renames are synchronous.
void fsync_directory(const fs::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error("cannot open " + directory.string() + ": " + system_error_text(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL) {
    throw std::runtime_error("fsync of " + directory.string() +
                             " failed: " + system_error_text(error));
  }
}

}  // namespace

std::string system_error_text(int error) {
  static const std::pair<int, const char*> kNames[] = {
      {ENOSPC, "ENOSPC"}, {EDQUOT, "EDQUOT"}, {EFBIG, "EFBIG"},   {EIO, "EIO"},
      {EROFS, "EROFS"},   {EACCES, "EACCES"}, {ENOENT, "ENOENT"}, {EISDIR, "EISDIR"}};
  std::string name = "errno " + std::to_string(error);
  for (const auto& [code, text] : kNames) {
    if (code == error) name = text;
  }
  return std::string(std::strerror(error)) + " (" + name + ")";
}

// zlib's crc32 takes a uInt length; crc32_z takes size_t, for files over 4 GiB.
// A null pointer would make it return its initial value (LibTorch's zip
// writer does pass empty buffers), so empty pieces are skipped.
uint32_t crc32_update(uint32_t crc, const void* data, size_t size) {
  if (size == 0) return crc;
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), size));
}

DurableFileWriter::DurableFileWriter(std::string path)
    : path_(std::move(path)), temporary_(path_ + ".tmp") {
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) record_system_error("open");
}

DurableFileWriter::~DurableFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.c_str());
}

void DurableFileWriter::record_system_error(const char* call) {
  const int error = errno;
  fail(std::string(call) + " failed after " + std::to_string(bytes_) +
       " bytes: " + system_error_text(error));
}

void DurableFileWriter::fail(const std::string& error) {
  if (error_.empty()) error_ = error;
}

size_t DurableFileWriter::write(const void* data, size_t size) {
  if (!error_.empty() || finished_) return size;
  const char* bytes = static_cast<const char*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t written = ::write(fd_, bytes + done, size - done);
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) {
      bytes_ += done;
      record_system_error("write");
      return size;
    }
    done += static_cast<size_t>(written);
  }
  crc_ = crc32_update(crc_, data, size);
  bytes_ += size;
  return size;
}

void DurableFileWriter::finish() {
  if (finished_) return;
  finished_ = true;
  if (error_.empty() && ::fsync(fd_) != 0) record_system_error("fsync");
  if (fd_ >= 0 && ::close(fd_) != 0 && error_.empty()) record_system_error("close");
  fd_ = -1;
  if (!error_.empty()) throw std::runtime_error("cannot write " + temporary_ + ": " + error_);
}

void DurableFileWriter::commit() {
  finish();
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    throw std::runtime_error("cannot rename " + temporary_ + " to " + path_ + ": " +
                             system_error_text(errno));
  }
  committed_ = true;
  const fs::path parent = fs::path(path_).parent_path();
  fsync_directory(parent.empty() ? fs::path(".") : parent);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  DurableFileWriter file(path);
  file.write(text.data(), text.size());
  file.commit();
}

void read_file_chunks(const std::string& path,
                      const std::function<void(const char* data, size_t size)>& consume) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error(errno == ENOENT ? "does not exist"
                                             : "cannot be opened: " + system_error_text(errno));
  }
  std::vector<char> chunk(1 << 20);
  for (;;) {
    const ssize_t got = ::read(fd, chunk.data(), chunk.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int error = errno;
      ::close(fd);
      throw std::runtime_error("cannot be read: " + system_error_text(error));
    }
    if (got == 0) break;
    consume(chunk.data(), static_cast<size_t>(got));
  }
  ::close(fd);
}

}  // namespace vqa::util
