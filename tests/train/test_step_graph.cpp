// The GPU step's choices made on the host: --cuda-graph's plan
// (train/step_graph.h), which runs capture their steps and, for the others,
// the reason train.log gives; how a replayed step counts in the gradient
// buckets' statistics (under mpirun, 1 and 2 ranks); --packed-attention auto.
// The capture itself needs a GPU (tests/gpu/check.sh compares graph and
// eager losses there); here a CUDA device is only named, never used.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/communicator.h"  // communicator_create
#include "runtime/cuda_graph.h"    // cuda_graph_unavailable_reason
#include "train/gradient_sync.h"   // GradientSynchronizer
#include "train/setup.h"           // packed_attention_wanted
#include "train/step_graph.h"      // step_graph_plan
#include "train/train_config.h"    // config_parse, config_to_ini

namespace {

using vqa::runtime::Backend;
using vqa::train::step_graph_plan;
using vqa::train::step_graph_plan_describe;
using vqa::train::TrainConfig;

const torch::Device kGpu(torch::kCUDA, 0);

TrainConfig graph_config(int world_size) {
  TrainConfig config;
  config.cuda_graph = true;
  config.world_size = world_size;
  config.accumulation_steps = 1;
  return config;
}

TEST(StepGraphPlan, CapturesWhereEveryConditionHolds) {
  const auto one =
      step_graph_plan(graph_config(1), kGpu, /*unavailable=*/"", /*comm_unavailable=*/"");
  EXPECT_TRUE(one.capture);
  EXPECT_EQ(one.reason, "");
  const auto two = step_graph_plan(graph_config(2), kGpu, "", "");
  EXPECT_TRUE(two.capture);
  EXPECT_NE(step_graph_plan_describe(two).find("CUDA graph: on: after 3 eager steps"),
            std::string::npos);
  auto no_comm = graph_config(2);
  no_comm.no_comm = true;  // no collective at all: the backend does not matter
  const std::string mpi = vqa::runtime::graph_capture_unavailable(Backend::kMpi, kGpu);
  EXPECT_TRUE(step_graph_plan(no_comm, kGpu, "", mpi).capture);
}

TEST(StepGraphPlan, OffSaysNothing) {
  auto config = graph_config(2);
  config.cuda_graph = false;
  const auto plan = step_graph_plan(config, kGpu, "", "");
  EXPECT_FALSE(plan.capture);
  EXPECT_EQ(step_graph_plan_describe(plan), "");
}

TEST(StepGraphPlan, EachObstacleIsNamed) {
  struct Row {
    TrainConfig config;
    torch::Device device;
    std::string unavailable, comm_unavailable;
    std::string reason_part;
  };
  auto accumulation = graph_config(2);
  accumulation.accumulation_steps = 4;
  auto nan_fault = graph_config(2);
  nan_fault.faults.nan_step = 3;
  auto slow_fault = graph_config(2);
  slow_fault.faults.slow_rank = 1;
  // The MPI backend's reason as the run asks for it (--backend auto on the
  // CPU, or mpi); NCCL's, which needs the library, from its version code
  // (graph_capture_unavailable passes ncclGetVersion's).
  const std::string mpi = vqa::runtime::graph_capture_unavailable(Backend::kAuto, torch::kCPU);
  EXPECT_EQ(vqa::runtime::graph_capture_unavailable(Backend::kMpi, kGpu), mpi);
  const std::string nccl_2_8 = vqa::runtime::nccl_graph_capture_unavailable(2804);
  const std::vector<Row> rows = {
      {graph_config(2), torch::Device(torch::kCPU), "", mpi, "the device is the CPU"},
      {graph_config(2), kGpu, "no CUDA here", "", "no CUDA here"},
      {graph_config(2), kGpu, "", mpi, "the MPI backend's collectives run on the host"},
      {graph_config(1), kGpu, "", mpi, "the MPI backend's collectives run on the host"},
      {graph_config(2), kGpu, "", nccl_2_8, "NCCL 2.8.4 cannot be captured"},
      {accumulation, kGpu, "", "", "4 micro-steps per optimiser step"},
      {nan_fault, kGpu, "", "", "--test-nan-step"},
      {slow_fault, kGpu, "", "", "--test-slow-rank"},
  };
  for (const auto& row : rows) {
    const auto plan =
        step_graph_plan(row.config, row.device, row.unavailable, row.comm_unavailable);
    EXPECT_FALSE(plan.capture) << row.reason_part;
    EXPECT_NE(plan.reason.find(row.reason_part), std::string::npos) << plan.reason;
    EXPECT_EQ(step_graph_plan_describe(plan), "CUDA graph: eager steps (" + plan.reason + ")");
  }
}

// NCCL captures collectives from 2.9.6 on; ncclGetVersion's code changed
// its layout at 2.9 (2.8.4 is 2804, 2.9.6 is 20906).
TEST(StepGraphPlan, NcclVersionsBefore296AreNamed) {
  using vqa::runtime::nccl_graph_capture_unavailable;
  EXPECT_NE(nccl_graph_capture_unavailable(2804).find("NCCL 2.8.4 cannot be captured"),
            std::string::npos);
  EXPECT_NE(nccl_graph_capture_unavailable(20905).find("NCCL 2.9.5 cannot be captured"),
            std::string::npos);
  EXPECT_EQ(nccl_graph_capture_unavailable(20906), "");
  EXPECT_EQ(nccl_graph_capture_unavailable(22105), "");  // 2.21.5
  EXPECT_EQ(nccl_graph_capture_unavailable(30001), "");  // a 3.0.1 to come
}

// A CPU LibTorch (1.13 or 2.x) says why it cannot capture, and refuses a graph.
TEST(StepGraphPlan, BuildWithoutCudaGraphsGivesItsReason) {
  const std::string reason = vqa::runtime::cuda_graph_unavailable_reason();
  if (reason.empty()) {
    GTEST_SKIP() << "this build captures CUDA graphs (tests/gpu/check.sh runs them on a GPU)";
  }
  EXPECT_NE(reason.find("LibTorch"), std::string::npos) << reason;
  EXPECT_THROW(vqa::runtime::CudaGraph graph(kGpu), std::runtime_error);
}

// auto packs q, k and v on a GPU (161 against 135 samples/s on an H200)
// and not on the CPU (no faster there); on and off hold everywhere.
TEST(GpuDefaults, PackedAttentionAutoIsOnOnAGpuOnly) {
  using vqa::train::packed_attention_wanted;
  using vqa::train::PackedAttention;
  const torch::Device cpu(torch::kCPU);
  EXPECT_TRUE(packed_attention_wanted(PackedAttention::kAuto, kGpu));
  EXPECT_FALSE(packed_attention_wanted(PackedAttention::kAuto, cpu));
  for (const auto& device : {cpu, kGpu}) {
    EXPECT_TRUE(packed_attention_wanted(PackedAttention::kOn, device));
    EXPECT_FALSE(packed_attention_wanted(PackedAttention::kOff, device));
  }
}

// The warm-up: three eager steps, then the next full batch is captured (a
// short one is left eager); before a capture nothing is replayable and no
// eager step is worth a log line. The capture itself needs CUDA, and on the
// CPU it is refused.
TEST(StepGraphWarmup, CapturesTheFirstFullBatchAfterThreeEagerSteps) {
  const auto batch_of = [](int64_t samples) {
    vqa::data::Batch batch;
    batch.question_ids = torch::arange(samples);
    batch.images = torch::zeros({samples, 3, 8, 8});
    batch.token_ids = torch::zeros({samples, 4}, torch::kInt64);
    batch.attention_mask = torch::ones({samples, 4}, torch::kInt64);
    batch.targets = torch::zeros({samples, 2});
    return batch;
  };
  const auto full = batch_of(8), short_batch = batch_of(5);
  vqa::train::StepGraph graph(torch::Device(torch::kCPU));
  ASSERT_EQ(vqa::train::StepGraph::kWarmupSteps, 3);
  for (int64_t step = 0; step < 3; ++step) {
    EXPECT_FALSE(graph.capture_due(full, /*full_batch=*/8)) << "step " << step;
    EXPECT_FALSE(graph.replayable(full));
    EXPECT_EQ(graph.note_eager_step(full, step), "");
  }
  EXPECT_TRUE(graph.capture_due(full, 8));
  EXPECT_FALSE(graph.capture_due(short_batch, 8));
  EXPECT_EQ(graph.note_eager_step(short_batch, 3), "");  // not captured: nothing to compare with
  EXPECT_TRUE(graph.capture_due(full, 8));
  EXPECT_THROW(graph.capture(full, [](const vqa::data::Batch&) { return torch::zeros({}); }),
               std::exception);
}

// --packed-attention as users write it: alone (on), with a mode, with the
// bool spellings it took before it had a mode, and read back from the INI
// file vqa_train saves (config_to_ini) through --config.
TEST(GpuDefaults, PackedAttentionParsesEveryFormAndRoundTripsThroughTheIni) {
  using vqa::train::PackedAttention;
  const auto parse = [](std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), "vqa_train");
    std::vector<char*> argv;
    for (auto& argument : arguments) argv.push_back(argument.data());
    vqa::train::TrainConfig config;
    EXPECT_TRUE(vqa::train::config_parse(static_cast<int>(argv.size()), argv.data(), 0, config));
    return config;
  };
  EXPECT_EQ(parse({}).packed_attention, PackedAttention::kAuto);
  EXPECT_EQ(parse({"--packed-attention"}).packed_attention, PackedAttention::kOn);
  const auto followed = parse({"--packed-attention", "--epochs", "3"});
  EXPECT_EQ(followed.packed_attention, PackedAttention::kOn);
  EXPECT_EQ(followed.epochs, 3);
  for (const char* on : {"on", "true", "yes", "1"}) {
    EXPECT_EQ(parse({"--packed-attention", on}).packed_attention, PackedAttention::kOn) << on;
  }
  for (const char* off : {"off", "false", "no", "0"}) {
    EXPECT_EQ(parse({"--packed-attention", off}).packed_attention, PackedAttention::kOff) << off;
  }
  const std::string ini = (std::filesystem::temp_directory_path() /
                           ("step_graph_test_" + std::to_string(::getpid()) + ".ini"))
                              .string();
  for (const PackedAttention mode :
       {PackedAttention::kAuto, PackedAttention::kOn, PackedAttention::kOff}) {
    vqa::train::TrainConfig saved;
    saved.packed_attention = mode;
    std::ofstream(ini) << vqa::train::config_to_ini(saved);
    EXPECT_EQ(parse({"--config", ini}).packed_attention, mode);
  }
  std::filesystem::remove(ini);
}

// A replayed step ran the captured step's collectives inside the graph:
// count_replayed_step() adds what that step added (bytes per bucket, each
// bucket's launch before the end of backward), so per-step means, the
// diagnosis and the projection stay those of a real step. Exact: the sums
// double. The bytes are checked where there are 2 ranks (np2); one rank
// sends nothing.
TEST(StepGraphCounting, ReplayedStepCountsAsTheStepBefore) {
  auto comm = vqa::runtime::communicator_create(Backend::kMpi, torch::kCPU);
  torch::manual_seed(1);
  torch::nn::Linear first(64, 64), second(64, 8);
  std::vector<vqa::train::NamedTensor> parameters;
  for (const auto& item : first->named_parameters()) {
    parameters.push_back({"first." + item.key(), item.value()});
  }
  for (const auto& item : second->named_parameters()) {
    parameters.push_back({"second." + item.key(), item.value()});
  }
  vqa::train::GradientSyncOptions options;
  options.bucket_mb = 0.01;  // 10 KiB: the first layer's weight (16 KiB) is a bucket of its own
  vqa::train::GradientSynchronizer gradients(parameters, *comm, options);
  gradients.prepare_backward(/*sync=*/true);
  second->forward(first->forward(torch::randn({4, 64}))).sum().backward();
  gradients.finish_backward();
  const auto once = gradients.stats();
  ASSERT_EQ(once.synchronised_steps, 1);
  ASSERT_GE(once.buckets, 2);
  if (comm->world_size() == 1) {
    // One rank runs no collective: nothing is sent, and nothing may be
    // counted for a replay either (the byte checks below hold with 0).
    ASSERT_EQ(once.sent_bytes, 0);
  } else {
    ASSERT_GT(once.sent_bytes, 0);
  }

  gradients.count_replayed_step();
  const auto twice = gradients.stats();
  EXPECT_EQ(twice.synchronised_steps, 2);
  EXPECT_EQ(twice.sent_bytes, 2 * once.sent_bytes);
  EXPECT_EQ(twice.bytes_per_step, once.bytes_per_step);
  ASSERT_EQ(twice.sent_bytes_sums.size(), once.sent_bytes_sums.size());
  for (size_t k = 0; k < once.sent_bytes_sums.size(); ++k) {
    EXPECT_EQ(twice.sent_bytes_sums[k], 2 * once.sent_bytes_sums[k]) << "bucket " << k;
    EXPECT_EQ(twice.ready_before_end_sums[k], 2 * once.ready_before_end_sums[k]) << "bucket " << k;
  }
}

}  // namespace
