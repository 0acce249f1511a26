// Row sync (--sparse-embedding-sync) makes no blocking host call between a
// step's first forward and its optimiser, under mpirun: every call the
// gradient synchronizer makes on a real MPI communicator is recorded beside
// the step's marks (forward, optimiser), with gradient accumulation, so
// that the row gather of the step's last micro-batch falls after the first
// forward unless every micro-batch's rows are gathered before it. The rows'
// average is checked against the whole table's, bit for bit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"  // Communicator, communicator_create
#include "runtime/distributed.h"   // distributed_rank_info
#include "train/gradient_sync.h"   // GradientSynchronizer

namespace {

using vqa::runtime::Communicator;
using vqa::runtime::ReduceOp;
using vqa::runtime::WorkHandle;

// Passes every call to the real communicator and writes it into `log`:
// "host:" for a call that blocks the host until the other ranks (or, on a
// GPU, the device) have joined, "launch:" for a collective queued as device
// work, whose wait on a GPU only orders the compute stream after it.
class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(Communicator& inner, std::vector<std::string>& log)
      : Communicator(vqa::runtime::distributed_rank_info()), inner_(inner), log_(log) {}
  vqa::runtime::Backend backend() const override { return inner_.backend(); }
  WorkHandle allreduce_async(const torch::Tensor& buffer, ReduceOp op) override {
    log_.push_back("launch:allreduce");
    return inner_.allreduce_async(buffer, op);
  }
  WorkHandle reduce_scatter_async(const torch::Tensor& buffer, ReduceOp op) override {
    log_.push_back("launch:reduce_scatter");
    return inner_.reduce_scatter_async(buffer, op);
  }
  WorkHandle allgather_async(const torch::Tensor& buffer) override {
    log_.push_back("launch:allgather");
    return inner_.allgather_async(buffer);
  }
  void allreduce(const torch::Tensor& buffer, ReduceOp op) override {
    log_.push_back("host:allreduce");
    inner_.allreduce(buffer, op);
  }
  void broadcast(const torch::Tensor& buffer, int root) override {
    log_.push_back("host:broadcast");
    inner_.broadcast(buffer, root);
  }
  void barrier() override {
    log_.push_back("host:barrier");
    inner_.barrier();
  }
  double allreduce_scalar(double value, vqa::runtime::ScalarOp op) override {
    log_.push_back("host:allreduce_scalar");
    return inner_.allreduce_scalar(value, op);
  }
  std::vector<std::string> gather_strings(const std::string& value) override {
    log_.push_back("host:gather_strings");  // drains the device's collectives first (NCCL)
    return inner_.gather_strings(value);
  }
  std::vector<std::string> gather_host_strings(const std::string& value) override {
    log_.push_back("host:gather_host_strings");
    return inner_.gather_host_strings(value);
  }

 private:
  Communicator& inner_;
  std::vector<std::string>& log_;
};

constexpr int64_t kRows = 40, kWidth = 6, kMicroSteps = 2, kSteps = 3;

// A table and a layer on top: the smallest model with a row-synced table.
struct TinyModel {
  torch::Tensor table, weight;
  explicit TinyModel(uint64_t seed) {
    torch::manual_seed(seed);
    table = torch::randn({kRows, kWidth}).requires_grad_(true);
    weight = torch::randn({kWidth, 3}).requires_grad_(true);
  }
  std::vector<vqa::train::NamedTensor> parameters() const {
    return {{"table", table}, {"weight", weight}};
  }
  torch::Tensor loss(const torch::Tensor& ids) const {
    return table.index_select(0, ids.flatten()).matmul(weight).square().mean();
  }
};

// Rank r's token ids of micro-step `micro` of step `step`: a few rows, each
// rank's partly its own.
torch::Tensor micro_ids(int rank, int64_t step, int64_t micro) {
  const int64_t base = (rank * 7 + step * 3 + micro * 5) % (kRows - 4);
  return torch::tensor({base, base + 1, base + 3, (base * 2) % kRows}, torch::kInt64);
}

// kSteps optimiser steps of kMicroSteps micro-steps as train_step takes
// them, writing the marks "mark:forward" (each forward), "mark:optimizer"
// and "mark:step" (its start) into `log`. Returns the table after the steps.
torch::Tensor train(Communicator& comm, std::vector<std::string>& log, bool row_sync) {
  TinyModel model(/*seed=*/11);
  vqa::train::GradientSyncOptions options;
  options.bucket_mb = 1e-4;  // the weight in a bucket of its own
  if (row_sync) options.row_sync_parameter = "table";
  RecordingCommunicator recording(comm, log);
  vqa::train::GradientSynchronizer gradients(model.parameters(), recording, options);
  EXPECT_EQ(gradients.row_sync(), row_sync);
  for (int64_t step = 0; step < kSteps; ++step) {
    log.push_back("mark:step");
    std::vector<torch::Tensor> ids;
    for (int64_t micro = 0; micro < kMicroSteps; ++micro) {
      ids.push_back(micro_ids(comm.rank(), step, micro));
    }
    gradients.gather_step_rows(ids);
    for (int64_t micro = 0; micro < kMicroSteps; ++micro) {
      gradients.prepare_backward(/*sync=*/micro == kMicroSteps - 1);
      log.push_back("mark:forward");
      model.loss(ids[micro]).backward();
    }
    gradients.finish_backward();
    log.push_back("mark:optimizer");
    torch::NoGradGuard no_grad;
    model.table.sub_(model.table.grad(), /*alpha=*/0.5);
    model.weight.sub_(model.weight.grad(), /*alpha=*/0.5);
  }
  return model.table.detach().clone();
}

TEST(RowSyncHost, NoBlockingHostCallBetweenTheFirstForwardAndTheOptimiser) {
  auto comm = vqa::runtime::communicator_create(vqa::runtime::Backend::kMpi, torch::kCPU);
  std::vector<std::string> log;
  const torch::Tensor rows = train(*comm, log, /*row_sync=*/true);
  std::string text;
  for (const auto& entry : log) text += entry + "\n";
  bool in_step = false;  // between a step's first forward and its optimiser
  int64_t gathers = 0, launches = 0;
  for (const auto& entry : log) {
    if (entry == "mark:forward") in_step = true;
    if (entry == "mark:optimizer") in_step = false;
    if (entry.rfind("host:", 0) == 0) {
      EXPECT_FALSE(in_step) << "blocking host call " << entry
                            << " between a forward and its optimiser:\n"
                            << text;
      // Host bytes only: never a gather that waits for the device first.
      EXPECT_EQ(entry, "host:gather_host_strings") << text;
      ++gathers;
    }
    if (entry.rfind("launch:", 0) == 0) {
      EXPECT_TRUE(in_step) << text;
      ++launches;
    }
  }
  const bool communicates = comm->world_size() > 1;
  EXPECT_EQ(gathers, communicates ? kSteps : 0) << text;       // one row gather per step
  EXPECT_EQ(launches, communicates ? 2 * kSteps : 0) << text;  // the two buckets per step

  // The rows' average is the whole table's, to the last bit (each element
  // the same sum of the same terms).
  std::vector<std::string> dense_log;
  const torch::Tensor dense = train(*comm, dense_log, /*row_sync=*/false);
  EXPECT_TRUE(torch::equal(rows, dense)) << (rows - dense).abs().max().item<float>();
}

}  // namespace
