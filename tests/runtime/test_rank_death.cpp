// Rank death: SIGKILL of rank 1 in the middle of a real vqa_train run. Every
// other rank must exit within seconds with a non-zero status, the job's own
// output must name the lost rank, and the latest checkpoint must resume the
// run to completion.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "process.h"  // run_process, mpirun_prefix, make_temp_dir

namespace fs = std::filesystem;

namespace {

using vqa::testing::contains;
using vqa::testing::value_after;

TEST(RankDeath, KilledRankEndsEveryRankQuicklyAndTheLatestCheckpointResumes) {
  const std::string directory = vqa::testing::make_temp_dir("rankdeath");
  const std::string dataset = directory + "/synth.h5";
  const auto prep =
      vqa::testing::run_process(std::string(VQA_PREP) + " synth -o " + dataset +
                                    " --train-questions 256 --test-questions 32 --seed 5",
                                120);
  ASSERT_EQ(prep.exit_code, 0) << prep.output;

  const std::string out = directory + "/run";
  const std::string train = std::string(VQA_TRAIN) + " --train-data " + dataset + " --out " + out +
                            " --threads 1 --progress off --epochs 8 --max-steps-per-epoch 4"
                            " --global-batch 16 --batch-per-rank 8 --eval-every 0"
                            " --save-every 1 --seed 3";
  // Once the checkpoint of epoch 1 is written, SIGKILL rank 1 (found by its
  // Open MPI rank variable) and time the exit of rank 0's process (gone, or
  // a zombie that mpirun, busy with its teardown, has not reaped yet) and of
  // mpirun.
  const std::string script =
      "OUT=" + out + "\n" + vqa::testing::mpirun_prefix(2) + train + " & job=$!\n" + R"sh(
while [ ! -e $OUT/checkpoints/epoch-0001.pt ]; do
  kill -0 $job 2>/dev/null || { echo 'job ended before the kill'; exit 99; }
  sleep 0.02
done
for p in $(pgrep -P $job); do
  if tr '\0' '\n' < /proc/$p/environ | grep -qx OMPI_COMM_WORLD_RANK=1; then r1=$p; else r0=$p; fi
done
state() { cut -d' ' -f3 /proc/$1/stat 2>/dev/null || echo gone; }
t0=$(date +%s.%N); kill -9 $r1
while [ "$(state $r0)" != gone ] && [ "$(state $r0)" != Z ]; do sleep 0.01; done
t1=$(date +%s.%N)
wait $job; status=$?; t2=$(date +%s.%N)
echo "RANK_DEATH status=$status rank0_exit=$(awk "BEGIN{print $t1-$t0}")" \
     "mpirun_exit=$(awk "BEGIN{print $t2-$t0}")"
)sh";
  const auto killed = vqa::testing::run_process(script, 300);
  const double rank0_exit = value_after(killed.output, "rank0_exit");
  const double mpirun_exit = value_after(killed.output, "mpirun_exit");
  std::printf("SIGKILL of rank 1: rank 0 exited after %.2f s, mpirun after %.2f s, status %g\n",
              rank0_exit, mpirun_exit, value_after(killed.output, "status"));
  for (size_t at = killed.output.find("[vqa] FATAL"); at != std::string::npos;
       at = killed.output.find("[vqa] FATAL", at + 1)) {
    std::printf("%s\n", killed.output.substr(at, killed.output.find('\n', at) - at).c_str());
  }
  ASSERT_TRUE(contains(killed.output, "RANK_DEATH")) << killed.output;
  EXPECT_NE(value_after(killed.output, "status"), 0.0) << killed.output;
  // mpirun's teardown takes about 3 s; 10 s allows for a loaded machine.
  EXPECT_GE(rank0_exit, 0.0) << killed.output;
  EXPECT_LT(rank0_exit, 10.0) << killed.output;
  EXPECT_LT(mpirun_exit, 10.0) << killed.output;
  // The job's own output names the lost rank (the watchdog on rank 0), and
  // so does mpirun.
  EXPECT_TRUE(contains(killed.output, "[vqa] FATAL rank 0/2")) << killed.output;
  EXPECT_TRUE(contains(killed.output, "lost rank 1 (")) << killed.output;
  EXPECT_TRUE(contains(killed.output, "has ended")) << killed.output;

  // The latest checkpoint is intact: the run resumes from it and completes.
  std::ifstream latest(out + "/checkpoints/latest");
  std::string name;
  ASSERT_TRUE(latest >> name) << "no checkpoints/latest after the kill";
  EXPECT_TRUE(fs::exists(out + "/checkpoints/" + name)) << name;
  const auto resumed =
      vqa::testing::run_process(vqa::testing::mpirun_prefix(2) + train + " --resume auto", 300);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + out + "/checkpoints/" + name))
      << resumed.output;
  EXPECT_TRUE(fs::exists(out + "/checkpoints/epoch-0007.pt")) << resumed.output;  // the last epoch
  fs::remove_all(directory);
}

}  // namespace
