// Network partition between two nodes, on this one machine: two network
// namespaces joined by a veth pair are the nodes, one rank in each; Open
// MPI's TCP transport and its out-of-band channel are restricted to that
// link, and mpirun starts the second node's daemon through
// netns_rsh_agent.sh. Mid-run the link is cut (a blackhole qdisc on both
// ends: every packet dropped, nothing refused, like a failed switch).
//
// With jobs/mpirun-tune.conf the launcher notices the lost node by TCP
// keepalive (about 20 s) and ends the job; the collective watchdog, whose
// --comm-timeout must be longer than that, warns at half of it that rank 1
// does not answer, and ends the rank left on the far side at its deadline.
// Needs root and iproute2; reports SKIP with the reason otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "process.h"  // run_process, make_temp_dir

namespace fs = std::filesystem;

namespace {

using vqa::testing::contains;
using vqa::testing::value_after;

class Partition : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
    const std::string id = std::to_string(getpid() % 100000);
    // Shell variables naming the two nodes and their ends of the link
    // (interface names have at most 15 characters).
    names_ = "A=vqa-a-" + id + " B=vqa-b-" + id + " VA=vqa" + id + "a VB=vqa" + id + "b\n";
    node_a_ = "vqa-a-" + id;
    node_b_ = "vqa-b-" + id;
    const auto added = vqa::testing::run_process(names_ + "ip netns add $A", 30);
    if (added.exit_code != 0) {
      GTEST_SKIP() << "cannot create a network namespace (ip netns add): " << added.output;
    }
    created_ = true;
    const auto joined = vqa::testing::run_process(names_ + R"(set -e
ip netns add $B
ip link add $VA netns $A type veth peer name $VB netns $B
ip -n $A addr add 10.200.0.1/24 dev $VA
ip -n $B addr add 10.200.0.2/24 dev $VB
for n in $A $B; do ip -n $n link set lo up; done
ip -n $A link set $VA up
ip -n $B link set $VB up
)",
                                                  60);
    if (joined.exit_code != 0) {
      GTEST_SKIP() << "cannot join two network namespaces with a veth pair: " << joined.output;
    }
    directory_ = vqa::testing::make_temp_dir("partition");
  }

  void TearDown() override {
    if (!created_) return;
    // Whatever is left on either side of the cut (a daemon waiting for TCP
    // to give up), then the namespaces; the veth pair goes with them.
    vqa::testing::run_process(names_ + R"(
for n in $A $B; do for p in $(ip netns pids $n 2>/dev/null); do kill -9 $p; done; done
sleep 0.5
ip netns del $A; ip netns del $B
)",
                              30);
    if (!directory_.empty()) fs::remove_all(directory_);
  }

  std::string names_, node_a_, node_b_, directory_;
  bool created_ = false;
};

TEST_F(Partition, CutLinkEndsTheJobWithinTheTimeoutNamingThePeer) {
  constexpr double kCommTimeout = 24.0;  // longer than the keepalive's ~20 s, as it must be
  {
    std::ofstream hosts(directory_ + "/hostfile");
    hosts << node_a_ << " slots=1\n" << node_b_ << " slots=1\n";
  }
  const std::string settings = names_ + "DIR=" + directory_ + " SRC=" + VQA_SOURCE_DIR +
                               " PROBE=" + VQA_FAILURE_PROBE +
                               " TIMEOUT=" + std::to_string(static_cast<int>(kCommTimeout)) + "\n";
  // mpirun runs on node A (its host name made to match the hostfile); once
  // rank 0 reports step 20, both ends of the link are cut; then the exits of
  // mpirun and of rank 1's process (in namespace B) are timed.
  const std::string script = settings + R"sh(
ip netns exec $A unshare --uts sh -c "hostname $A && exec mpirun --allow-run-as-root -np 2 \
    --hostfile $DIR/hostfile --mca plm_rsh_agent $SRC/jobs/netns_rsh_agent.sh \
    --tune $SRC/jobs/mpirun-tune.conf --mca pml ob1 --mca btl tcp,self \
    --mca btl_tcp_if_include 10.200.0.0/24 --mca oob_tcp_if_include 10.200.0.0/24 \
    -x OMP_NUM_THREADS=1 $PROBE loop --step-ms 20 --comm-timeout $TIMEOUT" > $DIR/job.log 2>&1 &
job=$!
until grep -q '^step 20$' $DIR/job.log; do
  kill -0 $job 2>/dev/null || { echo 'job ended before the cut'; cat $DIR/job.log; exit 99; }
  sleep 0.05
done
r1=$(for p in $(ip netns pids $B); do [ "$(cat /proc/$p/comm)" = vqa_failure_pro ] && echo $p; done)
t0=$(date +%s.%N)
ip netns exec $A tc qdisc add dev $VA root blackhole
ip netns exec $B tc qdisc add dev $VB root blackhole
for i in $(seq 1800); do kill -0 $job 2>/dev/null || break; sleep 0.05; done
if kill -0 $job 2>/dev/null; then status=still-running; else wait $job; status=$?; fi
t1=$(date +%s.%N)
for i in $(seq 1200); do kill -0 $r1 2>/dev/null || break; sleep 0.05; done
t2=$(date +%s.%N)
echo "PARTITION rank1_pid=$r1 status=$status mpirun_exit=$(awk "BEGIN{print $t1-$t0}")" \
     "rank1_exit=$(awk "BEGIN{print $t2-$t0}")"
cat $DIR/job.log
)sh";
  const auto result = vqa::testing::run_process(script, 240);
  const double mpirun_exit = value_after(result.output, "mpirun_exit");
  const double rank1_exit = value_after(result.output, "rank1_exit");
  std::printf("link cut: mpirun exited after %.2f s (status %g), rank 1 after %.2f s\n",
              mpirun_exit, value_after(result.output, "status"), rank1_exit);
  ASSERT_TRUE(contains(result.output, "PARTITION")) << result.output;
  ASSERT_GT(value_after(result.output, "rank1_pid"), 0) << result.output;
  EXPECT_NE(value_after(result.output, "status"), 0.0) << result.output;
  // The launcher ends the job within the timeout; the rank beyond the cut
  // ends itself at its deadline plus MPI_Abort's 1 s grace (10 s slack for
  // a loaded machine).
  EXPECT_GE(mpirun_exit, 0.0) << result.output;
  EXPECT_LT(mpirun_exit, kCommTimeout) << result.output;
  EXPECT_LT(rank1_exit, kCommTimeout + 1.0 + 10.0) << result.output;
  // Named twice: rank 0's watchdog says which rank stopped answering, the
  // launcher which node it lost.
  EXPECT_TRUE(contains(result.output, "[vqa] WARNING rank 0/2 (" + node_a_ + ")")) << result.output;
  EXPECT_TRUE(contains(result.output, "rank 1 (" + node_b_ + ") did not answer")) << result.output;
  EXPECT_TRUE(contains(result.output, "ORTE has lost communication with a remote daemon"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "on node " + node_b_)) << result.output;
}

}  // namespace
