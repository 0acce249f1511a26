// The one check that every rank starts alike: the same build, configuration
// and data files. Every rank hashes a text; on a mismatch the job stops
// before training and rank 0 says which ranks differ from it and how.
#pragma once

#include <string>

namespace vqa::runtime {

// Stops the job (exit 2) when `text` differs between the ranks. Rank 0
// prints `headline`, its host, and for each differing rank (at most 4, then a
// count) its host and the lines or '|'-separated parts that differ (at most
// 6 per rank, then a count), each rank's value beside rank 0's. Collective
// over MPI_COMM_WORLD; main thread; MPI must be up.
void require_same_on_all_ranks(const std::string& headline, const std::string& text);

}  // namespace vqa::runtime
