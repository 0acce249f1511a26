// Collectives of the CPU (MPI) communicator at 1, 2 and 3 ranks, and of the
// GPU (NCCL) communicator where a GPU is present (SKIP otherwise).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "runtime/allreduce_choice.h"  // AllreduceChoiceTable, allreduce_method_fastest
#include "runtime/communicator.h"      // communicator_create, ReduceOp
#include "runtime/distributed.h"       // distributed_rank_info, distributed_gather_strings

using vqa::runtime::Backend;
using vqa::runtime::ReduceOp;

namespace {

// Every rank can rebuild every other rank's input from (rank, size).
torch::Tensor input_of(int rank, int64_t size) {
  torch::manual_seed(1000 + rank);
  return torch::randn({size}, torch::kFloat64);
}

torch::Tensor expected_sum(int world_size, int64_t size) {
  auto total = torch::zeros({size}, torch::kFloat64);
  for (int r = 0; r < world_size; ++r) total += input_of(r, size);
  return total;
}

// float32: each rank's input is rounded to float once and the sum of up to 3
// terms rounds twice more: |error| <= 1e-5 + 1e-5 * |expected| holds with room.
// bfloat16: 8 significant bits, up to 3 roundings of the inputs and 2 of the
// sums: |error| <= 0.05 + 0.02 * |expected| for inputs of magnitude ~1..4.
struct Tolerance {
  double atol, rtol;
};
Tolerance tolerance_for(torch::ScalarType type) {
  return type == torch::kBFloat16 ? Tolerance{0.05, 0.02} : Tolerance{1e-5, 1e-5};
}

class CpuAllreduce
    : public ::testing::TestWithParam<std::tuple<int64_t, torch::ScalarType, ReduceOp>> {};

TEST_P(CpuAllreduce, MatchesDoublePrecisionReference) {
  const auto [size, type, op] = GetParam();
  const auto& info = vqa::runtime::distributed_rank_info();
  auto comm = vqa::runtime::communicator_create(Backend::kMpi, torch::kCPU);
  auto buffer = input_of(info.rank, size).to(type);
  comm->allreduce(buffer, op);

  auto expected = expected_sum(info.world_size, size);
  if (op == ReduceOp::kAverage) expected /= info.world_size;
  const auto tol = tolerance_for(type);
  EXPECT_TRUE(torch::allclose(buffer.to(torch::kFloat64), expected, tol.rtol, tol.atol))
      << "max abs error " << (buffer.to(torch::kFloat64) - expected).abs().max().item<double>();
}

INSTANTIATE_TEST_SUITE_P(OddSizes, CpuAllreduce,
                         ::testing::Combine(::testing::Values(1, 7, 1000003),
                                            ::testing::Values(torch::kFloat32, torch::kBFloat16),
                                            ::testing::Values(ReduceOp::kSum, ReduceOp::kAverage)));

TEST(CpuCommunicator, BroadcastReplacesEveryRanksValues) {
  const auto& info = vqa::runtime::distributed_rank_info();
  auto comm = vqa::runtime::communicator_create(Backend::kMpi, torch::kCPU);
  for (int64_t size : {1, 7, 1000003}) {
    const int root = info.world_size - 1;
    auto buffer = input_of(info.rank, size).to(torch::kFloat32);
    comm->broadcast(buffer, root);
    EXPECT_TRUE(torch::equal(buffer, input_of(root, size).to(torch::kFloat32))) << size;
  }
}

TEST(CpuCommunicator, ManyAsyncOperationsInFlightCompleteCorrectly) {
  const auto& info = vqa::runtime::distributed_rank_info();
  auto comm = vqa::runtime::communicator_create(Backend::kMpi, torch::kCPU);
  constexpr int kInFlight = 64;
  std::vector<torch::Tensor> buffers;
  std::vector<vqa::runtime::WorkHandle> handles;
  for (int i = 0; i < kInFlight; ++i) {
    // Buffer i holds (rank + 1) * (i + 1): its sum is (i + 1) * n(n+1)/2, exact in float32.
    buffers.push_back(torch::full({1 + 997 * i}, float((info.rank + 1) * (i + 1))));
    handles.push_back(comm->allreduce_async(buffers.back(), ReduceOp::kSum));
  }
  // Wait in reverse order: completion must not depend on the order of waits.
  for (int i = kInFlight - 1; i >= 0; --i) handles[i]->wait();
  const float ranks_sum = info.world_size * (info.world_size + 1) / 2.0f;
  for (int i = 0; i < kInFlight; ++i) {
    EXPECT_TRUE(torch::equal(buffers[i], torch::full_like(buffers[i], ranks_sum * (i + 1)))) << i;
  }
}

// Scalars and strings through the communicator (the training loop's one
// door to collectives): sum, max and min of doubles that an int64 scaling
// would have rounded, and strings of different lengths in rank order.
void check_scalars_and_strings(vqa::runtime::Communicator& comm) {
  const auto& info = vqa::runtime::distributed_rank_info();
  const int n = info.world_size;
  comm.barrier();
  EXPECT_DOUBLE_EQ(comm.sum(info.rank + 0.5), n * (n - 1) / 2.0 + 0.5 * n);
  // 1e-10 apart: exactly representable differences that a nanosecond scaling loses.
  EXPECT_EQ(comm.max(0.25 + 1e-10 * info.rank), 0.25 + 1e-10 * (n - 1));
  EXPECT_EQ(comm.min(-1.5 * info.rank), -1.5 * (n - 1));
  const auto all = comm.gather_strings(std::string(info.rank + 1, 'r') + std::to_string(info.rank));
  ASSERT_EQ(static_cast<int>(all.size()), n);
  for (int r = 0; r < n; ++r) EXPECT_EQ(all[r], std::string(r + 1, 'r') + std::to_string(r));
  EXPECT_EQ(comm.gather_strings("").size(), static_cast<size_t>(n));
}

// The two halves of an allreduce (sharded optimiser state): rank r's block
// after the reduce-scatter is block r of the reference sum or average
// (float32 and bfloat16, tolerances as above); after the allgather every
// block is its owner's, exactly, whatever the other blocks held before.
// Blocks of 2,500,001 elements make the MPI reduce-scatter run in pieces
// (8 MiB for all ranks' parts of a piece: 2-4 pieces a block, the last
// shorter; one piece in bfloat16 at 1 rank).
void check_reduce_scatter_and_allgather(vqa::runtime::Communicator& comm,
                                        const torch::Device& device) {
  const auto& info = vqa::runtime::distributed_rank_info();
  const int n = info.world_size;
  for (const int64_t block : {1, 7, 333334, 2500001}) {
    for (const auto type : {torch::kFloat32, torch::kBFloat16}) {
      for (const auto op : {ReduceOp::kSum, ReduceOp::kAverage}) {
        auto buffer = input_of(info.rank, n * block).to(type).to(device);
        comm.reduce_scatter_async(buffer, op)->wait();
        auto expected = expected_sum(n, n * block).narrow(0, block * info.rank, block);
        if (op == ReduceOp::kAverage) expected /= n;
        const auto got = comm.own_block(buffer).to(torch::kCPU).to(torch::kFloat64);
        const auto tol = tolerance_for(type);
        EXPECT_TRUE(torch::allclose(got, expected, tol.rtol, tol.atol))
            << "reduce-scatter, block " << block << ", max abs error "
            << (got - expected).abs().max().item<double>();
      }
      auto gathered = torch::full({n * block}, -7.0f).to(type).to(device);
      comm.own_block(gathered).fill_(info.rank + 1);
      comm.allgather_async(gathered)->wait();
      std::vector<torch::Tensor> want;
      for (int r = 0; r < n; ++r) want.push_back(torch::full({block}, float(r + 1)));
      EXPECT_TRUE(torch::equal(gathered.to(torch::kCPU).to(torch::kFloat32), torch::cat(want)))
          << "allgather, block " << block;
    }
  }
}

TEST(CpuCommunicator, ReduceScatterAndAllgatherInPlace) {
  auto comm = vqa::runtime::communicator_create(Backend::kMpi, torch::kCPU);
  check_reduce_scatter_and_allgather(*comm, torch::kCPU);
}

TEST(CpuCommunicator, ScalarsStringsAndBarrier) {
  auto comm = vqa::runtime::communicator_create(Backend::kMpi, torch::kCPU);
  check_scalars_and_strings(*comm);
}

TEST(Distributed, LocalRankAndSizeFromSharedMemoryRanks) {
  // mpirun starts every rank of these tests on this one host.
  const auto& info = vqa::runtime::distributed_rank_info();
  EXPECT_EQ(info.local_size, info.world_size);
  const auto locals =
      vqa::runtime::distributed_gather_strings(std::to_string(info.local_rank) + "@" + info.host);
  std::set<std::string> distinct(locals.begin(), locals.end());
  EXPECT_EQ(static_cast<int>(distinct.size()), info.world_size) << "local ranks must differ";
  for (const auto& entry : locals) {
    const int local = std::stoi(entry.substr(0, entry.find('@')));
    EXPECT_GE(local, 0);
    EXPECT_LT(local, info.local_size);
  }
}

TEST(Distributed, BroadcastBytesAndGatherStrings) {
  const auto& info = vqa::runtime::distributed_rank_info();
  std::vector<char> bytes(info.rank == 0 ? 5 : 2, static_cast<char>('a' + info.rank));
  vqa::runtime::distributed_broadcast_bytes(bytes, 0);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "aaaaa");
  const auto all = vqa::runtime::distributed_gather_strings(std::string(info.rank + 1, 'x'));
  ASSERT_EQ(static_cast<int>(all.size()), info.world_size);
  for (int r = 0; r < info.world_size; ++r) EXPECT_EQ(all[r], std::string(r + 1, 'x'));
}

TEST(Backends, ChoiceFollowsTheDevice) {
  EXPECT_EQ(vqa::runtime::backend_for_device(torch::kCPU), Backend::kMpi);
  EXPECT_EQ(vqa::runtime::backend_for_device(torch::Device(torch::kCUDA, 0)), Backend::kNccl);
  EXPECT_EQ(vqa::runtime::backend_name(Backend::kNccl), "nccl");
  EXPECT_EQ(vqa::runtime::mpi_allreduce_name(vqa::runtime::MpiAllreduce::kLibrary), "library");
}

// --mpi-allreduce auto's rules: the probe's sizes, the ring only when
// clearly faster, and the nearest probed size's choice.
TEST(AllreduceChoice, ProbeSizesMarginAndNearestSize) {
  using vqa::runtime::AllreduceAlgorithm;
  using vqa::runtime::AllreduceMethod;
  const std::vector<int64_t> expected = {64 << 10, 128 << 10, 256 << 10};
  EXPECT_EQ(vqa::runtime::allreduce_probe_sizes(64 << 10, 300 << 10), expected);
  EXPECT_EQ(vqa::runtime::allreduce_probe_sizes(64 << 10, 256 << 10), expected);
  EXPECT_EQ(vqa::runtime::allreduce_probe_sizes(60 << 10, 100 << 10).front(), 64 << 10);
  EXPECT_TRUE(vqa::runtime::allreduce_probe_sizes(64 << 10, 1000).empty());

  const AllreduceMethod library{};
  const AllreduceMethod ring_large{AllreduceAlgorithm::kRing, 1 << 20};
  const AllreduceMethod ring_eager{AllreduceAlgorithm::kRing, 60 << 10};
  // 14% faster is within the margin (kLibraryUnlessFasterBy = 0.85): the library stays.
  EXPECT_EQ(vqa::runtime::allreduce_method_fastest(
                {{library, 1.0}, {ring_large, 0.86}, {ring_eager, 0.87}}),
            library);
  EXPECT_EQ(vqa::runtime::allreduce_method_fastest(
                {{library, 1.0}, {ring_large, 0.90}, {ring_eager, 0.50}}),
            ring_eager);
  EXPECT_EQ(vqa::runtime::allreduce_method_fastest({{library, 1.0}, {ring_large, 0.84}}),
            ring_large);

  vqa::runtime::AllreduceChoiceTable table(64 << 10);
  EXPECT_EQ(table.lookup(1 << 20), library);  // nothing probed yet
  table.set(1 << 20, library);
  table.set(4 << 20, ring_large);
  table.set(16 << 20, ring_eager);
  EXPECT_EQ(table.lookup(32 << 10), library);             // under 64 KiB: always the library
  EXPECT_EQ(table.lookup(100 << 10), library);            // below the smallest probed size
  EXPECT_EQ(table.lookup(1900 << 10), library);           // nearer 1 MiB than 4 MiB (log scale)
  EXPECT_EQ(table.lookup(2 << 20), ring_large);           // halfway on a log scale: the larger
  EXPECT_EQ(table.lookup(9 << 20), ring_eager);           // nearer 16 MiB
  EXPECT_EQ(table.lookup(int64_t{1} << 30), ring_eager);  // above the largest probed size
  EXPECT_EQ(vqa::runtime::allreduce_method_name(ring_eager), "ring 60 KiB");
}

// The probe on this fabric: every size from 64 KiB to 2 MiB measured and
// named, the same choices on every rank, and the sums still exact through
// whichever algorithm each size got.
TEST(AllreduceChoice, ProbedChoicesAgreeAcrossRanksAndSumExactly) {
  const auto& info = vqa::runtime::distributed_rank_info();
  auto comm = vqa::runtime::communicator_create(Backend::kMpi, torch::kCPU,
                                                vqa::runtime::MpiAllreduce::kAuto);
  const std::string line = comm->tune_allreduce(2 << 20);
  if (info.world_size == 1) {
    EXPECT_EQ(line, "");
    return;
  }
  for (const char* size : {" 64 KiB ", " 128 KiB ", " 1024 KiB ", " 2048 KiB "}) {
    EXPECT_NE(line.find(size), std::string::npos) << size << " missing in: " << line;
  }
  const auto lines = vqa::runtime::distributed_gather_strings(line.substr(line.find("->")));
  EXPECT_EQ(comm->tune_allreduce(1 << 20), "") << "sizes already probed are not probed again";
  for (const auto& other : lines) {
    // The choices (after each "->") are every rank's alike; the numbers are rank 0's on every
    // rank too, since each rank decides on the slowest rank's time.
    EXPECT_EQ(other, lines[0]);
  }
  for (const int64_t count : {int64_t{16} << 10, int64_t{100} << 10, int64_t{512} << 10}) {
    auto buffer = torch::full({count}, float(info.rank + 1));
    comm->allreduce(buffer, ReduceOp::kSum);
    EXPECT_TRUE(
        torch::equal(buffer, torch::full({count}, info.world_size * (info.world_size + 1) / 2.0f)))
        << count;
  }
}

// Device selection's decision table: visible devices x ranks on the host.
TEST(CudaDeviceChoice, OneVisibleDeviceOrOnePerRankElseAReasonedStop) {
  using vqa::runtime::cuda_device_choice;
  struct Row {
    int visible, local_rank, local_size, index;
    bool note;
  };
  const Row table[] = {
      // one device visible per rank (--gpus-per-task=1): always device 0
      {1, 0, 1, 0, false},
      {1, 0, 4, 0, false},
      {1, 3, 4, 0, false},
      // as many as the ranks: the local rank's
      {4, 0, 4, 0, false},
      {4, 3, 4, 3, false},
      {2, 1, 2, 1, false},
      // more than the ranks: the local rank's, the rest said to be idle
      {8, 1, 2, 1, true},
      {2, 0, 1, 0, true},
      // none, or fewer than the ranks but more than one: no safe choice
      {0, 0, 1, -1, false},
      {0, 2, 4, -1, false},
      {2, 0, 4, -1, false},
      {3, 3, 4, -1, false},
  };
  for (const Row& row : table) {
    const auto choice = cuda_device_choice(row.visible, row.local_rank, row.local_size);
    SCOPED_TRACE(std::to_string(row.visible) + " visible, local rank " +
                 std::to_string(row.local_rank) + " of " + std::to_string(row.local_size));
    EXPECT_EQ(choice.index, row.index);
    EXPECT_EQ(choice.problem.empty(), row.index >= 0) << choice.problem;
    EXPECT_EQ(!choice.note.empty(), row.note) << choice.note;
  }
  EXPECT_NE(cuda_device_choice(2, 0, 4).problem.find("2 visible CUDA devices for 4 ranks"),
            std::string::npos);
  EXPECT_NE(cuda_device_choice(8, 1, 2).note.find("devices 2..7 stay idle"), std::string::npos);
}

// ---- GPU (NCCL) ----------------------------------------------------------

bool gpu_available() {
  const auto& info = vqa::runtime::distributed_rank_info();
  return vqa::runtime::nccl_backend_built() && torch::cuda::is_available() &&
         vqa::runtime::cuda_device_choice(vqa::runtime::cuda_device_count(), info.local_rank,
                                          info.local_size)
                 .index >= 0;
}

class GpuAllreduce : public ::testing::TestWithParam<std::tuple<int64_t, torch::ScalarType>> {};

TEST_P(GpuAllreduce, AverageMatchesDoublePrecisionReference) {
  if (!gpu_available()) GTEST_SKIP() << "no GPU per local rank (or no NCCL build)";
  const auto [size, type] = GetParam();
  const auto& info = vqa::runtime::distributed_rank_info();
  const torch::Device device(torch::kCUDA, vqa::runtime::cuda_device_for(info));
  auto comm = vqa::runtime::communicator_create(Backend::kAuto, device);
  ASSERT_EQ(comm->backend(), Backend::kNccl);
  auto buffer = input_of(info.rank, size).to(type).to(device);
  comm->allreduce(buffer, ReduceOp::kAverage);
  const auto expected = expected_sum(info.world_size, size) / info.world_size;
  const auto tol = tolerance_for(type);
  EXPECT_TRUE(
      torch::allclose(buffer.to(torch::kCPU).to(torch::kFloat64), expected, tol.rtol, tol.atol));
}

INSTANTIATE_TEST_SUITE_P(OddSizes, GpuAllreduce,
                         ::testing::Combine(::testing::Values(1, 7, 1000003),
                                            ::testing::Values(torch::kFloat32, torch::kBFloat16)));

TEST(GpuCommunicator, ReduceScatterAndAllgatherInPlace) {
  if (!gpu_available()) GTEST_SKIP() << "no GPU per local rank (or no NCCL build)";
  const auto& info = vqa::runtime::distributed_rank_info();
  const torch::Device device(torch::kCUDA, vqa::runtime::cuda_device_for(info));
  auto comm = vqa::runtime::communicator_create(Backend::kNccl, device);
  check_reduce_scatter_and_allgather(*comm, device);
}

TEST(GpuCommunicator, ManyAsyncOperationsAndBroadcast) {
  if (!gpu_available()) GTEST_SKIP() << "no GPU per local rank (or no NCCL build)";
  const auto& info = vqa::runtime::distributed_rank_info();
  const torch::Device device(torch::kCUDA, vqa::runtime::cuda_device_for(info));
  auto comm = vqa::runtime::communicator_create(Backend::kNccl, device);
  std::vector<torch::Tensor> buffers;
  std::vector<vqa::runtime::WorkHandle> handles;
  for (int i = 0; i < 32; ++i) {
    buffers.push_back(torch::full({1 + 4099 * i}, float((info.rank + 1) * (i + 1)),
                                  torch::TensorOptions().device(device)));
    handles.push_back(comm->allreduce_async(buffers.back(), ReduceOp::kSum));
  }
  for (auto& handle : handles) handle->wait();
  const float ranks_sum = info.world_size * (info.world_size + 1) / 2.0f;
  for (int i = 0; i < 32; ++i) {
    EXPECT_TRUE(torch::equal(buffers[i].cpu(), torch::full({1 + 4099 * i}, ranks_sum * (i + 1))));
  }
  auto value = torch::full({7}, float(info.rank), torch::TensorOptions().device(device));
  comm->broadcast(value, 0);
  EXPECT_TRUE(torch::equal(value.cpu(), torch::zeros({7})));
}

TEST(GpuCommunicator, ScalarsStringsAndBarrier) {
  if (!gpu_available()) GTEST_SKIP() << "no GPU per local rank (or no NCCL build)";
  const auto& info = vqa::runtime::distributed_rank_info();
  auto comm = vqa::runtime::communicator_create(
      Backend::kNccl, torch::Device(torch::kCUDA, vqa::runtime::cuda_device_for(info)));
  check_scalars_and_strings(*comm);
}

}  // namespace
