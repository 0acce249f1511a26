// Fuzz target: the checkpoint loader (src/train/checkpoint.cpp), which reads
// files users were handed (--init-from, --resume, --eval-only): the CRC-32
// sidecar check, then LibTorch's archive reader, then our copy of every
// tensor into the model, the optimiser and the run state. Between the two,
// the archive check (its zip, every record's CRC-32, its TorchScript source). The first byte
// picks the sidecar and the loader:
//   bits 0-1: 0 no sidecar (loaded unverified); 1 a sidecar that matches the
//             bytes, so that mutations reach LibTorch; 2 the rest is the
//             sidecar's text, a newline, then the checkpoint; 3 as 1;
//   bit 2:    checkpoint_load_model (weights alone) instead of checkpoint_load;
//   bit 3:    the rest is rewritten with every record stored and every zip
//             checksum matching (stored_archive.h) before the sidecar is made,
//             so that mutated class source and pickles reach the archive
//             check (checkpoint_archive.h) and, past it, LibTorch.
// The seed corpus (corpus/checkpoint, written by fuzz_checkpoint_seeds) holds
// real checkpoints of a small model (checkpoint_model.h), also with stored
// records, and damaged ones.
// Checked: checkpoint_verify returns (never throws); a refusal is a
// std::runtime_error whose message starts with "checkpoint <file> "; no other
// exception, crash or sanitizer report.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint_model.h"   // fuzz_checkpoint_model_config
#include "fuzz_support.h"       // fuzz_require, fuzz_fail, fuzz_scratch_path
#include "model/m3ae.h"         // M3AE
#include "stored_archive.h"     // stored_archive
#include "train/checkpoint.h"   // checkpoint_load, checkpoint_load_model, checkpoint_verify
#include "train/optimizer.h"    // VqaOptimizer, OptimizerSettings
#include "train/train_log.h"    // RunLog
#include "util/durable_file.h"  // crc32_update

namespace {

using vqa::fuzz::fuzz_require;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  fuzz_require(static_cast<bool>(out), "cannot write " + path);
}

struct Loader {
  vqa::model::M3AE model{vqa::fuzz::fuzz_checkpoint_model_config()};
  vqa::train::VqaOptimizer optimizer{model, vqa::train::OptimizerSettings{}};
  vqa::train::RunLog log{"", /*writer=*/false};  // warnings are not checked here
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static Loader* loader = new Loader();  // built once; never destroyed (no exit-time order issues)
  static const std::string path = vqa::fuzz::fuzz_scratch_path("checkpoint.pt");
  static const std::string sidecar = vqa::train::checkpoint_sidecar_path(path);
  const int mode = data[0];
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (mode & 8) bytes = vqa::fuzz::stored_archive(bytes);
  std::error_code error;
  std::filesystem::remove(sidecar, error);
  if ((mode & 3) == 2) {
    const size_t newline = bytes.find('\n');
    write_bytes(sidecar, bytes.substr(0, newline));
    bytes = newline == std::string::npos ? "" : bytes.substr(newline + 1);
  } else if ((mode & 3) != 0) {
    char text[64];
    std::snprintf(text, sizeof(text), "crc32 %08x size %zu\n",
                  vqa::util::crc32_update(0, bytes.data(), bytes.size()), bytes.size());
    write_bytes(sidecar, text);
  }
  write_bytes(path, bytes);

  const vqa::train::CheckpointCheck check = vqa::train::checkpoint_verify(path);
  if ((mode & 3) == 1 || (mode & 3) == 3) {
    fuzz_require(check.good, "matching sidecar refused: " + check.problem);
  }
  fuzz_require(check.good == check.problem.empty(), "verify: good and problem disagree");
  try {
    vqa::train::TrainState state;
    if (mode & 4) {
      vqa::train::checkpoint_load_model(path, loader->model, loader->log);
    } else {
      vqa::train::checkpoint_load(path, loader->model, loader->optimizer, state, loader->log);
    }
    // What an accepted input loaded must not shape how the next one loads.
    delete loader;
    loader = new Loader();
  } catch (const std::runtime_error& e) {
    fuzz_require(std::string(e.what()).rfind("checkpoint " + path + " ", 0) == 0,
                 std::string("refusal does not name the file: ") + e.what());
  } catch (const std::exception& e) {
    vqa::fuzz::fuzz_fail(std::string("not a std::runtime_error: ") + e.what());
  }
  return 0;
}
