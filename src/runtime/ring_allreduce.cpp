#include "runtime/ring_allreduce.h"

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "runtime/tracked_check.h"  // VQA_CHECK_MPI_IN

namespace vqa::runtime {

namespace {

// One tag for the whole ring: between two ranks MPI matches messages of one
// tag in the order they were posted, and every rank posts its sends and
// receives in step order.
constexpr int kRingTag = 7301;

struct Span {
  int64_t begin = 0;  // elements
  int64_t count = 0;
};

// Chunk c of n over `count` elements: the first count % n chunks one larger.
Span chunk_span(int64_t count, int n, int c) {
  const int64_t base = count / n, extra = count % n;
  return {c * base + std::min<int64_t>(c, extra), base + (c < extra ? 1 : 0)};
}

void add_into(char* destination, const char* source, int64_t count, RingElement type) {
  if (type == RingElement::kFloat32) {
    auto* out = reinterpret_cast<float*>(destination);
    const auto* in = reinterpret_cast<const float*>(source);
    for (int64_t i = 0; i < count; ++i) out[i] += in[i];
  } else {
    // Summed in float and rounded to nearest even, as torch adds bfloat16.
    auto* out = reinterpret_cast<c10::BFloat16*>(destination);
    const auto* in = reinterpret_cast<const c10::BFloat16*>(source);
    for (int64_t i = 0; i < count; ++i) out[i] = c10::BFloat16(float(out[i]) + float(in[i]));
  }
}

// Waits for `request` without holding the core: MPI_Wait spins (Open MPI's
// progress loop, at best with sched_yield), and on a CPU rank the compute
// thread shares that core, so a spinning wait takes about half of it for as
// long as the allreduce runs (measured: the compute thread got 47% of
// forward + backward on a 1 Gbit/s link). Between tests the thread sleeps,
// from 2 us doubling to kMaxPollSleepMicroseconds; the kernel's socket
// buffers and the already posted messages keep the link busy meanwhile. A
// 50 us cap measured no better on a 1 Gbit/s link (53.2-53.5 samples/s in
// three runs against 52.3-60.0 with 200 us) for four times the wake-ups.
constexpr int kMaxPollSleepMicroseconds = 200;

void wait_without_spinning(MPI_Request* requests, int count, CollectiveTracker& tracker) {
  int sleep_us = 2;
  for (;;) {
    int done = 0;
    VQA_CHECK_MPI_IN(&tracker, MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min(2 * sleep_us, kMaxPollSleepMicroseconds);
  }
}

}  // namespace

// 2(n-1) steps. At step t every rank receives chunk (rank - t - 1) mod n from
// its left neighbour and sends chunk (rank - t) mod n to its right one: in the
// first n-1 steps (reduce-scatter) the received chunk is added to the local
// one, after which chunk (rank + 1) mod n holds the full sum; in the last n-1
// (allgather) it replaces the local one. The chunk received at step t is the
// one sent at step t+1, so each segment goes on as soon as it has arrived and
// been added, while the rest of the chunk is still on the wire.
void ring_allreduce_sum(void* data, int64_t count, RingElement type, int64_t segment_bytes,
                        MPI_Comm comm, std::vector<char>& scratch, CollectiveTracker& tracker) {
  int rank = 0, n = 1;
  VQA_CHECK_MPI_IN(&tracker, MPI_Comm_rank(comm, &rank));
  VQA_CHECK_MPI_IN(&tracker, MPI_Comm_size(comm, &n));
  if (n < 2 || count == 0) return;
  const int64_t element = type == RingElement::kFloat32 ? 4 : 2;
  const int64_t segment = std::max<int64_t>(1, segment_bytes / element);
  const int right = (rank + 1) % n, left = (rank + n - 1) % n;
  auto* bytes = static_cast<char*>(data);
  scratch.resize(static_cast<size_t>(chunk_span(count, n, 0).count * element));

  // Segments of a chunk: (element offset into the buffer, element count).
  const auto segments_of = [&](int chunk) {
    std::vector<Span> parts;
    const Span span = chunk_span(count, n, chunk);
    for (int64_t offset = 0; offset < span.count; offset += segment) {
      parts.push_back({span.begin + offset, std::min(segment, span.count - offset)});
    }
    return parts;
  };
  const auto post_send = [&](const Span& part, std::vector<MPI_Request>& requests) {
    requests.emplace_back();
    VQA_CHECK_MPI_IN(&tracker,
                     MPI_Isend(bytes + part.begin * element, static_cast<int>(part.count * element),
                               MPI_BYTE, right, kRingTag, comm, &requests.back()));
  };

  const int steps = 2 * (n - 1);
  std::vector<MPI_Request> sends, next_sends, receives;
  for (const Span& part : segments_of(rank)) post_send(part, sends);
  for (int t = 0; t < steps; ++t) {
    const bool reduce = t < n - 1;
    const int chunk = ((rank - t - 1) % n + n) % n;
    const std::vector<Span> parts = segments_of(chunk);
    const int64_t chunk_begin = parts.empty() ? 0 : parts.front().begin;
    receives.assign(parts.size(), MPI_REQUEST_NULL);
    for (size_t k = 0; k < parts.size(); ++k) {
      char* target = reduce ? scratch.data() + (parts[k].begin - chunk_begin) * element
                            : bytes + parts[k].begin * element;
      VQA_CHECK_MPI_IN(&tracker, MPI_Irecv(target, static_cast<int>(parts[k].count * element),
                                           MPI_BYTE, left, kRingTag, comm, &receives[k]));
    }
    next_sends.clear();
    for (size_t k = 0; k < parts.size(); ++k) {
      wait_without_spinning(&receives[k], 1, tracker);
      if (reduce) {
        add_into(bytes + parts[k].begin * element,
                 scratch.data() + (parts[k].begin - chunk_begin) * element, parts[k].count, type);
      }
      if (t + 1 < steps) post_send(parts[k], next_sends);
    }
    // This step's sends are done before a later step receives into their chunk.
    wait_without_spinning(sends.data(), static_cast<int>(sends.size()), tracker);
    sends.swap(next_sends);
  }
}

}  // namespace vqa::runtime
