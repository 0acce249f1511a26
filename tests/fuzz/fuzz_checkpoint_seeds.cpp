// Writes the seed corpus of fuzz_checkpoint (tests/fuzz/corpus/checkpoint):
// real checkpoints of the fuzz model (checkpoint_model.h) as checkpoint_save
// and checkpoint_save_best write them, and the damage users meet, each
// prefixed with fuzz_checkpoint's mode byte.
//   fuzz_checkpoint_seeds FOLDER
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "checkpoint_model.h"   // fuzz_checkpoint_model_config
#include "model/m3ae.h"         // M3AE
#include "stored_archive.h"     // stored_archive
#include "train/checkpoint.h"   // checkpoint_save, checkpoint_save_best
#include "train/optimizer.h"    // VqaOptimizer, OptimizerSettings
#include "util/durable_file.h"  // crc32_update

namespace fs = std::filesystem;
using namespace vqa;

namespace {

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string sidecar_of(const std::string& bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "crc32 %08x size %zu",
                util::crc32_update(0, bytes.data(), bytes.size()), bytes.size());
  return text;
}

// Mode bytes (fuzz_checkpoint.cpp): sidecar kind in bits 0-1, weights alone
// in bit 2, records stored with matching checksums in bit 3.
constexpr char kUnverified = 0, kVerified = 1, kOwnSidecar = 2, kWeightsOnly = 4, kStored = 8;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_checkpoint_seeds FOLDER\n");
    return 2;
  }
  const fs::path folder = argv[1];
  fs::create_directories(folder);
  const fs::path scratch = fs::temp_directory_path() / "vqa-fuzz-checkpoint-seeds";
  fs::remove_all(scratch);

  torch::manual_seed(0);
  model::M3AE model(fuzz::fuzz_checkpoint_model_config());
  train::VqaOptimizer optimizer(model, train::OptimizerSettings{});
  for (auto& parameter : model->parameters())
    parameter.mutable_grad() = torch::ones_like(parameter);
  optimizer.step(1);  // so that the archive holds AdamW's moments and step counts
  train::TrainState state;
  state.next_epoch = 2;
  state.global_step = 7;
  state.step_in_epoch = 3;
  state.partial_loss_sums = {1.5, 2.5};
  state.partial_samples = {4, 4};
  const std::string checkpoint =
      read_bytes(train::checkpoint_save(scratch.string(), model, optimizer, state, "[run]\n", 0));
  train::checkpoint_save_best(scratch.string(), model, state);
  const std::string best = read_bytes(scratch / "best_model.pt");

  model::ModelConfig other_config = fuzz::fuzz_checkpoint_model_config();
  other_config.num_answers = 3;
  model::M3AE other(other_config);
  train::checkpoint_save_best((scratch / "other").string(), other, state);
  const std::string other_shape = read_bytes(scratch / "other" / "best_model.pt");

  // Each real archive is 160-450 kB (LibTorch writes a record per tensor):
  // five of them, the damaged ones cut to their first 4 kB, keep the corpus
  // under 2 MB; libFuzzer flips the mode byte and the bits in between itself.
  const std::string head = checkpoint.substr(0, 4096);
  std::string flipped = head;
  flipped[2048] ^= 0x10;
  const auto seed = [&folder](const std::string& name, char mode, const std::string& bytes) {
    std::ofstream(folder / name, std::ios::binary | std::ios::trunc) << mode << bytes;
  };
  seed("checkpoint-verified", kVerified, checkpoint);
  seed("best-model-weights-only", kVerified | kWeightsOnly, best);
  seed("other-shape-weights-only", kUnverified | kWeightsOnly, other_shape);
  // Plain class source and pickles for the mutations to work on.
  seed("checkpoint-stored-records", kVerified | kStored, fuzz::stored_archive(checkpoint));
  seed("best-model-stored-records", kUnverified | kWeightsOnly | kStored,
       fuzz::stored_archive(best));
  seed("truncated", kOwnSidecar, sidecar_of(checkpoint) + "\n" + head);
  seed("truncated-sidecar-matches", kVerified, head);
  seed("flipped-bit", kOwnSidecar, sidecar_of(head) + "\n" + flipped);
  seed("bytes-appended", kOwnSidecar, sidecar_of(head) + "\n" + head + "appended");
  seed("unreadable-sidecar", kOwnSidecar, "crc32 zz size 1\n" + head);
  seed("not-a-zip", kVerified, "PK\x03\x04 this is not a checkpoint");
  seed("empty", kVerified, "");
  fs::remove_all(scratch);
  std::printf("checkpoint %zu bytes, best model %zu bytes; seeds in %s\n", checkpoint.size(),
              best.size(), folder.c_str());
  return 0;
}
