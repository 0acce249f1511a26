// Reads a dataset file with ShardedLoader on every rank, as the training job
// does: a bad file must end every rank with the loader's message, quickly.
#include <cstdio>
#include <exception>

#include "data/loader.h"          // ShardedLoader
#include "runtime/check.h"        // fatal_user_error
#include "runtime/distributed.h"  // distributed_init

int main(int argc, char** argv) {
  const auto& info = vqa::runtime::distributed_init(&argc, &argv);
  if (argc != 2) vqa::runtime::fatal_user_error("usage: vqa_bad_file_probe FILE");
  try {
    vqa::data::LoaderOptions options;
    options.batch_per_rank = 16;
    options.rank = info.rank;
    options.world_size = info.world_size;
    vqa::data::ShardedLoader loader(argv[1], "train", options);
    loader.start_epoch(0);
    vqa::data::Batch batch;
    int64_t samples = 0;
    while (loader.next(batch)) samples += batch.size();
    std::printf("rank %d read %ld samples\n", info.rank, static_cast<long>(samples));
  } catch (const std::exception& e) {
    vqa::runtime::fatal_user_error(e.what());
  }
  vqa::runtime::distributed_finalize();
  return 0;
}
