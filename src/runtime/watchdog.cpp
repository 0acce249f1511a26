// The collective watchdog thread: deadlines, peer queries, lost ranks. The
// design and its reasons are in watchdog.h.
#include "runtime/watchdog.h"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "runtime/check.h"            // rank_label, fatal_error, fatal_user_error
#include "runtime/mpi_collectives.h"  // mpi_allgather_strings
#include "runtime/system_info.h"      // process_start_ticks
#include "runtime/tracked_check.h"    // collective_call_failed
#include "runtime/types.h"            // RankInfo
#include "runtime/watchdog_impl.h"    // CollectiveTracker, CollectiveState

namespace vqa::runtime {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<double> g_timeout{kDefaultCollectiveTimeoutSeconds};

constexpr double kWakeSeconds = 0.1;   // how often the thread looks (and answers peers)
constexpr double kMaxReplyWait = 1.0;  // how long a query waits for answers
// MPI_Abort gets this long before _Exit: the request reaches a reachable
// launcher in milliseconds, and the launcher then ends every rank; waiting
// longer only keeps this rank alive while mpirun runs its SIGCONT, SIGTERM,
// SIGKILL rounds (1 s apart).
constexpr int kAbortGraceSeconds = 1;
constexpr size_t kMaxNamedRanks = 16;  // longer lists end with "and N more"
constexpr int kQueryTag = 7301;
constexpr int kReplyTag = 7302;

// One message, query or reply, as int64 fields.
enum Field { kRound, kIndex, kSequence, kStarted, kCompleted, kPendingMs, kQuietMs, kEpoch, kStep };
constexpr int kFieldCount = 9;
using Message = std::array<int64_t, kFieldCount>;

struct Outgoing {
  MPI_Request request = MPI_REQUEST_NULL;
  Message data{};
};

// What a peer answered in one query round.
struct Answer {
  bool answered = false;
  Message data{};
};

struct Round {
  int64_t id = 0;
  int64_t sequence = 0;
  std::vector<Answer> answers;
};

// Watchdog progress on one communicator's oldest pending collective.
struct Overdue {
  int64_t sequence = 0;
  bool warning_round_sent = false;
  bool warned = false;
  bool final_round_sent = false;
};

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", seconds);
  return text;
}

class Watchdog {
 public:
  void start(const RankInfo& info) {
    me_ = info.rank;
    world_ = info.world_size;
    VQA_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    VQA_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    find_peers(info);
    post_receive(query_);
    post_receive(reply_);
    stopping_ = false;
    thread_ = std::thread([this] { loop(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (Incoming* incoming : {&query_, &reply_}) {
      if (incoming->request == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&incoming->request);
      MPI_Wait(&incoming->request, MPI_STATUS_IGNORE);
    }
    const Clock::time_point give_up = Clock::now() + std::chrono::seconds(1);
    while (!outgoing_.empty() && Clock::now() < give_up) {
      reap_outgoing();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // An answer to a peer that never received it: let MPI finish or drop it;
    // its buffer must outlive the request, so it is deliberately not freed.
    static auto* unfinished = new std::list<Outgoing>;
    for (Outgoing& message : outgoing_) MPI_Request_free(&message.request);
    unfinished->splice(unfinished->end(), outgoing_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    rounds_.clear();
    overdue_.clear();
  }

  void add(CollectiveTracker* tracker) {
    std::lock_guard<std::mutex> lock(mutex_);
    trackers_.push_back(tracker);
  }

  void remove(CollectiveTracker* tracker) {
    std::lock_guard<std::mutex> lock(mutex_);
    trackers_.erase(std::remove(trackers_.begin(), trackers_.end(), tracker), trackers_.end());
    overdue_.erase(tracker->index());
    rounds_.erase(tracker->index());
  }

  int next_index() { return next_index_++; }

  // "lost rank 1 (pid 123 on host)" for ranks on this host whose process
  // has ended, or "".
  std::string lost_ranks_text() const {
    std::string text;
    for (int rank : monitored_) {
      // The pid was checked against the start time once; a pid reused within
      // one wake period is not a practical concern, a zombie is reaped by the
      // launcher at once.
      if (kill(static_cast<pid_t>(peers_[rank].pid), 0) == 0 || errno != ESRCH) continue;
      text += (text.empty() ? "lost " : ", ") + peer_label(rank) + " (its process pid " +
              std::to_string(peers_[rank].pid) + " has ended)";
    }
    return text;
  }

 private:
  struct Incoming {
    MPI_Request request = MPI_REQUEST_NULL;
    Message data{};
    int tag = 0;
  };
  struct Peer {
    long pid = -1;
    long long start_ticks = -1;
    std::string host;
  };

  // Every rank's host, pid and process start time; the ranks on this host
  // whose process this one can see are watched for a sudden end.
  void find_peers(const RankInfo& info) {
    const long pid = static_cast<long>(getpid());
    const auto all = mpi_allgather_strings(
        comm_,
        std::to_string(pid) + " " + std::to_string(process_start_ticks(pid)) + " " + info.host,
        /*tracker=*/nullptr);
    peers_.assign(world_, Peer{});
    monitored_.clear();
    for (int rank = 0; rank < world_; ++rank) {
      std::istringstream fields(all[rank]);
      Peer& peer = peers_[rank];
      fields >> peer.pid >> peer.start_ticks >> peer.host;
      // Same host name and the same process visible here (not another pid
      // namespace, where the number would name a different process).
      if (rank != me_ && peer.host == info.host && peer.start_ticks >= 0 &&
          process_start_ticks(peer.pid) == peer.start_ticks) {
        monitored_.push_back(rank);
      }
    }
  }

  std::string peer_label(int rank) const {
    return "rank " + std::to_string(rank) + " (" + peers_[rank].host + ")";
  }

  void post_receive(Incoming& incoming) {
    incoming.tag = &incoming == &query_ ? kQueryTag : kReplyTag;
    if (MPI_Irecv(incoming.data.data(), kFieldCount, MPI_INT64_T, MPI_ANY_SOURCE, incoming.tag,
                  comm_, &incoming.request) != MPI_SUCCESS) {
      incoming.request = MPI_REQUEST_NULL;  // the watchdog goes deaf, the job goes on
    }
  }

  // Returns the sender of a newly arrived message in `incoming`, or -1.
  int take(Incoming& incoming, Message& data) {
    if (incoming.request == MPI_REQUEST_NULL) return -1;
    int done = 0;
    MPI_Status status;
    if (MPI_Test(&incoming.request, &done, &status) != MPI_SUCCESS || !done) return -1;
    data = incoming.data;
    post_receive(incoming);
    return status.MPI_SOURCE;
  }

  void send(int to, int tag, const Message& data) {
    outgoing_.emplace_back();
    Outgoing& message = outgoing_.back();
    message.data = data;
    if (MPI_Isend(message.data.data(), kFieldCount, MPI_INT64_T, to, tag, comm_,
                  &message.request) != MPI_SUCCESS) {
      outgoing_.pop_back();
    }
  }

  void reap_outgoing() {
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {
      int done = 0;
      if (MPI_Test(&it->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) {
        it = outgoing_.erase(it);
      } else {
        ++it;
      }
    }
  }

  CollectiveTracker* tracker_at(int64_t index) const {
    for (CollectiveTracker* tracker : trackers_) {
      if (tracker->index() == index) return tracker;
    }
    return nullptr;
  }

  void serve_queries() {
    Message query;
    for (int from; (from = take(query_, query)) >= 0;) {
      Message reply{};
      reply[kRound] = query[kRound];
      reply[kIndex] = query[kIndex];
      reply[kSequence] = query[kSequence];
      reply[kStarted] = -1;  // no such communicator here (yet)
      reply[kPendingMs] = -1;
      if (CollectiveTracker* tracker = tracker_at(query[kIndex])) {
        const CollectiveState state = tracker->state();
        reply[kStarted] = state.started;
        reply[kCompleted] = state.completed;
        reply[kPendingMs] = state.pending() ? int64_t(state.seconds_pending * 1000) : -1;
        reply[kQuietMs] = int64_t(state.seconds_quiet * 1000);
        reply[kEpoch] = state.epoch;
        reply[kStep] = state.step;
      }
      send(from, kReplyTag, reply);
    }
  }

  void collect_replies() {
    Message reply;
    for (int from; (from = take(reply_, reply)) >= 0;) {
      auto round = rounds_.find(static_cast<int>(reply[kIndex]));
      if (round == rounds_.end() || round->second.id != reply[kRound]) continue;  // stale
      round->second.answers[from] = Answer{true, reply};
    }
  }

  void send_queries(int index, int64_t sequence) {
    Round& round = rounds_[index];
    round.id = ++last_round_;
    round.sequence = sequence;
    round.answers.assign(world_, Answer{});
    Message query{};
    query[kRound] = round.id;
    query[kIndex] = index;
    query[kSequence] = sequence;
    for (int rank = 0; rank < world_; ++rank) {
      if (rank != me_) send(rank, kQueryTag, query);
    }
  }

  // The ranks that have not arrived at the round's collective, from their answers.
  std::string describe_peers(int index, double reply_wait) const {
    const auto found = rounds_.find(index);
    if (found == rounds_.end()) return "";
    const Round& round = found->second;
    std::vector<std::string> items;
    size_t more = 0;
    for (int rank = 0; rank < world_; ++rank) {
      if (rank == me_) continue;
      const Answer& answer = round.answers[rank];
      const Message& data = answer.data;
      std::string item;
      if (!answer.answered) {
        item = peer_label(rank) + " did not answer within " + seconds_text(reply_wait) +
               " (dead, frozen, or its network is cut)";
      } else if (data[kStarted] < 0) {
        item = peer_label(rank) + " has not created this communicator yet";
      } else if (data[kStarted] < round.sequence) {
        item = peer_label(rank) + " " + position_text(data[kEpoch], data[kStep]) + " has started " +
               std::to_string(data[kStarted]) + " collective(s) and ";
        item += data[kPendingMs] >= 0
                    ? "has waited in #" + std::to_string(data[kCompleted] + 1) + " for " +
                          seconds_text(data[kPendingMs] / 1000.0)
                    : "has been in none for " + seconds_text(data[kQuietMs] / 1000.0);
      } else {
        continue;  // arrived
      }
      if (items.size() < kMaxNamedRanks) {
        items.push_back(item);
      } else {
        ++more;
      }
    }
    if (items.empty()) {
      return "every rank has arrived, so the collective itself is not progressing (network, MPI "
             "or NCCL)";
    }
    std::string text = "ranks that have not arrived: ";
    for (size_t i = 0; i < items.size(); ++i) text += (i ? "; " : "") + items[i];
    if (more > 0) text += "; and " + std::to_string(more) + " more";
    return text;
  }

  std::string collective_text(const CollectiveTracker& tracker) const {
    std::string text = tracker.describe();
    if (tracker.index() > 0) text += " on communicator " + std::to_string(tracker.index());
    return text;
  }

  void check_deadline(const CollectiveTracker& tracker, const CollectiveState& state,
                      double timeout) {
    const int index = tracker.index();
    if (!state.pending()) {
      overdue_.erase(index);
      return;
    }
    Overdue& overdue = overdue_[index];
    if (overdue.sequence != state.oldest) overdue = Overdue{state.oldest};
    const double reply_wait = std::min(kMaxReplyWait, timeout / 8);
    const double age = state.seconds_pending;
    if (!overdue.warning_round_sent && age >= timeout / 2 - reply_wait) {
      send_queries(index, state.oldest);
      overdue.warning_round_sent = true;
    }
    if (!overdue.warned && age >= timeout / 2) {
      std::fprintf(stderr,
                   "[vqa] WARNING %s: collective watchdog: %s has waited %s, half of "
                   "--comm-timeout %g s; %s. The job ends if it is not done in %s.\n",
                   rank_label().c_str(), collective_text(tracker).c_str(),
                   seconds_text(age).c_str(), timeout, describe_peers(index, reply_wait).c_str(),
                   seconds_text(timeout - age).c_str());
      std::fflush(stderr);
      overdue.warned = true;
    }
    if (!overdue.final_round_sent && age >= timeout - reply_wait) {
      send_queries(index, state.oldest);
      overdue.final_round_sent = true;
    }
    if (age >= timeout) {
      end_job("[vqa] FATAL " + rank_label() + ": collective watchdog: " + collective_text(tracker) +
                  " did not complete within --comm-timeout " + seconds_text(timeout) + "; " +
                  describe_peers(index, reply_wait) + ". Aborting the job.",
              kExitCollectiveTimeout);
    }
  }

  // A rank whose process ended before this one finished will never arrive
  // at the next collective; say which, in the job's own output, before
  // mpirun's teardown (which follows within a second) or the deadline. MPI
  // finalisation synchronises, so no rank ends first in a healthy run.
  void check_lost_ranks(const CollectiveTracker* waiting) {
    if (monitored_.empty()) return;
    const std::string lost = lost_ranks_text();
    if (lost.empty()) return;
    std::string doing = "this rank has no collective in flight";
    if (waiting != nullptr) {
      doing = "this rank waits in " + collective_text(*waiting);
    } else if (!trackers_.empty()) {
      const CollectiveState state = trackers_.front()->state();
      doing += ", " + position_text(state.epoch, state.step);
    }
    end_job("[vqa] FATAL " + rank_label() + ": " + lost + "; " + doing + ". Ending the job.",
            kExitRankLost);
  }

  // Called with mutex_ held; never returns.
  [[noreturn]] void end_job(const std::string& message, int exit_code) {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    for (CollectiveTracker* tracker : trackers_) tracker->run_abort_hook();
    // MPI_Abort needs the launcher; if the network to it is cut it may never return.
    std::thread([exit_code] {
      std::this_thread::sleep_for(std::chrono::seconds(kAbortGraceSeconds));
      std::_Exit(exit_code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      const double timeout = g_timeout.load();
      const double period = timeout > 0 ? std::min(kWakeSeconds, timeout / 40) : kWakeSeconds;
      wake_.wait_for(lock, std::chrono::duration<double>(period), [this] { return stopping_; });
      if (stopping_) break;
      serve_queries();
      collect_replies();
      reap_outgoing();
      const CollectiveTracker* waiting = nullptr;
      for (CollectiveTracker* tracker : trackers_) {
        const std::string error = tracker->poll_completion();
        if (!error.empty()) {
          end_job("[vqa] FATAL " + rank_label() + ": " + error + " during " +
                      collective_text(*tracker) + ". Aborting the job.",
                  1);
        }
        const CollectiveState state = tracker->state();
        if (state.pending()) waiting = tracker;
        if (timeout > 0) check_deadline(*tracker, state, timeout);
      }
      check_lost_ranks(waiting);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  bool stopping_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int me_ = 0;
  int world_ = 1;
  std::vector<Peer> peers_;
  std::vector<int> monitored_;
  std::vector<CollectiveTracker*> trackers_;
  std::atomic<int> next_index_{0};
  Incoming query_;
  Incoming reply_;
  std::list<Outgoing> outgoing_;  // a list: buffers stay put while MPI sends them
  int64_t last_round_ = 0;
  std::map<int, Round> rounds_;
  std::map<int, Overdue> overdue_;
};

// Never destroyed: the watchdog may still be needed while the process exits.
Watchdog& watchdog() {
  static Watchdog* instance = new Watchdog;
  return *instance;
}

}  // namespace

void set_collective_timeout(double seconds) {
  if (!(seconds >= 0)) {
    fatal_user_error("--comm-timeout must be >= 0 seconds (0: no deadline), got " +
                     std::to_string(seconds));
  }
  g_timeout.store(seconds);
}

double collective_timeout() { return g_timeout.load(); }

void watchdog_register(CollectiveTracker* tracker) { watchdog().add(tracker); }
void watchdog_deregister(CollectiveTracker* tracker) { watchdog().remove(tracker); }
int watchdog_next_index() { return watchdog().next_index(); }

void watchdog_start(const RankInfo& info) { watchdog().start(info); }
void watchdog_stop() { watchdog().stop(); }

void collective_call_failed(const CollectiveTracker* tracker, const char* library, const char* call,
                            const char* file, int line, const std::string& detail) {
  if (!tracker) fatal_error(library, call, file, line, detail);
  const std::string lost = watchdog().lost_ranks_text();
  fatal_error(library, call, file, line,
              detail + " during " + tracker->describe() + (lost.empty() ? "" : "; " + lost));
}

}  // namespace vqa::runtime
