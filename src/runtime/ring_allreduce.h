// The CPU backend's allreduce of large buffers: a pipelined ring over MPI
// point-to-point messages, private to the runtime folder.
//
// Why not MPI_Allreduce: Open MPI 4's tuned component picks, for 2 or 3 ranks
// and messages above 16 MiB, reduce-then-broadcast, which sends every byte one
// way and then back: half the bandwidth of a full-duplex link (measured on a
// shaped 1 Gbit/s link: 0.06 GB/s bus bandwidth at 16 MiB, 0.116 at 1 MiB).
// The ring sends 2(n-1)/n of the buffer each way at once, in segments, and
// forwards each segment as soon as it is reduced, so transfer and reduction
// overlap and the link never waits for a whole chunk.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "runtime/watchdog_impl.h"  // CollectiveTracker

namespace vqa::runtime {

enum class RingElement { kFloat32, kBFloat16 };

// Segment sizes of the ring's messages. Each segment is reduced while the
// next ones travel. Which is faster depends on the transport: over Open MPI's
// TCP transport a message above its eager limit (64 KiB with headers) waits
// for a round trip before its data moves, and on a busy full-duplex link that
// round trip queues behind data (measured on a shaped 1 Gbit/s link, 16 MiB:
// 0.091 GB/s bus bandwidth with 1 MiB segments, 0.116 with 60 KiB); within
// one host shared memory copies large messages at once (5.4 GB/s with 1 MiB
// segments, 2.8 with 60 KiB). The communicator measures both at start-up
// (Communicator::tune_allreduce) and keeps the faster.
constexpr int64_t kRingSegmentLarge = int64_t{1} << 20;
constexpr int64_t kRingSegmentEager = int64_t{60} << 10;

// Sums `count` elements at `data` over every rank of `comm`, in place, in
// messages of at most `segment_bytes`; every rank ends with bit-identical
// results (each chunk is reduced on one rank and copied to the others).
// `scratch` is reused across calls. A failed MPI call
// ends the job through `tracker` (collective_call_failed). Called by one
// thread at a time per communicator, on every rank in the same order.
void ring_allreduce_sum(void* data, int64_t count, RingElement type, int64_t segment_bytes,
                        MPI_Comm comm, std::vector<char>& scratch, CollectiveTracker& tracker);

}  // namespace vqa::runtime
