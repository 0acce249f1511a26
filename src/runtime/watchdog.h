// The collective watchdog: no collective waits forever.
//
// Every collective of a Communicator (allreduce, broadcast, barrier, scalar
// sum) gets a deadline of collective_timeout() seconds from the moment this
// rank starts it. At half of it the rank prints a warning naming the
// collective (kind, bytes, sequence number), the training position
// (Communicator::set_position) and the ranks that have not arrived; at the
// deadline it prints the same as a FATAL line, aborts the NCCL communicator
// (ncclCommAbort) and ends the job with MPI_Abort(kExitCollectiveTimeout).
//
// How a rank learns who has not arrived while it is itself stuck inside a
// collective: one watchdog thread per process, started by distributed_init,
// owns a private duplicate of MPI_COMM_WORLD and talks point to point on it
// with non-blocking calls only. A rank whose collective is overdue sends a
// small query to every other rank; each peer's watchdog thread (alive even
// while that peer's main thread computes, sleeps or sits in another MPI call)
// answers with how many collectives it has started and completed on that
// communicator and its training position. A peer that has started fewer than
// the overdue sequence number "has not arrived"; a peer that does not answer
// within a second is named as dead, frozen or cut off. Why not the
// alternatives: passive-target RMA needs the target to progress MPI in
// several Open MPI transports (a rank stuck in compute would never answer);
// files need a shared file system that not every cluster has on every node;
// a periodic all-to-all heartbeat costs messages on every step even when
// nothing is wrong. Queries are sent only when a collective is already late,
// so a healthy job pays per collective two uncontended lock/unlock pairs and
// one clock read (well under a microsecond), and per process a thread that
// wakes every 100 ms to test one posted receive.
//
// A network cut between nodes: MPI_Abort needs the launcher, which the cut
// may make unreachable (its messages then wait on TCP retransmission for
// many minutes), so a rank that called it exits by itself 1 s later. The
// launcher must notice a lost node itself, by the TCP keepalive settings in
// jobs/mpirun-tune.conf (about 20 s); keep --comm-timeout longer than that.
//
// The watchdog also names a lost rank: while this rank has a collective in
// flight (or has been asked to stop by a signal, which is how mpirun tears a
// job down after a rank died), a rank on the same host whose process no
// longer exists is reported ("lost rank R") and the job ends with
// kExitRankLost. Ranks on other hosts are named by the timeout path and by
// mpirun itself.
#pragma once

namespace vqa::runtime {

// --comm-timeout's default: 10 minutes. Longer than any legitimate wait in a
// collective of this job (rank 0 writing a base-size checkpoint to a busy
// parallel file system while the others wait at the epoch barrier, uneven
// evaluation shards, the first NCCL connection set-up on a large job), and it
// is the NCCL watchdog timeout PyTorch has used by default; short enough that
// a hung job gives its allocation back within minutes instead of hours.
constexpr double kDefaultCollectiveTimeoutSeconds = 600.0;

// Exit status of a job ended by the watchdog's deadline (as timeout(1) uses).
constexpr int kExitCollectiveTimeout = 124;
// Exit status of a job ended because a rank's process disappeared.
constexpr int kExitRankLost = 125;

// Seconds every collective may take; 0 turns the deadline off (the watchdog
// still answers peers and still names lost ranks). Any thread, any time;
// every rank should use the same value. Negative values end the job with a
// message naming --comm-timeout.
void set_collective_timeout(double seconds);
double collective_timeout();

}  // namespace vqa::runtime
