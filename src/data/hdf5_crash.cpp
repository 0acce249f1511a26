#include "data/hdf5_crash.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace vqa::data {

namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};

// Written by the reading thread, read by the signal handler on that same
// thread (a fatal signal is delivered to the thread that faulted).
std::atomic<bool> g_installed{false};
int g_exit_code = 2;
std::string g_prefix;
std::atomic<int> g_depth{0};
pthread_t g_thread;
std::string g_path;
char g_message[4096] = "";
struct sigaction g_previous[std::size(kSignals)];

void write_all(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t written = write(STDERR_FILENO, text, left);
    if (written <= 0) return;
    text += written;
    left -= static_cast<size_t>(written);
  }
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    default:
      return "a fatal signal";
  }
}

void on_fatal_signal(int signal, siginfo_t* info, void* /*context*/) {
  const bool sent = info != nullptr && info->si_code <= 0;  // kill(), raise(): not a fault
  if (!sent && g_depth.load() > 0 && pthread_equal(pthread_self(), g_thread) &&
      g_message[0] != '\0') {
    write_all(g_message);
    write_all(signal_name(signal));
    write_all(
        "); the file is most likely damaged (HDF5 1.10 can crash on a corrupt heap or header): "
        "write it again with vqa_prep\n");
    _exit(g_exit_code);
  }
  // Not a read of a dataset file: the handler from before takes the signal
  // when the faulting instruction runs again on return.
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    if (kSignals[i] == signal) sigaction(signal, &g_previous[i], nullptr);
  }
  // A signal sent by kill() or raise() does not come again by itself.
  if (sent) raise(signal);
}

// The handler prints nothing while g_message[0] is 0, so the first byte is
// written last: a signal in the middle of the copy never prints half a message.
void format_message(const std::string& what) {
  const std::string text = g_prefix + g_path + ": " + what + ": HDF5 crashed (";
  const size_t length = std::min(text.size(), sizeof(g_message) - 1);
  if (length == 0) return;
  g_message[0] = '\0';
  std::memcpy(g_message + 1, text.data() + 1, length - 1);
  g_message[length] = '\0';
  g_message[0] = text[0];
}

}  // namespace

void hdf5_crash_report_install(const std::string& prefix, int exit_code) {
  if (g_installed.exchange(true)) return;
  g_prefix = prefix;
  g_exit_code = exit_code;
  struct sigaction action {};
  action.sa_sigaction = &on_fatal_signal;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    sigaction(kSignals[i], &action, &g_previous[i]);
  }
}

Hdf5CrashScope::Hdf5CrashScope(const std::string& path) {
  if (!g_installed.load()) return;
  if (g_depth.load() == 0) {
    g_thread = pthread_self();
    g_path = path;
    format_message("opening it");
  } else if (!pthread_equal(pthread_self(), g_thread)) {
    return;  // another thread holds the report; HDF5 runs on one thread at a time
  }
  g_depth.fetch_add(1);
  active_ = true;
}

Hdf5CrashScope::~Hdf5CrashScope() {
  if (active_ && g_depth.fetch_sub(1) == 1) g_message[0] = '\0';
}

void hdf5_crash_context(const std::string& what) {
  if (!g_installed.load() || g_depth.load() == 0 || !pthread_equal(pthread_self(), g_thread)) {
    return;
  }
  format_message(what);
}

}  // namespace vqa::data
