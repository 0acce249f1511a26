// How many operators LibTorch dispatches in one CPU training step (forward
// with the loss, backward, and what follows backward: the gradients'
// averaging on one rank, the finite check, clipping and the optimiser),
// counted with RecordFunction callbacks, the hook LibTorch's profiler uses.
// On a GPU each operator is at least one kernel launch, so the count is what
// the step's launch overhead scales with; an ATen multi-tensor operator
// (_foreach_*, _fused_*) counts once, as on a GPU it is one launch per chunk
// of tensors (the operators its CPU fallback dispatches per tensor inside it
// are left out). The test holds the exact counts of each phase for the
// `small` preset (q, k and v projected apart and packed) and the `base`
// preset (packed; float32 with LibTorch 1.13, bf16 CPU autocast with 2.6),
// for the LibTorch versions op_count_held.h has numbers for: a change that
// dispatches more fails here, and so does one that dispatches fewer until
// the held numbers follow it (so that a later rise cannot hide under an old
// ceiling). And after backward nothing runs per parameter tensor: a model
// with twice the layers dispatches the same operators there.
//
// VQA_OP_COUNT_CALLERS=N prints, for each counted phase, the N most
// frequent pairs of operator and caller (the innermost operator open around
// it, "-" at the top), outside the multi-tensor operators and the batched
// products' per-matrix loops: where a change would save operators.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/record_function.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_autocast.h"          // CpuAutocast
#include "model/layers.h"          // set_packed_projections
#include "model/m3ae.h"            // M3AE, model_config_preset
#include "op_count_held.h"         // StepOperatorCounts, kHeldOperatorCounts
#include "runtime/communicator.h"  // Communicator
#include "train/batches.h"         // vqa_loss
#include "train/gradient_sync.h"   // GradientSynchronizer
#include "train/optimizer.h"       // VqaOptimizer, aten_fused_adamw_available
#include "train/setup.h"           // trainable_parameters

namespace {

using vqa::testing::CpuAutocast;
using vqa::testing::kHeldOperatorCounts;
using vqa::testing::kOperatorCountsHeld;
using vqa::testing::StepOperatorCounts;

std::atomic<int64_t> g_operators{0};         // aten operators (RecordScope::FUNCTION)
std::atomic<int64_t> g_products{0};          // of them, matrix products (mm, addmm, bmm, baddbmm)
std::atomic<int64_t> g_in_batched{0};        // of them, inside a bmm or baddbmm
std::atomic<int64_t> g_autograd{0};          // autograd nodes run by backward
thread_local int t_inside_multi_tensor = 0;  // open _foreach_* / _fused_* operators
thread_local int t_inside_batched = 0;       // open bmm / baddbmm operators

// VQA_OP_COUNT_CALLERS: how many operator <- caller pairs to print per phase
// (0: none, and the callbacks keep no names).
int64_t callers_to_print() {
  static const int64_t n = [] {
    const char* value = std::getenv("VQA_OP_COUNT_CALLERS");
    return value == nullptr ? int64_t{0} : std::max<int64_t>(0, std::atoll(value));
  }();
  return n;
}
thread_local std::vector<const char*> t_open_names;  // open counted operators, innermost last
std::mutex g_callers_mutex;
std::map<std::string, int64_t> g_callers;  // "operator <- caller" -> calls this phase

void note_caller(const char* name) {
  const std::string key =
      std::string(name) + " <- " + (t_open_names.empty() ? "-" : t_open_names.back());
  const std::lock_guard<std::mutex> lock(g_callers_mutex);
  ++g_callers[key];
}

// Prints the phase's most frequent pairs and starts the next phase afresh.
void print_callers(const char* phase) {
  std::vector<std::pair<int64_t, std::string>> rows;
  {
    const std::lock_guard<std::mutex> lock(g_callers_mutex);
    for (const auto& [key, calls] : g_callers) rows.emplace_back(calls, key);
    g_callers.clear();
  }
  if (callers_to_print() == 0) return;
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a > b; });
  if (static_cast<int64_t>(rows.size()) > callers_to_print()) rows.resize(callers_to_print());
  std::printf("  %s, operator <- caller (outside the per-matrix loops):\n", phase);
  for (const auto& [calls, key] : rows)
    std::printf("    %7lld  %s\n", static_cast<long long>(calls), key.c_str());
}

bool is_matrix_product(const char* name) {
  for (const char* product : {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}) {
    if (std::strcmp(name, product) == 0) return true;
  }
  return false;
}

bool is_batched_product(const char* name) {
  return std::strcmp(name, "aten::bmm") == 0 || std::strcmp(name, "aten::baddbmm") == 0;
}

bool is_multi_tensor(const char* name) {
  return std::strncmp(name, "aten::_foreach_", 15) == 0 ||
         std::strncmp(name, "aten::_fused_", 13) == 0;
}

// Marks the calls whose end must close a multi-tensor or a batched product
// (or, with VQA_OP_COUNT_CALLERS, any counted call: its name is open).
struct OpenCall : at::ObserverContext {
  bool multi_tensor = false;
  bool batched = false;
  bool named = false;
};

std::unique_ptr<at::ObserverContext> count_call(const at::RecordFunction& call) {
  if (call.scope() == at::RecordScope::BACKWARD_FUNCTION) ++g_autograd;
  if (call.scope() != at::RecordScope::FUNCTION || t_inside_multi_tensor > 0) return nullptr;
  ++g_operators;
  if (t_inside_batched > 0) ++g_in_batched;
  if (is_matrix_product(call.name())) ++g_products;
  const bool multi_tensor = is_multi_tensor(call.name());
  const bool batched = is_batched_product(call.name());
  const bool named = callers_to_print() > 0 && t_inside_batched == 0;
  if (named) note_caller(call.name());
  if (!multi_tensor && !batched && !named) return nullptr;
  auto open = std::make_unique<OpenCall>();
  open->multi_tensor = multi_tensor;
  open->batched = batched;
  open->named = named;
  if (named) t_open_names.push_back(call.name());
  t_inside_multi_tensor += multi_tensor ? 1 : 0;
  t_inside_batched += batched ? 1 : 0;
  return open;
}

void end_call(const at::RecordFunction&, at::ObserverContext* context) {
  if (context == nullptr) return;
  const auto* open = static_cast<const OpenCall*>(context);
  if (open->multi_tensor) --t_inside_multi_tensor;
  if (open->batched) --t_inside_batched;
  if (open->named) t_open_names.pop_back();
}

// One rank: every collective is the identity. It counts them: one rank
// should send nothing.
class OneRankCommunicator final : public vqa::runtime::Communicator {
 public:
  OneRankCommunicator() : Communicator(vqa::runtime::RankInfo{}) {}
  vqa::runtime::Backend backend() const override { return vqa::runtime::Backend::kMpi; }
  vqa::runtime::WorkHandle allreduce_async(const torch::Tensor&, vqa::runtime::ReduceOp) override {
    return done();
  }
  vqa::runtime::WorkHandle reduce_scatter_async(const torch::Tensor&,
                                                vqa::runtime::ReduceOp) override {
    return done();
  }
  vqa::runtime::WorkHandle allgather_async(const torch::Tensor&) override { return done(); }
  void broadcast(const torch::Tensor&, int) override { ++collectives; }
  void barrier() override { ++collectives; }
  double allreduce_scalar(double value, vqa::runtime::ScalarOp) override {
    ++collectives;
    return value;
  }
  std::vector<std::string> gather_strings(const std::string& value) override {
    ++collectives;
    return {value};
  }
  int64_t collectives = 0;

 private:
  struct Done final : vqa::runtime::Work {
    void wait() override {}
  };
  vqa::runtime::WorkHandle done() {
    ++collectives;
    return std::make_shared<Done>();
  }
};

struct CountedStep {
  StepOperatorCounts counts;
  int64_t forward_products = 0;  // matrix products in the forward
  // Of the forward's and backward's operators, those a CPU bmm or baddbmm
  // dispatches inside itself: one matrix product (select, addmm's
  // resolve_conj) per matrix of the batch, where a GPU launches one kernel.
  int64_t forward_in_batched = 0, backward_in_batched = 0;
  int64_t collectives = 0;  // the communicator's calls in the counted step
};

constexpr double kGradClip = 1.0;  // --grad-clip, so that clipping is counted

// The second of two optimiser steps of `config` on one rank (the first one
// makes what is made once: the AdamW moments, the optimiser's step counts),
// as train_step takes it: --grad-clip on, the non-finite check left on the
// device where the optimiser skips there (ATen's fused AdamW, as on a GPU
// with LibTorch 2.4 or later), else read by the host; under bf16 autocast
// with the weight copies (--weight-copies, the trainer's default there). Batches of 2, with the
// callbacks counting each phase apart. The counts depend on the sizes a
// little: LibTorch 1.13's CPU batched products dispatch operators per matrix
// above a size (batch 4 measured 23,142 operators against batch 2's 16,741).
CountedStep count_one_step(vqa::model::ModelConfig config, bool packed_attention,
                           bool bf16_autocast = false) {
  config.num_answers = 16;
  torch::manual_seed(0);
  vqa::model::M3AE model(config);
  vqa::model::set_packed_projections(*model, packed_attention);
  if (bf16_autocast) model->use_weight_copies(at::kBFloat16);  // --weight-copies, on by default
  vqa::train::OptimizerSettings settings;
  settings.total_steps = 10;
  settings.aten_fused_on_cpu = vqa::train::aten_fused_adamw_available();
  vqa::train::VqaOptimizer optimizer(model, settings);
  OneRankCommunicator comm;
  vqa::train::GradientSynchronizer gradients(vqa::train::trainable_parameters(model), comm, {});

  const int64_t batch = 2, length = 12;
  const auto images = torch::randn({batch, 3, config.image_size, config.image_size});
  const auto token_ids = torch::randint(config.vocab_size, {batch, length}, torch::kInt64);
  auto mask = torch::ones({batch, length}, torch::kInt64);
  mask.index_put_({1, torch::indexing::Slice(8)}, 0);  // one shorter question
  const auto targets =
      torch::zeros({batch, config.num_answers}).index_fill_(1, torch::tensor({3}), 1.0);

  CountedStep step;
  for (int64_t global_step = 0; global_step < 2; ++global_step) {
    const bool counted = global_step == 1;
    const auto handle =
        counted ? at::addGlobalCallback(at::RecordFunctionCallback(count_call, end_call))
                : at::CallbackHandle{};
    g_operators = 0;
    g_products = 0;
    g_in_batched = 0;
    comm.collectives = 0;
    gradients.prepare_backward(/*sync=*/true);
    torch::Tensor loss;
    {
      CpuAutocast autocast(bf16_autocast);
      loss = vqa::train::vqa_loss(model->forward(images, token_ids, mask), targets);
    }
    step.counts.forward = g_operators.exchange(0);
    if (counted) print_callers("forward with the loss");
    step.forward_products = g_products.exchange(0);
    step.forward_in_batched = g_in_batched.exchange(0);
    g_autograd = 0;
    loss.backward();
    step.counts.backward = g_operators.exchange(0);
    if (counted) print_callers("backward");
    step.counts.autograd_nodes = g_autograd.exchange(0);
    step.backward_in_batched = g_in_batched.exchange(0);
    gradients.finish_backward();
    if (optimizer.masks_on_device()) {
      const auto found_inf = gradients.nonfinite_flag();
      gradients.clip_gradient_norm(kGradClip);
      optimizer.step(global_step, found_inf);
    } else if (gradients.gradients_finite()) {
      gradients.clip_gradient_norm(kGradClip);
      optimizer.step(global_step);
    } else {
      throw std::runtime_error("a non-finite gradient in the operator-count step");
    }
    step.counts.after_backward = g_operators.exchange(0);
    if (counted) print_callers("after backward");
    step.collectives = comm.collectives;
    if (counted) at::removeCallback(handle);
  }
  return step;
}

std::string describe(const StepOperatorCounts& c) {
  char line[200];
  std::snprintf(line, sizeof(line),
                "forward with loss %lld, backward %lld (%lld autograd nodes), after backward "
                "%lld, total %lld",
                static_cast<long long>(c.forward), static_cast<long long>(c.backward),
                static_cast<long long>(c.autograd_nodes), static_cast<long long>(c.after_backward),
                static_cast<long long>(c.total()));
  return line;
}

// As op_count_held.h writes them: {forward, backward, autograd nodes, after backward}.
std::string initializer(const StepOperatorCounts& c) {
  return "{" + std::to_string(c.forward) + ", " + std::to_string(c.backward) + ", " +
         std::to_string(c.autograd_nodes) + ", " + std::to_string(c.after_backward) + "}";
}

// The `small` preset's step, separate and packed, counted once for the tests below.
struct SmallCounts {
  CountedStep separate, packed;
};
const SmallCounts& small_counts() {
  static const SmallCounts counts = [] {
    torch::set_num_threads(1);
    SmallCounts c;
    c.separate = count_one_step(vqa::model::model_config_preset("small"), /*packed=*/false);
    c.packed = count_one_step(vqa::model::model_config_preset("small"), /*packed=*/true);
    std::printf("LibTorch %s, operators per step of the small preset:\n", TORCH_VERSION);
    std::printf("  separate q, k, v: %s\n", describe(c.separate.counts).c_str());
    std::printf("  packed q, k, v:   %s\n", describe(c.packed.counts).c_str());
    std::printf("  as op_count_held.h holds them: %s, %s\n", initializer(c.separate.counts).c_str(),
                initializer(c.packed.counts).c_str());
    return c;
  }();
  return counts;
}

TEST(OperatorCount, OneSmallCpuStepDispatchesExactlyTheHeldCounts) {
  const auto& counts = small_counts();
  // The callbacks see every phase (a broken hook counts nothing).
  for (const auto* step : {&counts.separate, &counts.packed}) {
    EXPECT_GT(step->counts.forward, 100);
    EXPECT_GT(step->counts.backward, 100);
    EXPECT_GT(step->counts.autograd_nodes, 100);
    EXPECT_GT(step->counts.after_backward, 0);
    EXPECT_EQ(step->collectives, 0) << "one rank sends nothing";
  }
  if (!kOperatorCountsHeld) {
    GTEST_SKIP() << "no operator counts held for LibTorch " << TORCH_VERSION
                 << " (tests/train/op_count_held.h holds 1.13 and 2.6): printed only";
  }
  const std::string update =
      std::string(
          "\nIf the change is meant, hold the new counts: in tests/train/op_count_held.h, "
          "the LibTorch ") +
      kHeldOperatorCounts.libtorch + " row's small counts become " +
      initializer(counts.separate.counts) + ", " + initializer(counts.packed.counts) +
      " (and docs/benchmarks.md, \"Operators per step\", says the same numbers).";
  EXPECT_TRUE(counts.separate.counts == kHeldOperatorCounts.separate)
      << "separate q, k, v: counted " << describe(counts.separate.counts) << "; held "
      << describe(kHeldOperatorCounts.separate) << update;
  EXPECT_TRUE(counts.packed.counts == kHeldOperatorCounts.packed)
      << "packed q, k, v: counted " << describe(counts.packed.counts) << "; held "
      << describe(kHeldOperatorCounts.packed) << update;
}

// Packing computes q, k and v with one matrix product where separate
// projections take three (k and v: one for two in cross-attention), on every
// LibTorch version; whether the whole forward dispatches fewer operators
// depends on the version (the concatenations and the chunk cost operators
// too): the held counts say it.
TEST(OperatorCount, PackedAttentionSavesTheProjectionProducts) {
  const auto config = vqa::model::model_config_preset("small");
  // Self-attention: every vision and text layer and each co-attention
  // layer's first half, on both sides; cross-attention: the second half.
  const int64_t self_attention =
      config.vision_layers + config.text_layers + 2 * config.fusion_layers;
  const int64_t cross_attention = 2 * config.fusion_layers;
  const auto& counts = small_counts();
  std::printf("matrix products in the forward: separate %lld, packed %lld\n",
              static_cast<long long>(counts.separate.forward_products),
              static_cast<long long>(counts.packed.forward_products));
  EXPECT_EQ(counts.packed.forward_products,
            counts.separate.forward_products - 2 * self_attention - cross_attention);
}

// The `base` preset (M3AE's sizes) with packed q, k and v: float32 with
// LibTorch 1.13, bf16 CPU autocast with 2.4 and later (the precision a GPU
// runs it in), at 64 px instead of 384 to keep the test short: the count
// does not follow the number of patches but for LibTorch 1.13's batched
// products, which dispatch per matrix above a size (measured at 384 px with
// LibTorch 1.13: the same forward, 2 more operators in backward), and a
// word table of 1,000 rows instead of RoBERTa's 50,265 (a lookup is one
// operator whatever the rows).
constexpr bool kBaseInBf16 = TORCH_VERSION_MAJOR > 2 ||
                             (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4);
constexpr int64_t kBaseImageSize = 64;
constexpr int64_t kBaseVocabulary = 1000;

TEST(OperatorCount, OneBaseCpuStepDispatchesExactlyTheHeldCounts) {
  torch::set_num_threads(1);
  auto config = vqa::model::model_config_preset("base");
  config.image_size = kBaseImageSize;
  config.vocab_size = kBaseVocabulary;
  const auto step = count_one_step(config, /*packed=*/true, kBaseInBf16);
  std::printf("LibTorch %s, operators per step of the base preset (%s, %lld px, packed q, k, v):\n",
              TORCH_VERSION, kBaseInBf16 ? "bf16 autocast" : "float32",
              static_cast<long long>(config.image_size));
  std::printf("  %s\n  as op_count_held.h holds them: %s\n", describe(step.counts).c_str(),
              initializer(step.counts).c_str());
  std::printf("  of them inside a batched product's per-matrix loop: forward %lld, backward %lld\n",
              static_cast<long long>(step.forward_in_batched),
              static_cast<long long>(step.backward_in_batched));
  EXPECT_GT(step.counts.forward, 1000);
  EXPECT_EQ(step.collectives, 0) << "one rank sends nothing";
  if (!kOperatorCountsHeld) {
    GTEST_SKIP() << "no operator counts held for LibTorch " << TORCH_VERSION << ": printed only";
  }
  EXPECT_TRUE(step.counts == kHeldOperatorCounts.base)
      << "base: counted " << describe(step.counts) << "; held "
      << describe(kHeldOperatorCounts.base)
      << "\nIf the change is meant, hold the new counts: in tests/train/op_count_held.h, the "
         "LibTorch "
      << kHeldOperatorCounts.libtorch << " row's base counts become " << initializer(step.counts)
      << ".";
}

// The same base step with ModelConfig::bf16_hidden_states (the hidden states
// bf16 between blocks), under bf16 CPU autocast only (LibTorch 2.4 on), held
// here for LibTorch 2.6 beside the standard policy's count in op_count_held.h.
// It saves the activations' casts to bf16 before each linear but casts each
// LayerNorm's weight and bias (and back in backward): with LibTorch 2.6, 32
// operators fewer forward, 40 more backward, so the switch stays off.
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR == 6
constexpr bool kBf16HiddenStatesHeld = true;
constexpr StepOperatorCounts kHeldBaseBf16HiddenStates{25537, 43097, 3186, 65};
#else
constexpr bool kBf16HiddenStatesHeld = false;
constexpr StepOperatorCounts kHeldBaseBf16HiddenStates{};
#endif

// Defined only where bf16 CPU autocast runs (a skip would show the whole
// test as skipped with LibTorch 1.13).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
TEST(OperatorCount, BaseStepWithBf16HiddenStatesDispatchesTheHeldCounts) {
  torch::set_num_threads(1);
  auto config = vqa::model::model_config_preset("base");
  config.image_size = kBaseImageSize;
  config.vocab_size = kBaseVocabulary;
  config.bf16_hidden_states = true;
  const auto step = count_one_step(config, /*packed=*/true, /*bf16_autocast=*/true);
  std::printf(
      "LibTorch %s, operators per step of the base preset (bf16 autocast, bf16 hidden "
      "states, %lld px, packed q, k, v):\n  %s\n  as held: %s\n",
      TORCH_VERSION, static_cast<long long>(config.image_size), describe(step.counts).c_str(),
      initializer(step.counts).c_str());
  const auto& standard = kHeldOperatorCounts.base;
  std::printf(
      "  against the standard policy's held count: forward %+lld, backward %+lld, "
      "autograd nodes %+lld, after backward %+lld\n",
      static_cast<long long>(step.counts.forward - standard.forward),
      static_cast<long long>(step.counts.backward - standard.backward),
      static_cast<long long>(step.counts.autograd_nodes - standard.autograd_nodes),
      static_cast<long long>(step.counts.after_backward - standard.after_backward));
  if (!kBf16HiddenStatesHeld) {
    GTEST_SKIP() << "no bf16-hidden-states count held for LibTorch " << TORCH_VERSION
                 << ": printed only";
  }
  EXPECT_TRUE(step.counts == kHeldBaseBf16HiddenStates)
      << "base, bf16 hidden states: counted " << describe(step.counts) << "; held "
      << describe(kHeldBaseBf16HiddenStates)
      << "\nIf the change is meant, hold the new counts: kHeldBaseBf16HiddenStates becomes "
      << initializer(step.counts) << ".";
}
#endif

// After backward (the averaging, the finite check, clipping, the optimiser)
// nothing runs per parameter tensor: `small` with twice the layers of each
// kind, twice the tensors in more buckets, dispatches there exactly what
// `small` does.
TEST(OperatorCount, AfterBackwardNothingScalesWithTheParameterTensors) {
  const auto& small = small_counts().packed;
  auto config = vqa::model::model_config_preset("small");
  config.vision_layers *= 2;
  config.text_layers *= 2;
  config.fusion_layers *= 2;
  const auto doubled = count_one_step(config, /*packed=*/true);
  std::printf("small with twice the layers: %s\n", describe(doubled.counts).c_str());
  EXPECT_GT(doubled.counts.backward, small.counts.backward);
  EXPECT_EQ(doubled.counts.after_backward, small.counts.after_backward)
      << "after backward: small " << small.counts.after_backward << ", twice the layers "
      << doubled.counts.after_backward << " operators";
}

}  // namespace
