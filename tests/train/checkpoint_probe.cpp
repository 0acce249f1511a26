// vqa_checkpoint_probe: writes and reads checkpoints through the job's own
// checkpoint code, for the integrity tests that must kill a writer or limit
// its file size (no MPI).
//
//   vqa_checkpoint_probe write DIR PRESET FIRST COUNT KEEP [FSIZE_AFTER_FIRST]
//     Saves checkpoints of epochs FIRST, FIRST+1, ... (COUNT of them; 0: until
//     killed) into DIR/checkpoints with a model of PRESET whose every
//     parameter equals the epoch number, keeping KEEP. Prints "saved PATH"
//     after each. With FSIZE_AFTER_FIRST, RLIMIT_FSIZE is set to that many
//     bytes after the first save (SIGXFSZ ignored: writes then fail with EFBIG).
//   vqa_checkpoint_probe verify DIR PRESET
//     Loads checkpoint_latest(DIR) and checks that every parameter equals the
//     epoch it was saved after; prints "verified PATH epoch E", exit 0.
#include <signal.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/m3ae.h"          // M3AE
#include "model/model_config.h"  // model_config_preset
#include "train/checkpoint.h"    // checkpoint_save, checkpoint_latest, checkpoint_load
#include "train/optimizer.h"     // VqaOptimizer, OptimizerSettings

using namespace vqa;

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: vqa_checkpoint_probe write DIR PRESET FIRST COUNT KEEP [FSIZE_AFTER_FIRST]\n"
               "       vqa_checkpoint_probe verify DIR PRESET\n");
  return 2;
}

int write_checkpoints(const std::string& out, const std::string& preset, int64_t first,
                      int64_t count, int64_t keep, int64_t fsize_after_first) {
  model::M3AE model(model::model_config_preset(preset));
  train::VqaOptimizer optimizer(model, train::OptimizerSettings{});
  for (int64_t epoch = first; count == 0 || epoch < first + count; ++epoch) {
    {
      torch::NoGradGuard no_grad;
      for (auto& parameter : model->parameters()) parameter.fill_(static_cast<double>(epoch));
    }
    train::TrainState state;
    state.next_epoch = epoch + 1;
    state.global_step = epoch + 1;
    const std::string path = train::checkpoint_save(out, model, optimizer, state, /*config_ini=*/"",
                                                    static_cast<int>(keep));
    std::printf("saved %s\n", path.c_str());
    std::fflush(stdout);
    if (epoch == first && fsize_after_first > 0) {
      signal(SIGXFSZ, SIG_IGN);
      const rlimit limit{static_cast<rlim_t>(fsize_after_first),
                         static_cast<rlim_t>(fsize_after_first)};
      if (setrlimit(RLIMIT_FSIZE, &limit) != 0) {
        std::perror("setrlimit(RLIMIT_FSIZE)");
        return 1;
      }
    }
  }
  return 0;
}

int verify_latest(const std::string& out, const std::string& preset) {
  train::RunLog log(out, /*writer=*/true);  // warnings to stderr
  const std::string path = train::checkpoint_latest(out, log);
  if (path.empty()) {
    std::fprintf(stderr, "no checkpoint in %s\n", out.c_str());
    return 1;
  }
  model::M3AE model(model::model_config_preset(preset));
  train::VqaOptimizer optimizer(model, train::OptimizerSettings{});
  train::TrainState state;
  try {
    train::checkpoint_load(path, model, optimizer, state, log);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  const double epoch = static_cast<double>(state.next_epoch - 1);
  for (const auto& item : model->named_parameters()) {
    const auto wrong = (item.value() != epoch).sum().item<int64_t>();
    if (wrong != 0) {
      std::fprintf(stderr, "%s: %lld values differ from %g\n", item.key().c_str(),
                   static_cast<long long>(wrong), epoch);
      return 1;
    }
  }
  std::printf("verified %s epoch %lld\n", path.c_str(), static_cast<long long>(epoch));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return usage();
  const std::string mode = argv[1];
  if (mode == "write" && (argc == 7 || argc == 8)) {
    return write_checkpoints(argv[2], argv[3], std::atoll(argv[4]), std::atoll(argv[5]),
                             std::atoll(argv[6]), argc == 8 ? std::atoll(argv[7]) : 0);
  }
  if (mode == "verify" && argc == 4) return verify_latest(argv[2], argv[3]);
  return usage();
}
