#include "train/checkpoint_writer.h"

#include <signal.h>

#include <array>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/check.h"     // fatal_user_error
#include "train/checkpoint.h"  // checkpoint_write, checkpoint_archive_fill, kExitCheckpointWriteFailed
#include "train/checkpoint_shards.h"  // checkpoint_part_write, checkpoint_parts_await
#include "train/optimizer_impl.h"     // optimizer_state_key
#include "util/printf_format.h"       // format

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

// True when the moments are host tensors (no copy from a GPU to wait for).
bool moments_on_host(const VqaOptimizer::OwnedMoments& owned) {
  return owned.exp_avg.empty() || !owned.exp_avg.front().is_cuda();
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

// The host copies of the moments, per parameter (its TensorImpl): the
// state map's order is its keys', known only once the states exist, so
// prepare() allocates these by parameter instead of in archive order.
using MomentStaging = std::map<const void*, std::vector<torch::Tensor>>;

// An AdamW whose state is a host copy of `live`'s. Its parameter groups hold
// the live parameters, for their keys only: LibTorch's optimiser archive
// names each state by its parameter's TensorImpl address, as the live one's.
std::unique_ptr<torch::optim::AdamW> adamw_copy(torch::optim::AdamW& live, MomentStaging& staging) {
  auto copy = std::make_unique<torch::optim::AdamW>(
      live.param_groups(), static_cast<const torch::optim::AdamWOptions&>(live.defaults()));
  using Key = typename std::decay_t<decltype(live.state())>::key_type;
  std::map<Key, const void*> parameter_of;
  for (const auto& group : live.param_groups()) {
    for (const auto& parameter : group.params()) {
      parameter_of[optimizer_state_key<Key>(parameter)] = parameter.unsafeGetTensorImpl();
    }
  }
  for (const auto& [key, state] : live.state()) {
    auto moments = std::make_unique<torch::optim::AdamWParamState>(
        static_cast<const torch::optim::AdamWParamState&>(*state));
    const auto found = parameter_of.find(key);
    HostStaging held{staging[found == parameter_of.end() ? nullptr : found->second]};
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

// `staging`: the writer's host copy (nullptr: the archives hold the live
// tensors). optimizer_parts > 0: a sharded checkpoint's main file, whose
// optimiser archive has no moments (they are in the parts).
SaveArchives save_archives_build(model::M3AE& model, VqaOptimizer* optimizer,
                                 const TrainState& state, const std::string& config_ini, bool best,
                                 std::vector<torch::Tensor>* staging, MomentStaging* moment_staging,
                                 int optimizer_parts = 0) {
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
      adamw_copy(optimizer->adamw(), *moment_staging)->save(optimizer_archive);
    } else {
      optimizer->adamw().save(optimizer_archive);
    }
    checkpoint_archive_fill(archives.checkpoint, model_archive, &optimizer_archive, state,
                            &config_ini);
    if (optimizer_parts > 0) {
      archives.checkpoint.write("optimizer_parts",
                                torch::tensor(static_cast<int64_t>(optimizer_parts)));
    }
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
                                              /*best=*/false, /*staging=*/nullptr, nullptr);
  return checkpoint_write(out_dir, checkpoint_file_name(state), archives.checkpoint,
                          keep_checkpoints, log);
}

void checkpoint_save_best(const std::string& out_dir, model::M3AE& model, const TrainState& state) {
  SaveArchives archives = save_archives_build(model, nullptr, state, /*config_ini=*/"",
                                              /*best=*/true, /*staging=*/nullptr, nullptr);
  checkpoint_write_best(out_dir, archives.best);
}

CheckpointWriter::CheckpointWriter(bool asynchronous, int64_t kill_in_write, int rank, int parts)
    : asynchronous_(asynchronous), kill_in_write_(kill_in_write), rank_(rank), parts_(parts) {}

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

int64_t CheckpointWriter::prepare(model::M3AE& model, VqaOptimizer& optimizer) {
  if (!asynchronous_) return 0;
  torch::NoGradGuard no_grad;
  int64_t bytes = 0;
  // The copy itself faults every page in, as the first save would in the step.
  if (rank_ == 0) {
    HostStaging held{staging_};
    torch::serialize::OutputArchive scratch;
    module_save_copy(*model, scratch, held);
    for (const auto& tensor : staging_) bytes += tensor.defined() ? tensor.nbytes() : 0;
  }
  if (optimizer.sharded()) {
    const auto owned = optimizer.owned_moments(/*with_replicated=*/rank_ == 0);
    const auto device =
        owned.exp_avg.empty() ? torch::Device(torch::kCPU) : owned.exp_avg[0].device();
    for (auto& moments : part_staging_) {
      moments = torch::zeros(
          {owned.elements},
          torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(device.is_cuda()));
      bytes += moments.nbytes();
    }
  } else if (rank_ == 0) {
    for (const auto& group : optimizer.adamw().param_groups()) {
      for (const auto& parameter : group.params()) {
        auto& slots = moment_staging_[parameter.unsafeGetTensorImpl()];
        slots.clear();
        for (int moment = 0; moment < 2; ++moment) {
          slots.push_back(torch::zeros_like(
              parameter,
              parameter.options().device(torch::kCPU).pinned_memory(parameter.is_cuda())));
          bytes += slots.back().nbytes();
        }
      }
    }
  }
  return bytes;
}

void CheckpointWriter::begin_sharded_save(const std::string& out_dir, const TrainState& state,
                                          RunLog& log) {
  join_previous(checkpoint_file_name(state), log);
  checkpoint_part_remove_stale(out_dir, checkpoint_file_name(state), rank_, parts_);
}

double CheckpointWriter::join_previous(const std::string& name, RunLog& log) {
  if (!thread_.joinable()) return 0.0;
  const bool writing = !written_.load();
  const std::string previous = in_flight_;
  const Clock::time_point wait_start = Clock::now();
  join(log);
  const double waited = seconds_since(wait_start);
  if (writing) {
    log.info("checkpoint " + (name.empty() ? std::string("best_model.pt") : name) + ": waited " +
             seconds_text(waited) + " for the previous save (" + previous + ") to be written");
  }
  return waited;
}

std::string CheckpointWriter::save(const std::string& out_dir, model::M3AE& model,
                                   VqaOptimizer* optimizer, const TrainState& state,
                                   const std::string& config_ini, int keep_checkpoints, bool best,
                                   RunLog& log) {
  const Clock::time_point start = Clock::now();
  const std::string name = optimizer ? checkpoint_file_name(state) : "";
  const bool sharded = optimizer && optimizer->sharded();
  const bool main_file = rank_ == 0;  // NAME and best_model.pt: rank 0's
  if (!name.empty()) ++checkpoints_;
  CheckpointProgress progress;
  if (kill_in_write_ > 0 && checkpoints_ == kill_in_write_) {
    // Testing: dies with the temporary file half written, as a node would.
    progress = [](uint64_t bytes) {
      if (bytes >= 4096) raise(SIGKILL);
    };
  }
  // One save in flight: the previous one ends (and frees its copy) first.
  const double waited = asynchronous_ ? join_previous(name, log) : 0.0;
  // This rank's part of a sharded checkpoint: a host copy of its moments.
  auto part = std::make_shared<torch::serialize::OutputArchive>();
  std::string part_name;
  if (sharded) {
    const auto owned = optimizer->owned_moments(/*with_replicated=*/main_file);
    std::array<torch::Tensor, 2> flat;
    for (int m = 0; m < 2; ++m) {
      const auto& moments = m == 0 ? owned.exp_avg : owned.exp_avg_sq;
      flat[m] =
          asynchronous_ && part_staging_[m].defined() && part_staging_[m].numel() == owned.elements
              ? part_staging_[m]
              : torch::empty({owned.elements}, torch::kFloat32);
      if (asynchronous_) part_staging_[m] = flat[m];
      int64_t at = 0;
      for (const auto& tensor : moments) {
        flat[m].narrow(0, at, tensor.numel()).copy_(tensor, /*non_blocking=*/tensor.is_cuda());
        at += tensor.numel();
      }
    }
    if (!moments_on_host(owned)) torch::cuda::synchronize();
    part_name = checkpoint_part_name(name, rank_, parts_);
    checkpoint_part_fill(*part, model, owned, flat[0], flat[1], rank_, parts_);
    std::fprintf(stderr,
                 "[vqa] rank %d: checkpoint part %s: %lld bytes of AdamW moments; this rank "
                 "holds %lld bytes of optimiser state at the save\n",
                 rank_, part_name.c_str(), static_cast<long long>(2 * owned.elements * 4),
                 static_cast<long long>(optimizer->state_bytes()));
  }
  auto archives = std::make_shared<SaveArchives>();
  if (main_file) {
    *archives = save_archives_build(
        model, optimizer, state, config_ini, best, asynchronous_ ? &staging_ : nullptr,
        asynchronous_ ? &moment_staging_ : nullptr, sharded ? parts_ : 0);
  }
  const int parts = parts_;
  // Warnings (an old checkpoint not removed) to stderr when in the background:
  // the RunLog is the main thread's.
  RunLog* write_log = asynchronous_ ? nullptr : &log;
  auto write = [archives, part, part_name, out_dir, name, keep_checkpoints, best, progress,
                main_file, parts, write_log] {
    std::vector<CheckpointPartEntry> entries;
    if (!part_name.empty()) {
      checkpoint_part_write(out_dir, part_name, *part);
      if (main_file) entries = checkpoint_parts_await(out_dir, name, parts);
    }
    if (!main_file) return;
    if (best) checkpoint_write_best(out_dir, archives->best);
    if (!name.empty()) {
      checkpoint_write(out_dir, name, archives->checkpoint, keep_checkpoints, write_log, progress,
                       part_name.empty() ? nullptr : &entries);
    }
  };
  const std::string path =
      name.empty() ? "" : (std::filesystem::path(out_dir) / "checkpoints" / name).string();
  const std::string what =
      part_name.empty() || main_file ? (name.empty() ? "best_model.pt" : name) : part_name;
  if (!asynchronous_) {
    write();
    log.info("checkpoint " + what + ": training blocked " + seconds_text(seconds_since(start)) +
             " (synchronous save)");
    return path;
  }
  in_flight_ = what;
  started_ = Clock::now();
  written_ = false;
  thread_ = std::thread([this, write, out_dir] {
    try {
      write();
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
