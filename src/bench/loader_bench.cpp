// vqa_loader_bench: how much of a training step the data path costs. A
// consumer takes a fixed time per batch (a stand-in for the model step);
// the bench reports samples/s and the fraction of step time next() spent
// waiting for the prefetch thread. Run it under mpirun like the job. With
// --augment resized-crop it times the random resized crop too (a file with
// source images: vqa_prep synth --source-size, convert --keep-source-images);
// --compute-ms 0 measures how fast the data path alone can go. With
// --images-as-bytes the loader hands out the stored uint8 pixels, as vqa_train's
// loader does for a CUDA device (normalised there); without it, float32
// normalised on the host, as for the CPU.
#include <chrono>
#include <cstdio>
#include <thread>

#include "data/loader.h"           // ShardedLoader
#include "runtime/check.h"         // fatal_user_error
#include "runtime/communicator.h"  // communicator_create: sum and max over the ranks
#include "runtime/distributed.h"   // DistributedSession
#include "util/clock.h"            // SteadyClock, seconds_since
#include "util/options.h"          // OptionTable

namespace {

struct BenchOptions {
  std::string data, split = "train";
  int64_t batch = 32;
  int prefetch = 2;
  double compute_ms = 20.0;
  int64_t epochs = 2;
  vqa::data::Augment augment = vqa::data::Augment::kNone;
  int augment_threads = 1;
  bool images_as_bytes = false;
};

// Returns false after printing --help.
bool parse_options(int argc, char** argv, int rank, BenchOptions& options) {
  vqa::util::OptionTable table("vqa_loader_bench options");
  table.add_required("data", &options.data, "dataset file (vqa_prep output)")
      .add_choice("split", &options.split, "the split to read", {"train", "test"})
      .add("batch", &options.batch, "batch per rank", vqa::util::Range{1, 65536})
      .add("prefetch", &options.prefetch, "batches prepared ahead (0: none)",
           vqa::util::Range{0, 64})
      .add("compute-ms", &options.compute_ms, "consumer time per batch, milliseconds",
           vqa::util::Range{0, 1e6})
      .add("epochs", &options.epochs, "epochs to time", vqa::util::Range{1, 1e6})
      .add_choice("augment", &options.augment,
                  "vqa_train's --augment: none, or resized-crop (M3AE's random resized crop, "
                  "scale 0.9..1, ratio 3/4..4/3)",
                  vqa::data::kAugmentNames)
      .add("augment-threads", &options.augment_threads, "crop threads per rank",
           vqa::util::Range{1, 1024})
      .add("images-as-bytes", &options.images_as_bytes,
           "hand out uint8 pixels, as vqa_train does for a CUDA device (false: float32 "
           "normalised on the host, as for the CPU)");
  try {
    if (table.parse(argc, argv)) return true;
  } catch (const vqa::util::OptionError& e) {
    vqa::runtime::fatal_user_error(std::string(e.what()) + " (see --help)");
  }
  if (rank == 0) table.print_help(stdout, "usage: vqa_loader_bench --data FILE [options]");
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  vqa::runtime::DistributedSession session(&argc, &argv);  // MPI ends after the loader
  const auto& rank = session.rank_info();
  BenchOptions options;
  if (!parse_options(argc, argv, rank.rank, options)) return 0;
  auto comm = vqa::runtime::communicator_create(vqa::runtime::Backend::kMpi, torch::kCPU);
  double elapsed = 0.0, wait = 0.0;
  int64_t samples = 0, steps = 0, dataset_size = 0, image_size = 0, image_bytes = 0;
  try {
    vqa::data::LoaderOptions loader_options;
    loader_options.batch_per_rank = options.batch;
    loader_options.prefetch_depth = options.prefetch;
    loader_options.rank = rank.rank;
    loader_options.world_size = rank.world_size;
    loader_options.random_resized_crop = options.augment == vqa::data::Augment::kResizedCrop;
    loader_options.augment_threads = options.augment_threads;
    loader_options.images_as_bytes = options.images_as_bytes;
    vqa::data::ShardedLoader loader(options.data, options.split, loader_options);
    dataset_size = loader.info().num_questions;
    image_size = loader.info().image_size;
    const auto compute = std::chrono::duration<double, std::milli>(options.compute_ms);
    vqa::data::Batch batch;
    // Epoch 0 warms the page cache and the I/O thread; epochs 1.. are timed.
    for (int64_t epoch = 0; epoch <= options.epochs; ++epoch) {
      const double wait_before = loader.wait_seconds();
      const auto start = vqa::util::SteadyClock::now();
      loader.start_epoch(epoch);
      while (loader.next(batch)) {
        std::this_thread::sleep_for(compute);  // the model step
        if (epoch > 0) samples += batch.size(), ++steps;
        image_bytes = batch.images.nbytes() / batch.size();
      }
      if (epoch > 0) {
        elapsed += vqa::util::seconds_since(start);
        wait += loader.wait_seconds() - wait_before;
      }
    }
  } catch (const std::exception& e) {
    vqa::runtime::fatal_user_error(e.what());
  }
  const double total_samples = comm->sum(static_cast<double>(samples));
  const double slowest = comm->max(elapsed);
  const double worst_wait = comm->max(wait);
  if (rank.rank == 0) {
    std::printf(
        "dataset %s [%s]: %ld questions; %d ranks x batch %ld, prefetch %d, consumer %.1f "
        "ms/batch\n",
        options.data.c_str(), options.split.c_str(), static_cast<long>(dataset_size),
        rank.world_size, static_cast<long>(options.batch), options.prefetch, options.compute_ms);
    std::printf(
        "%ld epochs, %ld steps per rank: %.0f samples/s (all ranks), waiting for data %.2f%% of "
        "step time (worst rank), %.3f ms per step\n",
        static_cast<long>(options.epochs), static_cast<long>(steps), total_samples / slowest,
        100.0 * worst_wait / slowest, steps ? 1e3 * worst_wait / steps : 0.0);
    const double per_rank = total_samples / slowest / rank.world_size;
    std::printf("images as %s: %ld host bytes per sample\n",
                options.images_as_bytes ? "uint8 bytes" : "float32",
                static_cast<long>(image_bytes));
    if (options.augment == vqa::data::Augment::kResizedCrop) {
      std::printf(
          "random resized crop to %ld px on %d crop thread(s) per rank: %.1f samples/s per rank, "
          "%.1f per crop thread\n",
          static_cast<long>(image_size), options.augment_threads, per_rank,
          per_rank / options.augment_threads);
    } else {
      std::printf("stored %ld px images: %.1f samples/s per rank\n", static_cast<long>(image_size),
                  per_rank);
    }
  }
  return 0;
}
