#include "train/checkpoint_writer.h"

#include <signal.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/check.h"     // fatal_user_error
#include "train/checkpoint.h"  // checkpoint_write, checkpoint_archive_fill, kExitCheckpointWriteFailed
#include "util/printf_format.h"  // format

namespace vqa::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string seconds_text(double seconds) { return util::format("%.3f s", seconds); }

// The host copy of the state: one tensor per live tensor, in the order
// the archives are built (the same at every save), kept by the writer from
// save to save so that only the first save allocates (and faults in) the
// memory. Being referenced there and in the archive, each copy is pickled as
// a live tensor is (LibTorch memoizes tensors referenced more than once), so
// the file is byte for byte the synchronous save's.
struct HostStaging {
  std::vector<torch::Tensor>& tensors;
  size_t next = 0;
};

// `tensor`'s values in its slot of the staging: copied on the CPU, or into
// pinned memory on the current stream from a GPU (complete after
// host_copies_complete). Same sizes, strides and requires_grad, so the archive
// holds what the live tensor's would.
torch::Tensor host_copy(const torch::Tensor& tensor, HostStaging& staging) {
  if (!tensor.defined()) return tensor;
  torch::NoGradGuard no_grad;
  if (staging.next == staging.tensors.size()) staging.tensors.emplace_back();
  torch::Tensor& copy = staging.tensors[staging.next++];
  if (!copy.defined() || copy.sizes() != tensor.sizes() || copy.strides() != tensor.strides() ||
      copy.dtype() != tensor.dtype()) {
    copy =
        torch::empty_strided(tensor.sizes(), tensor.strides(),
                             tensor.options().device(torch::kCPU).pinned_memory(tensor.is_cuda()));
  }
  copy.copy_(tensor, /*non_blocking=*/tensor.is_cuda());
  copy.requires_grad_(tensor.requires_grad());
  return copy;
}

// The asynchronous copies from a GPU have landed in host memory.
void host_copies_complete(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// Module::save's archive layout (own parameters, own buffers, then each
// serialisable child's archive), from host copies of the tensors.
void module_save_copy(const torch::nn::Module& module, torch::serialize::OutputArchive& archive,
                      HostStaging& held) {
  for (const auto& parameter : module.named_parameters(/*recurse=*/false)) {
    archive.write(parameter.key(), host_copy(parameter.value(), held));
  }
  for (const auto& buffer : module.named_buffers(/*recurse=*/false)) {
    archive.write(buffer.key(), host_copy(buffer.value(), held), /*is_buffer=*/true);
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    module_save_copy(*child.value(), child_archive, held);
    archive.write(child.key(), child_archive);
  }
}

// An AdamW whose state is a host copy of `live`'s. Its parameter groups hold
// the live parameters, for their keys only: LibTorch's optimiser archive
// names each state by its parameter's TensorImpl address, as the live one's.
std::unique_ptr<torch::optim::AdamW> adamw_copy(torch::optim::AdamW& live, HostStaging& held) {
  auto copy = std::make_unique<torch::optim::AdamW>(
      live.param_groups(), static_cast<const torch::optim::AdamWOptions&>(live.defaults()));
  for (const auto& [key, state] : live.state()) {
    auto moments = std::make_unique<torch::optim::AdamWParamState>(
        static_cast<const torch::optim::AdamWParamState&>(*state));
    moments->exp_avg(host_copy(moments->exp_avg(), held));
    moments->exp_avg_sq(host_copy(moments->exp_avg_sq(), held));
    moments->max_exp_avg_sq(host_copy(moments->max_exp_avg_sq(), held));
    copy->state()[key] = std::move(moments);
  }
  return copy;
}

// A save's archives, built from the live tensors (the synchronous save) or
// from host copies of them (the background one).
struct SaveArchives {
  torch::serialize::OutputArchive checkpoint, best;
};

// `staging`: the writer's host copy (nullptr: the archives hold the live tensors).
SaveArchives save_archives_build(model::M3AE& model, VqaOptimizer* optimizer,
                                 const TrainState& state, const std::string& config_ini, bool best,
                                 std::vector<torch::Tensor>* staging) {
  SaveArchives archives;
  std::vector<torch::Tensor> unused;
  HostStaging held{staging ? *staging : unused};
  const bool copy = staging != nullptr;
  torch::serialize::OutputArchive model_archive;
  if (copy) {
    module_save_copy(*model, model_archive, held);
  } else {
    model->save(model_archive);
  }
  if (optimizer) {
    torch::serialize::OutputArchive optimizer_archive;
    if (copy) {
      adamw_copy(optimizer->adamw(), held)->save(optimizer_archive);
    } else {
      optimizer->adamw().save(optimizer_archive);
    }
    checkpoint_archive_fill(archives.checkpoint, model_archive, &optimizer_archive, state,
                            &config_ini);
  }
  // The same model archive in both: it is written, not consumed.
  if (best) checkpoint_archive_fill(archives.best, model_archive, nullptr, state, nullptr);
  if (copy && !model->parameters().empty()) {
    host_copies_complete(model->parameters().front().device());
  }
  return archives;
}

}  // namespace

std::string checkpoint_save(const std::string& out_dir, model::M3AE& model, VqaOptimizer& optimizer,
                            const TrainState& state, const std::string& config_ini,
                            int keep_checkpoints, RunLog* log) {
  SaveArchives archives = save_archives_build(model, &optimizer, state, config_ini,
                                              /*best=*/false, /*staging=*/nullptr);
  return checkpoint_write(out_dir, checkpoint_file_name(state), archives.checkpoint,
                          keep_checkpoints, log);
}

void checkpoint_save_best(const std::string& out_dir, model::M3AE& model, const TrainState& state) {
  SaveArchives archives = save_archives_build(model, nullptr, state, /*config_ini=*/"",
                                              /*best=*/true, /*staging=*/nullptr);
  checkpoint_write_best(out_dir, archives.best);
}

CheckpointWriter::CheckpointWriter(bool asynchronous, int64_t kill_in_write)
    : asynchronous_(asynchronous), kill_in_write_(kill_in_write) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::join(RunLog& log) {
  if (!thread_.joinable()) return;
  thread_.join();
  log.info("checkpoint " + in_flight_ + ": written in the background in " +
           seconds_text(write_seconds_));
  in_flight_.clear();
}

void CheckpointWriter::wait(RunLog& log) { join(log); }

std::string CheckpointWriter::save(const std::string& out_dir, model::M3AE& model,
                                   VqaOptimizer* optimizer, const TrainState& state,
                                   const std::string& config_ini, int keep_checkpoints, bool best,
                                   RunLog& log) {
  const Clock::time_point start = Clock::now();
  const std::string name = optimizer ? checkpoint_file_name(state) : "";
  if (!name.empty()) ++checkpoints_;
  CheckpointProgress progress;
  if (kill_in_write_ > 0 && checkpoints_ == kill_in_write_) {
    // Testing: dies with the temporary file half written, as a node would.
    progress = [](uint64_t bytes) {
      if (bytes >= 4096) raise(SIGKILL);
    };
  }
  std::string path;
  if (!asynchronous_) {
    SaveArchives archives = save_archives_build(model, optimizer, state, config_ini, best, nullptr);
    if (best) checkpoint_write_best(out_dir, archives.best);
    if (!name.empty()) {
      path = checkpoint_write(out_dir, name, archives.checkpoint, keep_checkpoints, &log, progress);
    }
    log.info("checkpoint " + (name.empty() ? std::string("best_model.pt") : name) +
             ": training blocked " + seconds_text(seconds_since(start)) + " (synchronous save)");
    return path;
  }
  // One save in flight: the previous one ends (and frees its copy) first.
  double waited = 0.0;
  if (thread_.joinable()) {
    const bool writing = !written_.load();
    const std::string previous = in_flight_;
    const Clock::time_point wait_start = Clock::now();
    join(log);
    waited = seconds_since(wait_start);
    if (writing) {
      log.info("checkpoint " + (name.empty() ? std::string("best_model.pt") : name) + ": waited " +
               seconds_text(waited) + " for the previous save (" + previous + ") to be written");
    }
  }
  auto archives = std::make_shared<SaveArchives>(
      save_archives_build(model, optimizer, state, config_ini, best, &staging_));
  if (!name.empty()) path = (std::filesystem::path(out_dir) / "checkpoints" / name).string();
  in_flight_ = name.empty() ? "best_model.pt" : name;
  started_ = Clock::now();
  written_ = false;
  thread_ = std::thread([this, archives, out_dir, name, keep_checkpoints, best, progress] {
    try {
      if (best) checkpoint_write_best(out_dir, archives->best);
      // Warnings (an old checkpoint not removed) to stderr: the RunLog is the main thread's.
      if (!name.empty()) {
        checkpoint_write(out_dir, name, archives->checkpoint, keep_checkpoints, nullptr, progress);
      }
    } catch (const std::exception& e) {
      runtime::fatal_user_error(in_flight_ + " in " + out_dir + " not saved: " + e.what(),
                                kExitCheckpointWriteFailed);
    }
    write_seconds_ = seconds_since(started_);
    written_ = true;
  });
  log.info("checkpoint " + in_flight_ + ": training blocked " + seconds_text(seconds_since(start)) +
           " (" + seconds_text(waited) +
           " waiting for the previous save, the rest copying to host memory); writing in the "
           "background");
  return path;
}

}  // namespace vqa::train
