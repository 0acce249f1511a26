#include "runtime/rank_agreement.h"

#include <mpi.h>

#include <algorithm>
#include <vector>

#include "runtime/check.h"            // fatal_user_error_from_rank0
#include "runtime/mpi_collectives.h"  // mpi_allgather_strings
#include "util/stable_hash.h"         // stable_hash

namespace vqa::runtime {

namespace {

constexpr int kMaxRanksShown = 4;
constexpr size_t kMaxPartsShown = 6;

// Lines of `text`, also split at '|' (identity strings join their parts with it).
std::vector<std::string> text_parts(const std::string& text) {
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (c == '\n' || c == '|') {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  if (parts.back().empty()) parts.pop_back();
  return parts;
}

// "'lr = 0.002' where rank 0 has 'lr = 0.001'; ..." for the parts of `other`
// that differ from `reference`.
std::string describe_difference(const std::string& reference, const std::string& other) {
  const auto want = text_parts(reference);
  const auto got = text_parts(other);
  std::string text;
  size_t shown = 0, differing = 0;
  for (size_t i = 0; i < std::max(want.size(), got.size()); ++i) {
    const std::string a = i < want.size() ? want[i] : "(nothing)";
    const std::string b = i < got.size() ? got[i] : "(nothing)";
    if (a == b) continue;
    if (++differing > kMaxPartsShown) continue;
    text += (shown++ ? "; " : "") + std::string("'") + b + "' where rank 0 has '" + a + "'";
  }
  if (differing > kMaxPartsShown) {
    text += "; and " + std::to_string(differing - kMaxPartsShown) + " more";
  }
  return text.empty() ? "the same text with another hash" : text;
}

std::vector<std::string> gather(const std::string& value) {
  return mpi_allgather_strings(MPI_COMM_WORLD, value, /*tracker=*/nullptr);
}

std::string host_name() {
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  VQA_CHECK_MPI(MPI_Get_processor_name(host, &length));
  return std::string(host, length);
}

}  // namespace

void require_same_on_all_ranks(const std::string& headline, const std::string& text) {
  const auto hashes = gather(std::to_string(util::stable_hash(text)));
  if (std::all_of(hashes.begin(), hashes.end(),
                  [&](const std::string& hash) { return hash == hashes[0]; })) {
    return;
  }
  // Only on a mismatch: every rank's text and host, to show the difference.
  const auto texts = gather(text);
  const auto hosts = gather(host_name());
  std::string report;
  int differing = 0;
  for (size_t r = 1; r < hashes.size(); ++r) {
    if (hashes[r] == hashes[0]) continue;
    if (++differing > kMaxRanksShown) continue;
    report += "\n  rank " + std::to_string(r) + " (" + hosts[r] +
              "): " + describe_difference(texts[0], texts[r]);
  }
  if (differing > kMaxRanksShown) {
    report += "\n  and " + std::to_string(differing - kMaxRanksShown) + " more rank(s)";
  }
  fatal_user_error_from_rank0(headline + " (rank 0 runs on " + hosts[0] + "):" + report);
}

}  // namespace vqa::runtime
