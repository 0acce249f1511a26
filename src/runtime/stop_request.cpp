#include "runtime/stop_request.h"

#include <mpi.h>

#include <csignal>
#include <cstdio>

#include "runtime/check.h"  // VQA_CHECK_MPI

namespace vqa::runtime {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void record_stop_signal(int signal_number) {
  if (g_stop_signal == 0) g_stop_signal = signal_number;
}

}  // namespace

void stop_signals_install() {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or MPI call in progress is not interrupted
  for (int signal_number : {SIGUSR1, SIGTERM}) {
    VQA_CHECK(sigaction(signal_number, &action, nullptr) == 0,
              "cannot install a stop-signal handler");
  }
}

int stop_signal_received() { return g_stop_signal; }

const char* stop_signal_name(int signal_number) {
  if (signal_number == SIGUSR1) return "SIGUSR1";
  if (signal_number == SIGTERM) return "SIGTERM";
  static char name[32];
  std::snprintf(name, sizeof(name), "signal %d", signal_number);
  return name;
}

struct StopAgreement::State {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  int local = 0;   // what this rank sent in the reduction in flight
  int result = 0;  // its receive buffer: the largest signal number any rank saw
  int agreed = 0;  // result of the last completed reduction, once non-zero
};

StopAgreement::StopAgreement() : state_(std::make_unique<State>()) {
  VQA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &state_->comm));
}

StopAgreement::~StopAgreement() {
  if (state_->request != MPI_REQUEST_NULL) MPI_Wait(&state_->request, MPI_STATUS_IGNORE);
  if (state_->comm != MPI_COMM_NULL) MPI_Comm_free(&state_->comm);
}

bool StopAgreement::poll() {
  if (state_->agreed != 0) return true;
  if (state_->request != MPI_REQUEST_NULL) {
    // Launched one step ago: normally complete already, so this costs microseconds.
    VQA_CHECK_MPI(MPI_Wait(&state_->request, MPI_STATUS_IGNORE));
    state_->agreed = state_->result;
    if (state_->agreed != 0) return true;
  }
  state_->local = stop_signal_received();
  VQA_CHECK_MPI(MPI_Iallreduce(&state_->local, &state_->result, 1, MPI_INT, MPI_MAX, state_->comm,
                               &state_->request));
  return false;
}

int StopAgreement::signal() const { return state_->agreed; }

}  // namespace vqa::runtime
