#include "runtime/distributed.h"

#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/check.h"            // VQA_CHECK_MPI, fatal_user_error
#include "runtime/mpi_collectives.h"  // mpi_allgather_strings
#include "runtime/rank_agreement.h"   // require_same_on_all_ranks
#include "runtime/version.h"          // code_version
#include "runtime/watchdog_impl.h"    // watchdog_start, watchdog_stop

namespace vqa::runtime {

namespace {
RankInfo g_info;
std::atomic<bool> g_initialized{false};
MPI_Comm g_io_comm = MPI_COMM_NULL;  // reserved for MPI-IO on the loader thread

// srun started several tasks, but MPI made each a world of its own: the MPI
// library found no process manager it speaks (Open MPI 5 under
// srun --mpi=pmi2 starts "singletons"), and every task would train alone
// as rank 0 into the same run directory. Refused on every task; mpirun's
// ranks (OMPI_COMM_WORLD_SIZE) and a 1-task step are not affected.
void refuse_lone_slurm_task(int world_size) {
  const char* step_tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  if (world_size != 1 || step_tasks == nullptr || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    return;
  }
  const long tasks = std::strtol(step_tasks, nullptr, 10);
  if (tasks <= 1) return;
  fatal_user_error(
      "srun started " + std::to_string(tasks) +
      " tasks (SLURM_STEP_NUM_TASKS) but MPI sees a world of 1 rank: the ranks did not find each "
      "other, so each would train alone as rank 0. The MPI library and srun's PMI plugin do not "
      "match: Open MPI needs PMIx, so launch with srun --mpi=pmix (srun --mpi=list names the "
      "plugins this Slurm has; jobs/slurm/lib.sh: VQA_SRUN_MPI=pmix), or with mpirun "
      "(VQA_LAUNCHER=mpirun)");
}

// Open MPI 4 as Debian and Ubuntu build it speaks PMIx only: a task that
// srun starts with another PMI plugin (--mpi=pmi2, none) fails in MPI_Init
// with a line from its PMIx client ("OPAL ERROR: Unreachable in file
// ext3x_client.c") and exits; the explanation Open MPI prints after it may
// not reach srun's output before srun ends the step. So it is said first,
// before MPI_Init, by each such task. mpirun's ranks (OMPI_COMM_WORLD_SIZE)
// are not srun's tasks, whatever plugin srun started mpirun's daemons with.
void note_srun_plugin_before_mpi_init() {
#if defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION < 5
  const char* plugin = std::getenv("SLURM_MPI_TYPE");
  if (plugin == nullptr || std::getenv("SLURM_STEP_ID") == nullptr ||
      std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::strncmp(plugin, "pmix", 4) == 0) {
    return;
  }
  std::fprintf(stderr,
               "vqa_train: srun started this task with --mpi=%s (SLURM_MPI_TYPE), but Open MPI "
               "%d starts under srun only with PMIx unless it was built with Slurm's PMI "
               "support, so MPI_Init may fail next: launch with srun --mpi=pmix (srun "
               "--mpi=list names the plugins this Slurm has; jobs/slurm/lib.sh: "
               "VQA_SRUN_MPI=pmix), or with mpirun (VQA_LAUNCHER=mpirun)\n",
               plugin, OMPI_MAJOR_VERSION);
  std::fflush(stderr);
#endif
}

}  // namespace

const RankInfo& distributed_init(int* argc, char*** argv) {
  VQA_CHECK(!g_initialized.load(), "distributed_init called twice");
  note_srun_plugin_before_mpi_init();
  int provided = MPI_THREAD_SINGLE;
  VQA_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  // Errors come back as return codes so that our checks can name the call.
  VQA_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  VQA_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &g_info.rank));
  VQA_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &g_info.world_size));
  refuse_lone_slurm_task(g_info.world_size);

  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int host_length = 0;
  VQA_CHECK_MPI(MPI_Get_processor_name(host, &host_length));
  g_info.host.assign(host, host_length);

  // Local rank from the ranks that share memory with us: works under mpirun,
  // srun and any other launcher, unlike one launcher's environment variables.
  MPI_Comm node_comm = MPI_COMM_NULL;
  VQA_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_info.rank,
                                    MPI_INFO_NULL, &node_comm));
  VQA_CHECK_MPI(MPI_Comm_rank(node_comm, &g_info.local_rank));
  VQA_CHECK_MPI(MPI_Comm_size(node_comm, &g_info.local_size));
  VQA_CHECK_MPI(MPI_Comm_free(&node_comm));

  VQA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &g_io_comm));
  g_initialized = true;
  if (provided < MPI_THREAD_MULTIPLE) {
    fatal_user_error("the MPI library gives thread level " + std::to_string(provided) +
                     " but vqa-hpc needs MPI_THREAD_MULTIPLE (" +
                     std::to_string(MPI_THREAD_MULTIPLE) +
                     "); use an MPI built with thread support (Open MPI, MPICH and Intel MPI "
                     "all are by default)");
  }
  // Ranks built from different code would disagree in ways that are hard to
  // trace (a changed bucket layout hangs an allreduce); refuse them up front.
  require_same_on_all_ranks(
      "the ranks run different builds of vqa-hpc; install the same build on every node",
      code_version());
  watchdog_start(g_info);
  return g_info;
}

void distributed_finalize() {
  if (!g_initialized) return;
  watchdog_stop();
  if (g_io_comm != MPI_COMM_NULL) VQA_CHECK_MPI(MPI_Comm_free(&g_io_comm));
  g_initialized = false;
  MPI_Finalize();
}

bool distributed_is_initialized() { return g_initialized.load(); }

const RankInfo& distributed_rank_info() { return g_info; }

void distributed_barrier() { VQA_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD)); }

void distributed_broadcast_bytes(std::vector<char>& bytes, int root) {
  int64_t size = static_cast<int64_t>(bytes.size());
  VQA_CHECK_MPI(MPI_Bcast(&size, 1, MPI_INT64_T, root, MPI_COMM_WORLD));
  bytes.resize(static_cast<size_t>(size));
  // MPI counts are int: send large payloads in pieces.
  constexpr int64_t kPiece = 1 << 30;
  for (int64_t offset = 0; offset < size; offset += kPiece) {
    const int count = static_cast<int>(std::min(kPiece, size - offset));
    VQA_CHECK_MPI(MPI_Bcast(bytes.data() + offset, count, MPI_BYTE, root, MPI_COMM_WORLD));
  }
}

std::vector<std::string> distributed_gather_strings(const std::string& value) {
  return mpi_allgather_strings(MPI_COMM_WORLD, value, /*tracker=*/nullptr);
}

void distributed_abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this satisfies [[noreturn]]
}

void distributed_configure_mpio(int64_t file_access_plist) {
  VQA_CHECK(g_initialized.load(), "distributed_configure_mpio before distributed_init");
  VQA_CHECK_HDF5(H5Pset_fapl_mpio(static_cast<hid_t>(file_access_plist), g_io_comm, MPI_INFO_NULL));
}

}  // namespace vqa::runtime
