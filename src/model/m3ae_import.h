// Loading the pretrained M3AE (m3ae.ckpt, converted to safetensors by
// data_prep/m3ae_to_safetensors.py with M3AE's own tensor names) into the
// model: the names mapped to the model's, CLIP's packed attention projection
// split, the vision position table resized to the run's image size (bicubic,
// as M3AE's adapt_position_encoding), vqa_head loaded when the file has one
// for the same answer count. Strict: every tensor of the file is used or on
// an explicit drop list, every parameter of the model is filled or listed as
// newly initialised, and shapes are checked.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/m3ae.h"         // M3AE
#include "model/safetensors.h"  // SafetensorsFile

namespace vqa::model {

// Where one parameter of the model lives in an M3AE state_dict.
struct M3aeSource {
  std::string name;         // M3AE's tensor, e.g. "vision_encoder.visual.ln_pre.weight"
  int64_t row_begin = -1;   // rows [row_begin, row_end) of its first dimension (a split
  int64_t row_end = -1;     // of CLIP's in_proj_bias); -1: the whole tensor
  int64_t into_begin = -1;  // the rows of our parameter it fills (BERT's separate q, k
  int64_t into_end = -1;    // and v weights into one in_weight); -1: the whole parameter
};

// M3AE's sources of every parameter of `model`, in named_parameters() order
// (our name, a source); a parameter filled from several tensors appears once
// per tensor, in row order. Throws std::invalid_argument for a model over
// pre-extracted features: M3AE's vision encoder reads pixels.
std::vector<std::pair<std::string, M3aeSource>> m3ae_parameter_sources(M3AE& model);

// A file the model cannot take: what() names the tensor and both shapes, or
// the tensor no rule covers.
struct M3aeImportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct M3aeImportSummary {
  int64_t loaded_tensors = 0;                  // file tensors (or CLIP's q, v bias rows) taken
  int64_t loaded_parameters = 0;               // their scalars
  std::vector<std::string> resized;            // "vision.position_embeddings: 325 -> 577 rows"
  std::map<std::string, int64_t> dropped;      // why (by prefix or rule) -> file tensors
  std::vector<std::string> newly_initialized;  // model parameters the file does not fill
  // One line for the log: "loaded 398 tensors (86.2M parameters); resized ...;
  // dropped 52 file tensors (mlm_head: 10, ...); newly initialised 6 (head.dense.weight, ...)".
  std::string describe() const;
};

// Fills the model's parameters from `file` (under NoGradGuard, in place, as
// float32). Throws M3aeImportError before changing any parameter when the
// file does not fit.
M3aeImportSummary m3ae_import(M3AE& model, const SafetensorsFile& file);

}  // namespace vqa::model
