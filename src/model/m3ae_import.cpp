#include "model/m3ae_import.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace vqa::model {

namespace {

struct Rename {
  const char* from;  // our name's prefix (after the layer index for layered rules)
  const char* to;    // M3AE's
};

// Whole tensors outside the layers.
constexpr Rename kTopLevel[] = {
    {"vision.patch_embedding.", "vision_encoder.visual.conv1."},
    {"vision.class_token", "vision_encoder.visual.class_embedding"},
    {"vision.position_embeddings", "vision_encoder.visual.positional_embedding"},
    {"vision.input_norm.", "vision_encoder.visual.ln_pre."},
    {"vision.output_norm.", "vision_encoder.visual.ln_post."},
    {"text.token_embeddings.", "language_encoder.embeddings.word_embeddings."},
    {"text.position_embeddings.", "language_encoder.embeddings.position_embeddings."},
    {"text.token_type_embeddings.", "language_encoder.embeddings.token_type_embeddings."},
    {"text.embedding_norm.", "language_encoder.embeddings.LayerNorm."},
    {"fusion.text_projection.", "multi_modal_language_proj."},
    {"fusion.image_projection.", "multi_modal_vision_proj."},
    {"fusion.modality_type_embeddings.", "modality_type_embeddings."},
    {"head.text_pooler.", "multi_modal_language_pooler.dense."},
    {"head.image_pooler.", "multi_modal_vision_pooler.dense."},
    {"head.dense.", "vqa_head.0."},
    {"head.norm.", "vqa_head.1."},
    {"head.output.", "vqa_head.3."},
};

// Inside a layer: CLIP's residual block (the packed q/k/v are handled apart),
// a RoBERTa layer, METER's BertCrossLayer.
// The attention's parameters are renamed apart (attention_sources).
constexpr Rename kClipBlock[] = {
    {"attention_norm.", "ln_1."},
    {"feed_forward_norm.", "ln_2."},
    {"attention.output.", "attn.out_proj."},
    {"feed_forward.up.", "mlp.c_fc."},
    {"feed_forward.down.", "mlp.c_proj."},
};
constexpr Rename kBertLayer[] = {
    {"attention.output.", "attention.output.dense."},
    {"attention_norm.", "attention.output.LayerNorm."},
    {"feed_forward.up.", "intermediate.dense."},
    {"feed_forward.down.", "output.dense."},
    {"feed_forward_norm.", "output.LayerNorm."},
};
constexpr Rename kCrossLayer[] = {
    {"self_attention.output.", "attention.output.dense."},
    {"self_attention_norm.", "attention.output.LayerNorm."},
    {"cross_attention.output.", "crossattention.output.dense."},
    {"cross_attention_norm.", "crossattention.output.LayerNorm."},
    {"feed_forward.up.", "intermediate.dense."},
    {"feed_forward.down.", "output.dense."},
    {"feed_forward_norm.", "output.LayerNorm."},
};

struct LayerRule {
  const char* from;  // "vision.blocks." + index + "."
  const char* to;
  const Rename* renames;
  size_t count;
};
const LayerRule kLayers[] = {
    {"vision.blocks.", "vision_encoder.visual.transformer.resblocks.", kClipBlock,
     std::size(kClipBlock)},
    {"text.layers.", "language_encoder.encoder.layer.", kBertLayer, std::size(kBertLayer)},
    {"fusion.text_layers.", "multi_modal_language_layers.", kCrossLayer, std::size(kCrossLayer)},
    {"fusion.image_layers.", "multi_modal_vision_layers.", kCrossLayer, std::size(kCrossLayer)},
};

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

bool rename_prefix(const std::string& name, const Rename* renames, size_t count, std::string& out) {
  for (size_t i = 0; i < count; ++i) {
    if (starts_with(name, renames[i].from)) {
      out = renames[i].to + name.substr(std::string(renames[i].from).size());
      return true;
    }
  }
  return false;
}

// The q, k and v parameters of the attention module `attention` ("attention.",
// "self_attention." or "cross_attention.") in BERT's layer at `prefix`.
const std::pair<const char*, const char*> kBertAttentions[] = {
    {"attention.", "attention.self."},
    {"self_attention.", "attention.self."},
    {"cross_attention.", "crossattention.self."},
};

// M3AE's sources of our parameter `name`; `hidden` sizes the q/k/v rows.
std::vector<M3aeSource> sources_of(const std::string& name, int64_t hidden) {
  M3aeSource source;
  if (rename_prefix(name, kTopLevel, std::size(kTopLevel), source.name)) return {source};
  for (const auto& rule : kLayers) {
    if (!starts_with(name, rule.from)) continue;
    const std::string rest = name.substr(std::string(rule.from).size());
    const size_t dot = rest.find('.');
    const std::string index = rest.substr(0, dot), inner = rest.substr(dot + 1);
    const std::string prefix = rule.to + index + ".";
    if (rule.renames == kClipBlock) {
      // nn.MultiheadAttention packs q, k and v as rows [0,h), [h,2h), [2h,3h),
      // as in_weight does.
      if (inner == "attention.in_weight") return {{prefix + "attn.in_proj_weight"}};
      if (inner == "attention.query_bias") {
        return {{prefix + "attn.in_proj_bias", 0, hidden}};
      }
      if (inner == "attention.value_bias") {
        return {{prefix + "attn.in_proj_bias", 2 * hidden, 3 * hidden}};
      }
    } else {
      for (const auto& [ours, theirs] : kBertAttentions) {
        if (!starts_with(inner, ours)) continue;
        const std::string part = inner.substr(std::string(ours).size());
        const std::string from = prefix + theirs;
        if (part == "in_weight") {
          return {{from + "query.weight", -1, -1, 0, hidden},
                  {from + "key.weight", -1, -1, hidden, 2 * hidden},
                  {from + "value.weight", -1, -1, 2 * hidden, 3 * hidden}};
        }
        if (part == "query_bias") return {{from + "query.bias"}};
        if (part == "value_bias") return {{from + "value.bias"}};
      }
    }
    std::string renamed;
    if (rename_prefix(inner, rule.renames, rule.count, renamed)) {
      source.name = prefix + renamed;
      return {source};
    }
  }
  throw std::logic_error("m3ae_parameter_sources: no M3AE name for parameter '" + name + "'");
}

// File tensors the model has no place for, on purpose.
struct DropRule {
  const char* prefix;
  const char* reason;
};
const DropRule kDropped[] = {
    {"mlm_head.", "mlm_head (pre-training)"},
    {"mim_head.", "mim_head (pre-training)"},
    {"itm_head.", "itm_head (pre-training)"},
    {"cls_head.", "cls_head (another downstream task)"},
    {"irtr_head.", "irtr_head (another downstream task)"},
    {"vision_encoder.token_embedding.", "CLIP text tower leftovers"},
    {"vision_encoder.positional_embedding", "CLIP text tower leftovers"},
    {"vision_encoder.ln_final.", "CLIP text tower leftovers"},
    {"language_encoder.pooler.", "RoBERTa's pooler (unused by M3AE)"},
    {"language_encoder.embeddings.position_ids", "buffers recomputed here"},
    {"language_encoder.embeddings.token_type_ids", "buffers recomputed here"},
};
constexpr const char* kKeyBiasReason =
    "key biases (softmax ignores them: q.b is one constant per query)";

bool is_key_bias(const std::string& name) {
  for (const char* suffix : {".attention.self.key.bias", ".crossattention.self.key.bias"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      return true;
    }
  }
  return false;
}

bool is_clip_in_proj_bias(const std::string& name) {
  const std::string s = ".attn.in_proj_bias";
  return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
}

std::string shape_of(const torch::Tensor& tensor) {
  return shape_text(std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end()));
}

// M3AE's adapt_position_encoding: the class row kept, the grid resized with
// bicubic interpolation (align_corners=False) to the model's grid.
torch::Tensor resize_position_table(const torch::Tensor& table, int64_t rows) {
  const int64_t dim = table.size(1);
  const auto grid_before = static_cast<int64_t>(std::llround(std::sqrt(table.size(0) - 1.0)));
  const auto grid_after = static_cast<int64_t>(std::llround(std::sqrt(rows - 1.0)));
  const torch::Tensor grid =
      table.slice(0, 1).reshape({grid_before, grid_before, dim}).permute({2, 0, 1}).unsqueeze(0);
  const torch::Tensor resized = torch::nn::functional::interpolate(
      grid, torch::nn::functional::InterpolateFuncOptions()
                .size(std::vector<int64_t>{grid_after, grid_after})
                .mode(torch::kBicubic)
                .align_corners(false));
  return torch::cat(
      {table.slice(0, 0, 1), resized.squeeze(0).permute({1, 2, 0}).reshape({-1, dim})});
}

bool is_square_grid(int64_t rows) {
  if (rows < 2) return false;
  const auto grid = static_cast<int64_t>(std::llround(std::sqrt(rows - 1.0)));
  return grid * grid == rows - 1;
}

// Row ranges of one file tensor that something has taken.
struct Coverage {
  std::vector<std::pair<int64_t, int64_t>> rows;
  bool covers(int64_t total) const {
    auto sorted = rows;
    std::sort(sorted.begin(), sorted.end());
    int64_t reached = 0;
    for (const auto& [begin, end] : sorted) {
      if (begin > reached) return false;
      reached = std::max(reached, end);
    }
    return reached >= total;
  }
};

}  // namespace

std::vector<std::pair<std::string, M3aeSource>> m3ae_parameter_sources(M3AE& model) {
  if (model->config().use_features) {
    throw std::invalid_argument(
        "M3AE's names cover models over pixels; this model reads pre-extracted features");
  }
  std::vector<std::pair<std::string, M3aeSource>> sources;
  for (const auto& item : model->named_parameters()) {
    for (auto& source : sources_of(item.key(), model->config().hidden)) {
      sources.emplace_back(item.key(), std::move(source));
    }
  }
  return sources;
}

std::string M3aeImportSummary::describe() const {
  char loaded[96];
  std::snprintf(loaded, sizeof(loaded), "loaded %lld tensors (%.2fM parameters)",
                static_cast<long long>(loaded_tensors), loaded_parameters / 1e6);
  std::string text = loaded;
  text += "; resized " + std::to_string(resized.size());
  for (size_t i = 0; i < resized.size(); ++i) text += (i ? ", " : " (") + resized[i];
  if (!resized.empty()) text += ")";
  int64_t dropped_count = 0;
  std::string reasons;
  for (const auto& [reason, count] : dropped) {
    dropped_count += count;
    reasons += (reasons.empty() ? "" : ", ") + reason + ": " + std::to_string(count);
  }
  text += "; dropped " + std::to_string(dropped_count) + " file tensors";
  if (!reasons.empty()) text += " (" + reasons + ")";
  text += "; newly initialised " + std::to_string(newly_initialized.size());
  for (size_t i = 0; i < newly_initialized.size(); ++i) {
    text += (i ? ", " : " (") + newly_initialized[i];
  }
  if (!newly_initialized.empty()) text += ")";
  return text;
}

namespace {

// Pass 1's result: which rows of each file tensor the model takes, and each
// parameter's new value (copied in only when both passes found no problem).
struct ImportPlan {
  std::map<std::string, Coverage> coverage;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> assignments;  // (parameter, value)
};

M3aeImportError import_error(const SafetensorsFile& file, const std::string& what) {
  return M3aeImportError(file.path() + ": " + what);
}

// Pass 1, the model's side: every parameter finds its file tensor (or its
// rows of CLIP's packed in_proj), resized where the position grid differs,
// with the model's shape; the head only when `load_head`.
ImportPlan plan_parameters(M3AE& model, const SafetensorsFile& file, bool load_head,
                           M3aeImportSummary& summary) {
  const int64_t hidden = model->config().hidden;
  ImportPlan plan;
  const auto parameters = model->named_parameters();
  for (const auto& [name, source] : m3ae_parameter_sources(model)) {
    const torch::Tensor parameter =
        source.into_begin >= 0
            ? parameters[name].slice(/*dim=*/0, source.into_begin, source.into_end)
            : parameters[name];
    if (starts_with(source.name, "vqa_head.") && !load_head) {
      summary.newly_initialized.push_back(name);
      continue;
    }
    if (!file.contains(source.name)) {
      throw import_error(file, "missing tensor " + source.name + " (for the model's " + name +
                                   ", shape " + shape_of(parameter) + ")");
    }
    torch::Tensor value = file.tensor(source.name).to(torch::kFloat32);
    const std::string file_shape = shape_of(value);
    if (source.row_begin >= 0) {
      if (value.dim() < 1 || value.size(0) != 3 * hidden) {
        throw import_error(file, "tensor " + source.name + " has shape " + file_shape +
                                     ", the model's " + name + " needs its first dimension 3 x " +
                                     std::to_string(hidden));
      }
      value = value.slice(0, source.row_begin, source.row_end);
    }
    if (name == "vision.position_embeddings" && value.dim() == 2 &&
        value.size(1) == parameter.size(1) && value.size(0) != parameter.size(0) &&
        is_square_grid(value.size(0)) && is_square_grid(parameter.size(0))) {
      summary.resized.push_back(name + ": " + std::to_string(value.size(0)) + " -> " +
                                std::to_string(parameter.size(0)) + " rows (bicubic)");
      value = resize_position_table(value, parameter.size(0));
    }
    if (!value.sizes().equals(parameter.sizes())) {
      throw import_error(file, "tensor " + source.name + " has shape " + file_shape +
                                   ", the model's " + name + " has shape " + shape_of(parameter));
    }
    const int64_t rows =
        file.entry(source.name).shape.empty() ? 1 : file.entry(source.name).shape[0];
    plan.coverage[source.name].rows.emplace_back(source.row_begin >= 0 ? source.row_begin : 0,
                                                 source.row_end >= 0 ? source.row_end : rows);
    plan.assignments.emplace_back(parameter, value.contiguous());
    ++summary.loaded_tensors;
    summary.loaded_parameters += parameter.numel();
  }
  return plan;
}

// Pass 2, the file's side: every file tensor is used whole, or dropped by a
// rule (counted by reason), or refused naming it.
void account_for_file_tensors(const M3AE& model, const SafetensorsFile& file,
                              const std::string& head_dropped, ImportPlan& plan,
                              M3aeImportSummary& summary) {
  const int64_t hidden = model->config().hidden;
  for (const auto& name : file.names()) {
    const auto& shape = file.entry(name).shape;
    const int64_t rows = shape.empty() ? 1 : shape[0];
    Coverage& used = plan.coverage[name];
    if (is_clip_in_proj_bias(name) && rows == 3 * hidden && !used.rows.empty()) {
      used.rows.emplace_back(hidden, 2 * hidden);  // the key's third
      if (used.covers(rows)) {
        ++summary.dropped[kKeyBiasReason];
        continue;
      }
    }
    if (used.covers(rows)) continue;
    if (!used.rows.empty()) {
      throw import_error(
          file, "tensor " + name + " " + shape_text(shape) + " is only partly used by the model");
    }
    if (is_key_bias(name)) {
      ++summary.dropped[kKeyBiasReason];
      continue;
    }
    if (starts_with(name, "vqa_head.") && !head_dropped.empty()) {
      ++summary.dropped[head_dropped];
      continue;
    }
    const DropRule* rule = nullptr;
    for (const auto& drop : kDropped) {
      if (starts_with(name, drop.prefix)) rule = &drop;
    }
    if (!rule) {
      throw import_error(file, "unknown tensor " + name + " " + shape_text(shape) +
                                   ": no parameter of this model takes it and it is on no drop "
                                   "list (is it an M3AE checkpoint of this structure? the model: " +
                                   model_config_describe(model->config()) + ")");
    }
    ++summary.dropped[rule->reason];
  }
}

}  // namespace

M3aeImportSummary m3ae_import(M3AE& model, const SafetensorsFile& file) {
  // vqa_head comes along when it answers the same K; otherwise the head is fresh.
  bool head_in_file = false;
  std::string head_dropped;
  for (const auto& name : file.names()) head_in_file |= starts_with(name, "vqa_head.");
  if (file.contains("vqa_head.3.weight")) {
    const auto& shape = file.entry("vqa_head.3.weight").shape;
    const int64_t answers = model->config().num_answers;
    if (!shape.empty() && shape[0] != answers) {
      head_dropped = "vqa_head for K=" + std::to_string(shape[0]) +
                     " answers (the dataset has K=" + std::to_string(answers) + ")";
    }
  }
  M3aeImportSummary summary;
  ImportPlan plan = plan_parameters(model, file, head_in_file && head_dropped.empty(), summary);
  account_for_file_tensors(model, file, head_dropped, plan, summary);
  torch::NoGradGuard no_grad;
  for (auto& [parameter, value] : plan.assignments) parameter.copy_(value);
  return summary;
}

}  // namespace vqa::model
