// Checkpoints of the layout before packed attention: an archive written the
// old way (each attention's query, key and value as Linear children) from a
// model's weights must load into a fresh model of the packed layout with
// every tensor equal (tolerance 0: the same bits), and count its attentions;
// an archive missing a tensor must throw naming it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <string>

#include "model/m3ae.h"                // M3AE
#include "tiny_m3ae.h"                 // tiny_m3ae_model
#include "train/checkpoint_weights.h"  // load_module_weights

namespace {

// `module` written as the old layout did: an attention's in_weight rows as
// the weights of children query, key and value; query_bias and value_bias
// as their biases (the key had none). Returns the number of attentions.
int write_legacy(torch::nn::Module& module, torch::serialize::OutputArchive& archive) {
  int attentions = 0;
  const auto parameters = module.named_parameters(/*recurse=*/false);
  if (parameters.contains("in_weight")) {
    const auto rows = parameters["in_weight"].chunk(3, 0);
    const char* names[] = {"query", "key", "value"};
    for (int i = 0; i < 3; ++i) {
      torch::serialize::OutputArchive child;
      child.write("weight", rows[i]);
      if (i == 0) child.write("bias", parameters["query_bias"]);
      if (i == 2) child.write("bias", parameters["value_bias"]);
      archive.write(names[i], child);
    }
    ++attentions;
  }
  for (const auto& item : parameters) {
    const std::string& key = item.key();
    if (key != "in_weight" && key != "query_bias" && key != "value_bias") {
      archive.write(key, item.value());
    }
  }
  for (const auto& item : module.named_buffers(/*recurse=*/false)) {
    archive.write(item.key(), item.value(), /*is_buffer=*/true);
  }
  for (const auto& child : module.named_children()) {
    torch::serialize::OutputArchive child_archive;
    attentions += write_legacy(*child.value(), child_archive);
    archive.write(child.key(), child_archive);
  }
  return attentions;
}

TEST(CheckpointWeights, LegacyAttentionLayoutLoadsBitForBit) {
  vqa::model::M3AE saved = tiny_m3ae_model(1);
  torch::serialize::OutputArchive archive;
  const int written = write_legacy(*saved, archive);
  ASSERT_GT(written, 0);
  std::ostringstream bytes;
  archive.save_to(bytes);

  vqa::model::M3AE loaded = tiny_m3ae_model(2);  // other weights before the load
  torch::serialize::InputArchive input;
  std::istringstream in(bytes.str());
  input.load_from(in);
  int64_t legacy = 0;
  vqa::train::load_module_weights(input, *loaded, "", legacy);
  EXPECT_EQ(legacy, written);
  const auto expected = saved->named_parameters();
  int64_t compared = 0;
  for (const auto& item : loaded->named_parameters()) {
    ASSERT_TRUE(torch::equal(item.value(), expected[item.key()])) << item.key();
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int64_t>(expected.size()));
}

TEST(CheckpointWeights, MissingTensorIsNamed) {
  vqa::model::M3AE saved = tiny_m3ae_model(1);
  torch::serialize::OutputArchive archive;
  saved->save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  // A model with one more text layer than the file has.
  auto config = saved->config();
  config.text_layers = 2;
  vqa::model::M3AE bigger(config);
  torch::serialize::InputArchive input;
  std::istringstream in(bytes.str());
  input.load_from(in);
  int64_t legacy = 0;
  try {
    vqa::train::load_module_weights(input, *bigger, "", legacy);
    FAIL() << "a missing layer loaded";
  } catch (const std::exception& e) {
    // LibTorch's message names the missing module by its path.
    EXPECT_NE(std::string(e.what()).find("'text.layers.1'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(legacy, 0);
}

}  // namespace
