// The sidecar of a checkpoint file F (F.crc32: "crc32 XXXXXXXX size N") and
// the durable write and verified read built on it (checkpoint.h says why).
// Shared by the single-file checkpoints and the parts of sharded ones.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "train/checkpoint.h"  // CheckpointProgress
#include "train/train_log.h"   // RunLog

namespace vqa::train {

struct Sidecar {
  uint32_t crc = 0;
  uint64_t size = 0;
};

// The sidecar's one line.
std::string sidecar_text(uint32_t crc, uint64_t size);

// Reads path's sidecar; on failure `problem` completes "checkpoint PATH ...".
bool sidecar_read(const std::string& path, Sidecar& sidecar, std::string& problem);

// "" when size and CRC match the sidecar; otherwise what is wrong.
std::string sidecar_compare(const Sidecar& sidecar, uint64_t size, uint32_t crc);

// F.tmp, fsync, sidecar, rename to F, fsync of the directory. On failure the
// temporary files are gone and F, if it existed, is untouched. Returns the
// sidecar written.
Sidecar archive_write_verified(torch::serialize::OutputArchive& archive, const std::string& path,
                               const CheckpointProgress& progress = {});

// The file's bytes after checking them against its sidecar (a file without
// one is read with a warning). Throws std::runtime_error naming the file.
std::string read_verified(const std::string& path, RunLog& log);

}  // namespace vqa::train
