// Checkpoints across devices and dtypes: whatever device and dtype saved a
// checkpoint, loading puts every tensor on the loading model's device in its
// dtype, in the same tensor objects. A program of its own, without vqa_prep
// or OpenCV, so that the GPU check (tests/gpu/check.sh) builds and runs it on
// a GPU machine; on a machine without a GPU its GPU case skips
// (train_checkpoint_device_gpu shows as skipped).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "model/m3ae.h"          // M3AE
#include "model/model_config.h"  // model_config_preset
#include "process.h"             // make_temp_dir
#include "train/checkpoint.h"    // checkpoint_save, checkpoint_save_best, checkpoint_load
#include "train/optimizer.h"     // VqaOptimizer, OptimizerSettings
#include "train/train_log.h"     // RunLog
#include "train/train_state.h"   // TrainState

namespace fs = std::filesystem;

namespace {

// Map location: whatever device and dtype saved a checkpoint, loading puts
// every tensor on the loading model's device in its dtype, in the same
// tensor objects (the gradient buckets and the optimiser hold them). Saved
// from a float64 copy here (the CPU has one device; the dtype shows the
// conversion), values equal to the saved ones rounded to float32.
void expect_loaded_like(vqa::model::M3AE& saved, vqa::model::M3AE& loaded,
                        const std::vector<const void*>& impls_before) {
  const auto want = saved->named_parameters();
  size_t index = 0;
  for (const auto& item : loaded->named_parameters()) {
    const auto& tensor = item.value();
    EXPECT_EQ(tensor.unsafeGetTensorImpl(), impls_before[index++]) << item.key();
    EXPECT_EQ(tensor.scalar_type(), torch::kFloat32) << item.key();
    EXPECT_EQ(tensor.device(), loaded->parameters().front().device()) << item.key();
    EXPECT_TRUE(torch::equal(tensor.cpu(), want[item.key()].to(torch::kCPU, torch::kFloat32)))
        << item.key();
  }
}

std::vector<const void*> tensor_impls(vqa::model::M3AE& model) {
  std::vector<const void*> impls;
  for (const auto& tensor : model->parameters()) impls.push_back(tensor.unsafeGetTensorImpl());
  return impls;
}

TEST(CheckpointDevice, LoadsOntoTheModelsDeviceAndDtypeWhateverSavedIt) {
  const std::string out = vqa::testing::make_temp_dir("device");
  vqa::train::RunLog log(out, /*writer=*/true);
  torch::manual_seed(1);
  vqa::model::M3AE saved(vqa::model::model_config_preset("tiny"));
  saved->to(torch::kFloat64);
  vqa::train::VqaOptimizer saved_optimizer(saved, vqa::train::OptimizerSettings{});
  vqa::train::TrainState state;
  state.next_epoch = 1;
  const std::string path =
      vqa::train::checkpoint_save(out, saved, saved_optimizer, state, "", /*keep_checkpoints=*/0);
  vqa::train::checkpoint_save_best(out, saved, state);

  torch::manual_seed(2);  // other weights, so that a load that did nothing fails
  vqa::model::M3AE resumed(vqa::model::model_config_preset("tiny"));
  vqa::train::VqaOptimizer optimizer(resumed, vqa::train::OptimizerSettings{});
  auto impls = tensor_impls(resumed);
  vqa::train::TrainState loaded_state;
  vqa::train::checkpoint_load(path, resumed, optimizer, loaded_state, log);
  expect_loaded_like(saved, resumed, impls);

  torch::manual_seed(3);
  vqa::model::M3AE best(vqa::model::model_config_preset("tiny"));
  impls = tensor_impls(best);
  vqa::train::checkpoint_load_model(out + "/best_model.pt", best, log);
  expect_loaded_like(saved, best, impls);
  fs::remove_all(out);
}

// The same across devices where a GPU is present: saved from cuda:0, loaded
// on the CPU and on the last GPU; saved on the CPU, loaded on the GPU.
TEST(CheckpointDevice, CrossesBetweenGpuAndCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string out = vqa::testing::make_temp_dir("device-gpu");
  vqa::train::RunLog log(out, /*writer=*/true);
  const torch::Device last_gpu(torch::kCUDA,
                               static_cast<c10::DeviceIndex>(torch::cuda::device_count() - 1));
  for (const auto& [from, to] : std::vector<std::pair<torch::Device, torch::Device>>{
           {torch::Device(torch::kCUDA, 0), torch::Device(torch::kCPU)},
           {torch::Device(torch::kCUDA, 0), last_gpu},
           {torch::Device(torch::kCPU), last_gpu}}) {
    torch::manual_seed(1);
    vqa::model::M3AE saved(vqa::model::model_config_preset("tiny"));
    saved->to(from);
    vqa::train::VqaOptimizer saved_optimizer(saved, vqa::train::OptimizerSettings{});
    vqa::train::TrainState state;
    state.next_epoch = 1;
    const std::string path = vqa::train::checkpoint_save(out, saved, saved_optimizer, state, "", 0);
    torch::manual_seed(2);
    vqa::model::M3AE loaded(vqa::model::model_config_preset("tiny"));
    loaded->to(to);
    vqa::train::VqaOptimizer optimizer(loaded, vqa::train::OptimizerSettings{});
    const auto impls = tensor_impls(loaded);
    vqa::train::TrainState loaded_state;
    vqa::train::checkpoint_load(path, loaded, optimizer, loaded_state, log);
    expect_loaded_like(saved, loaded, impls);
    for (const auto& tensor : loaded->parameters()) EXPECT_EQ(tensor.device(), to);
  }
  fs::remove_all(out);
}

}  // namespace
