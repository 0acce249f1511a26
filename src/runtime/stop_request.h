// Stopping cleanly when the batch system asks: SIGUSR1 (Slurm's warning
// before a time limit, `#SBATCH --signal=B:USR1@T`, forwarded by the job
// script) or SIGTERM (preemption, scancel).
//
// The signal handler only records the signal. At every optimiser-step
// boundary every rank calls StopAgreement::poll(), which completes the
// flag reduction launched at the previous boundary and launches the next
// one. So every rank sees the same answer at the same step, one step after
// the first rank saw a signal, and a signal that reaches ranks at different
// moments never splits the job into ranks that stop and ranks that wait in
// the next allreduce. The reduction runs on its own communicator, off the
// gradient path, and overlaps a whole step of compute.
#pragma once

#include <memory>

namespace vqa::runtime {

// Exit status of a run that stopped on request after writing its checkpoint
// (EX_TEMPFAIL). Job scripts turn it into a requeue; `--resume auto` continues.
constexpr int kExitStopRequested = 75;

// Installs the handlers for SIGUSR1 and SIGTERM. Call once, after
// distributed_init (MPI may install its own handlers during start-up).
void stop_signals_install();

// The first stop signal this process received, or 0.
int stop_signal_received();

// "SIGUSR1", "SIGTERM", or "signal N".
const char* stop_signal_name(int signal_number);

class StopAgreement {
 public:
  // Collective over MPI_COMM_WORLD (duplicates it).
  StopAgreement();
  // Completes a reduction still in flight; every rank must destroy it after
  // the same number of poll() calls (they do: poll() is called per step).
  ~StopAgreement();
  StopAgreement(const StopAgreement&) = delete;
  StopAgreement& operator=(const StopAgreement&) = delete;

  // Collective: every rank calls it at every step boundary. True once the
  // ranks have agreed to stop (at the same call on every rank); signal()
  // then names the signal.
  bool poll();
  int signal() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace vqa::runtime
