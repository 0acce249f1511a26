#include "train/checkpoint_sidecar.h"

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "util/durable_file.h"  // DurableFileWriter, write_file_atomically, crc32_update

namespace fs = std::filesystem;

namespace vqa::train {

std::string sidecar_text(uint32_t crc, uint64_t size) {
  char text[64];
  std::snprintf(text, sizeof(text), "crc32 %08" PRIx32 " size %" PRIu64 "\n", crc, size);
  return text;
}

// Reads path's sidecar; on failure `problem` completes "checkpoint PATH ...".
bool sidecar_read(const std::string& path, Sidecar& sidecar, std::string& problem) {
  const std::string sidecar_path = checkpoint_sidecar_path(path);
  std::ifstream file(sidecar_path);
  if (!file) {
    problem = "has no checksum file " + sidecar_path;
    return false;
  }
  std::string line;
  std::getline(file, line);
  unsigned int crc = 0;
  unsigned long long size = 0;
  int consumed = 0;
  if (std::sscanf(line.c_str(), "crc32 %8x size %llu%n", &crc, &size, &consumed) != 2 ||
      consumed != static_cast<int>(line.size())) {
    problem = "has an unreadable checksum file " + sidecar_path + " ('" + line.substr(0, 80) + "')";
    return false;
  }
  sidecar.crc = crc;
  sidecar.size = size;
  return true;
}

// "" when size and CRC match the sidecar; otherwise what is wrong.
std::string sidecar_compare(const Sidecar& sidecar, uint64_t size, uint32_t crc) {
  char text[160];
  if (size < sidecar.size) {
    std::snprintf(text, sizeof(text),
                  "is truncated: %" PRIu64 " bytes, its checksum file says %" PRIu64, size,
                  sidecar.size);
  } else if (size > sidecar.size) {
    std::snprintf(text, sizeof(text),
                  "has %" PRIu64 " bytes, its checksum file says %" PRIu64
                  " (bytes appended, or another file under its name)",
                  size, sidecar.size);
  } else if (crc != sidecar.crc) {
    std::snprintf(text, sizeof(text),
                  "is corrupt: the CRC-32 of its bytes is %08" PRIx32
                  ", its checksum file says %08" PRIx32,
                  crc, sidecar.crc);
  } else {
    return "";
  }
  return text;
}

// F.tmp, fsync, sidecar, rename to F, fsync of the directory. On failure the
// temporary files are gone and F, if it existed, is untouched.
Sidecar archive_write_verified(torch::serialize::OutputArchive& archive, const std::string& path,
                               const CheckpointProgress& progress) {
  util::DurableFileWriter file(path);
  try {
    archive.save_to([&](const void* data, size_t size) {
      file.write(data, size);
      if (progress) progress(file.bytes());
      return size;
    });
  } catch (const c10::Error& e) {
    file.fail(std::string("LibTorch could not serialise it: ") + e.what_without_backtrace());
  }
  file.finish();
  util::write_file_atomically(checkpoint_sidecar_path(path),
                              sidecar_text(file.crc32(), file.bytes()));
  file.commit();
  return {file.crc32(), file.bytes()};
}

// The file's bytes after checking them against its sidecar (a file without
// one is read with a warning). Throws std::runtime_error naming the file.
std::string read_verified(const std::string& path, RunLog& log) {
  std::string bytes;
  try {
    util::read_file_chunks(path,
                           [&bytes](const char* data, size_t size) { bytes.append(data, size); });
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint " + path + " " + e.what());
  }
  Sidecar sidecar;
  std::string problem;
  if (sidecar_read(path, sidecar, problem)) {
    problem =
        sidecar_compare(sidecar, bytes.size(), util::crc32_update(0, bytes.data(), bytes.size()));
    if (!problem.empty()) {
      throw std::runtime_error("checkpoint " + path + " " + problem +
                               " (--resume auto falls back to the newest intact checkpoint)");
    }
  } else if (fs::exists(checkpoint_sidecar_path(path))) {
    throw std::runtime_error("checkpoint " + path + " " + problem);
  } else {
    log.warn("checkpoint " + path + " " + problem + ": loading it unverified");
  }
  return bytes;
}

}  // namespace vqa::train
