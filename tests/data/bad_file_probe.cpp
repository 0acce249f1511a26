// Reads a dataset file with ShardedLoader on every rank, as the training job
// does: a bad file must end every rank with the loader's message, quickly.
//
//   vqa_bad_file_probe FILE [--finalize-first]
//
// --finalize-first ends MPI while the loader still exists (the order that
// DistributedSession prevents), so that a test sees the loader's check fire.
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "data/loader.h"          // ShardedLoader
#include "runtime/check.h"        // fatal_user_error
#include "runtime/distributed.h"  // distributed_init, distributed_finalize

int main(int argc, char** argv) {
  const auto& info = vqa::runtime::distributed_init(&argc, &argv);
  const bool finalize_first = argc == 3 && std::string(argv[2]) == "--finalize-first";
  if (argc != 2 && !finalize_first) {
    vqa::runtime::fatal_user_error("usage: vqa_bad_file_probe FILE [--finalize-first]");
  }
  std::unique_ptr<vqa::data::ShardedLoader> loader;
  try {
    vqa::data::LoaderOptions options;
    options.batch_per_rank = 16;
    options.rank = info.rank;
    options.world_size = info.world_size;
    loader = std::make_unique<vqa::data::ShardedLoader>(argv[1], "train", options);
    loader->start_epoch(0);
    vqa::data::Batch batch;
    int64_t samples = 0;
    while (loader->next(batch)) samples += batch.size();
    std::printf("rank %d read %ld samples\n", info.rank, static_cast<long>(samples));
  } catch (const std::exception& e) {
    vqa::runtime::fatal_user_error(e.what());
  }
  if (!finalize_first) loader.reset();
  vqa::runtime::distributed_finalize();
  return 0;
}
