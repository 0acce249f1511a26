// `vqa_prep synth`: a synthetic, learnable VQA set of coloured shapes, the
// quickstart's data. Each image has 2-4 solid shapes (circle, square,
// triangle; red, green, blue) in distinct cells of a 2x2 grid on black; the
// questions come from four templates:
//   "is there a red circle?"            closed, yes/no (half of each)
//   "what colour is the square?"        open, asked of a shape that occurs once
//   "what shape is the blue object?"    open, asked of a colour that occurs once
//   "how many shapes are there?"        open, 2-4
// Never fewer than two shapes: with one, the colour and shape questions can be
// answered from the image alone, and a model from scratch settles there for
// many epochs before it learns to read the question's colour and shape words.
// 11 answer labels; the answer is always determined by the image, so a model
// can reach ~100%, while always answering the most frequent label gets ~16%.
//
// With a vocabulary size (SynthOptions::vocab_size, e.g. RoBERTa's 50,265)
// the vocabulary is filled up with filler words "w0", "w1", ... and every
// question ends with 4-12 of them drawn from a Zipf law (weight 1/(k+1)):
// as in real questions, a batch touches a few hundred rows of a large word
// embedding table, most of it the same frequent ones. The fillers carry no
// answer; the template words still do.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "writer.h"  // FileHeader, SplitData

namespace vqa::prep {

struct SynthOptions {
  int64_t train_questions = 4000;
  int64_t test_questions = 1000;
  int64_t questions_per_image = 2;
  int64_t image_size = 32;
  // > 0: the train images are drawn at this side and stored also as source
  // images (format version 3, for the loader's random resized crop); the
  // stored images are their Pillow-bicubic resize to image_size. 0: none.
  int64_t source_size = 0;
  int64_t max_question_length = 12;
  // > 0: exactly this many vocabulary entries, the filler words above (at
  // least the templates' own words and one filler); 0: the templates' words only.
  int64_t vocab_size = 0;
  uint64_t seed = 1;
};

struct SynthDataset {
  FileHeader header;
  std::vector<SplitData> splits;  // "train", "test"
};

// Deterministic in the options: the same seed gives the same bytes.
SynthDataset synth_generate(const SynthOptions& options);

}  // namespace vqa::prep
