#include "synth.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include "data/dataset_format.h"  // kAnswerTypeClosed, kAnswerTypeOpen
#include "data/image_resample.h"  // SourceImage, image_resize_bicubic
#include "tokenizer.h"            // WordTokenizer
#include "util/splitmix64.h"      // SplitMix64

namespace vqa::prep {

namespace {

constexpr std::array<const char*, 3> kColours = {"red", "green", "blue"};
constexpr std::array<const char*, 3> kShapes = {"circle", "square", "triangle"};
constexpr std::array<const char*, 4> kQuestionTypes = {"exists", "colour", "shape", "count"};
// Shapes per image: at least two, so that the question's colour or shape word
// is needed to pick the object an open question is about (see synth.h).
constexpr int kMinShapes = 2, kMaxShapes = 4;
// Label ids: yes, no, the colours, the shapes, the counts.
const std::vector<std::string> kAnswerLabels = {
    "yes", "no", "red", "green", "blue", "circle", "square", "triangle", "2", "3", "4"};

// Synth's draws are small ints; SplitMix64 makes a seed give the same data everywhere.
class Random {
 public:
  explicit Random(uint64_t seed) : generator_(seed) {}
  int below(int bound) { return static_cast<int>(generator_.below(static_cast<uint64_t>(bound))); }

 private:
  util::SplitMix64 generator_;
};

// The filler words of SynthOptions::vocab_size: 4-12 per question, word k
// of F drawn with weight 1/(k+1) (Zipf), by inverting the cumulative weights.
constexpr int kMinFillers = 4, kMaxFillers = 12;

class FillerWords {
 public:
  explicit FillerWords(int64_t count) {
    double total = 0.0;
    cumulative_.reserve(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) cumulative_.push_back(total += 1.0 / (k + 1.0));
  }
  static std::string word(int64_t k) { return "w" + std::to_string(k); }
  bool empty() const { return cumulative_.empty(); }
  // " w12 w3 ...", empty without fillers.
  std::string draw(Random& random) const {
    if (cumulative_.empty()) return "";
    std::string text;
    const int count = kMinFillers + random.below(kMaxFillers - kMinFillers + 1);
    constexpr int kSteps = 1 << 30;
    for (int i = 0; i < count; ++i) {
      const double u = (random.below(kSteps) + 0.5) / kSteps * cumulative_.back();
      const auto k =
          std::lower_bound(cumulative_.begin(), cumulative_.end(), u) - cumulative_.begin();
      text += " " + word(k);
    }
    return text;
  }

 private:
  std::vector<double> cumulative_;
};

struct Shape {
  int shape, colour, cell;
};

int32_t label_of(const std::string& answer) {
  return static_cast<int32_t>(std::find(kAnswerLabels.begin(), kAnswerLabels.end(), answer) -
                              kAnswerLabels.begin());
}

// Draws the shapes into a [3, S, S] RGB image. Shapes fill ~3/4 of their
// cell with a one-pixel jitter: big and clean enough for an 8x8-patch ViT.
void draw(const std::vector<Shape>& shapes, int64_t size, Random& random, uint8_t* pixels) {
  std::fill(pixels, pixels + 3 * size * size, uint8_t{0});
  const double cell = size / 2.0, half = 0.375 * cell;
  for (const Shape& s : shapes) {
    const double cx = (s.cell % 2 + 0.5) * cell + random.below(3) - 1;
    const double cy = (s.cell / 2 + 0.5) * cell + random.below(3) - 1;
    for (int64_t y = 0; y < size; ++y) {
      for (int64_t x = 0; x < size; ++x) {
        const double dx = x + 0.5 - cx, dy = y + 0.5 - cy;
        bool inside = false;
        if (s.shape == 0) inside = dx * dx + dy * dy <= half * half;
        if (s.shape == 1) inside = std::abs(dx) <= half && std::abs(dy) <= half;
        // Apex up: the half-width grows from 0 at the top to `half` at the base.
        if (s.shape == 2) inside = dy >= -half && dy <= half && std::abs(dx) <= (dy + half) / 2;
        if (inside) pixels[s.colour * size * size + y * size + x] = 255;
      }
    }
  }
}

struct Question {
  int type;
  std::string text, answer;
};

// One question about `shapes` of template `type`, or none when the image
// cannot answer it unambiguously.
bool make_question(int type, const std::vector<Shape>& shapes, Random& random, Question& q) {
  auto count_if = [&](auto predicate) {
    return std::count_if(shapes.begin(), shapes.end(), predicate);
  };
  q.type = type;
  if (type == 0) {
    const bool yes = random.below(2) == 0;
    int colour = 0, shape = 0;
    if (yes) {
      const Shape& s = shapes[random.below(static_cast<int>(shapes.size()))];
      colour = s.colour, shape = s.shape;
    } else {
      do {
        colour = random.below(3), shape = random.below(3);
      } while (count_if([&](const Shape& s) { return s.colour == colour && s.shape == shape; }));
    }
    q.text = std::string("is there a ") + kColours[colour] + " " + kShapes[shape] + "?";
    q.answer = yes ? "yes" : "no";
    return true;
  }
  if (type == 3) {
    q.text = "how many shapes are there?";
    q.answer = std::to_string(shapes.size());
    return true;
  }
  // Asked of an object whose shape (colour) occurs once, so the answer is unique.
  std::vector<const Shape*> unique;
  for (const Shape& s : shapes) {
    if (count_if([&](const Shape& o) {
          return type == 1 ? o.shape == s.shape : o.colour == s.colour;
        }) == 1) {
      unique.push_back(&s);
    }
  }
  if (unique.empty()) return false;
  const Shape& s = *unique[random.below(static_cast<int>(unique.size()))];
  if (type == 1) {
    q.text = std::string("what colour is the ") + kShapes[s.shape] + "?";
    q.answer = kColours[s.colour];
    return true;
  }
  q.text = std::string("what shape is the ") + kColours[s.colour] + " object?";
  q.answer = kShapes[s.shape];
  return true;
}

// SynthOptions::source_size: the [3, S', S'] drawing kept as an interleaved
// source image, and its resize to S written to `pixels`.
data::SourceImage keep_source(const std::vector<uint8_t>& drawn, int64_t source_size, int64_t size,
                              uint8_t* pixels) {
  data::SourceImage source;
  source.width = source.height = static_cast<int>(source_size);
  const int64_t plane = source_size * source_size;
  source.rgb.resize(static_cast<size_t>(3 * plane));
  for (int64_t p = 0; p < plane; ++p) {
    for (int64_t c = 0; c < 3; ++c) source.rgb[3 * p + c] = drawn[c * plane + p];
  }
  const auto resized = data::image_resize_bicubic(source.rgb.data(), source.width, source.height, 3,
                                                  static_cast<int>(size), static_cast<int>(size));
  for (int64_t p = 0; p < size * size; ++p) {
    for (int64_t c = 0; c < 3; ++c) pixels[c * size * size + p] = resized[3 * p + c];
  }
  return source;
}

SplitData generate_split(const std::string& name, int64_t num_questions,
                         const SynthOptions& options, const Tokenizer& tokenizer,
                         const FillerWords& fillers, Random& random) {
  SplitData split;
  split.name = name;
  split.image_size = options.image_size;
  split.questions = QuestionTable(options.max_question_length, 1);
  const int64_t num_images =
      (num_questions + options.questions_per_image - 1) / options.questions_per_image;
  const int64_t image_bytes = 3 * options.image_size * options.image_size;
  split.pixels.resize(static_cast<size_t>(num_images * image_bytes));
  int64_t question_id = name == "train" ? 1 : 1'000'000;
  for (int64_t image = 0; image < num_images; ++image) {
    std::array<int, 4> cells = {0, 1, 2, 3};
    for (int i = 3; i > 0; --i) std::swap(cells[i], cells[random.below(i + 1)]);
    std::vector<Shape> shapes(
        static_cast<size_t>(kMinShapes + random.below(kMaxShapes - kMinShapes + 1)));
    for (size_t i = 0; i < shapes.size(); ++i) {
      shapes[i] = {random.below(3), random.below(3), cells[i]};
    }
    uint8_t* pixels = split.pixels.data() + image * image_bytes;
    if (options.source_size > 0 && name == "train") {
      std::vector<uint8_t> drawn(
          static_cast<size_t>(3 * options.source_size * options.source_size));
      draw(shapes, options.source_size, random, drawn.data());
      split.sources.push_back(keep_source(drawn, options.source_size, options.image_size, pixels));
    } else {
      draw(shapes, options.image_size, random, pixels);
    }
    split.image_names.push_back(name + "_" + std::to_string(image) + ".png");
    const int64_t wanted =
        std::min(options.questions_per_image, num_questions - split.questions.size());
    for (int64_t asked = 0, attempts = 0; asked < wanted && attempts < 64; ++attempts) {
      Question q;
      if (!make_question(random.below(4), shapes, random, q)) continue;
      q.text += fillers.draw(random);
      split.questions.add(tokenizer.encode(q.text, options.max_question_length),
                          static_cast<int32_t>(image),
                          q.type == 0 ? data::kAnswerTypeClosed : data::kAnswerTypeOpen,
                          question_id++, q.type, q.text, q.answer, {label_of(q.answer)}, {1.0f});
      ++asked;
    }
  }
  return split;
}

}  // namespace

SynthDataset synth_generate(const SynthOptions& options) {
  if (options.train_questions < 1 || options.test_questions < 1 || options.image_size < 8 ||
      options.image_size > data::kMaxImageSize || options.questions_per_image < 1 ||
      options.max_question_length < 8 || options.source_size < 0 ||
      options.source_size > data::kMaxImageSize ||
      (options.source_size > 0 && options.source_size < 8)) {
    throw std::invalid_argument("synth: need >= 1 question per split, image size 8.." +
                                std::to_string(data::kMaxImageSize) + ", source size 0 or 8.." +
                                std::to_string(data::kMaxImageSize) +
                                ", >= 1 question per image, max length >= 8");
  }
  // The templates' words are the vocabulary; build it from one question of each kind.
  std::vector<std::string> corpus;
  for (const char* colour : kColours) {
    for (const char* shape : kShapes) {
      corpus.push_back(std::string("is there a ") + colour + " " + shape + "?");
      corpus.push_back(std::string("what colour is the ") + shape + "?");
    }
    corpus.push_back(std::string("what shape is the ") + colour + " object?");
  }
  corpus.push_back("how many shapes are there?");
  auto tokenizer = WordTokenizer::build(corpus);
  const auto template_entries = static_cast<int64_t>(tokenizer->vocabulary().size());
  if (options.vocab_size != 0 && options.vocab_size <= template_entries) {
    throw std::invalid_argument("synth: --vocab-size " + std::to_string(options.vocab_size) +
                                " must exceed the templates' " + std::to_string(template_entries) +
                                " entries (special tokens included), or be 0");
  }
  const FillerWords fillers(options.vocab_size > 0 ? options.vocab_size - template_entries : 0);
  if (!fillers.empty()) {
    for (int64_t k = 0; k < options.vocab_size - template_entries; ++k) {
      corpus.push_back(FillerWords::word(k));
    }
    tokenizer = WordTokenizer::build(corpus);
  }

  SynthDataset dataset;
  Random random(options.seed);
  dataset.splits.push_back(
      generate_split("train", options.train_questions, options, *tokenizer, fillers, random));
  dataset.splits.push_back(
      generate_split("test", options.test_questions, options, *tokenizer, fillers, random));

  FileHeader& header = dataset.header;
  header.image_size = options.image_size;
  header.max_question_length = options.max_question_length;
  header.tokenizer = tokenizer->kind();
  header.token_vocabulary = tokenizer->vocabulary();
  header.answer_labels = kAnswerLabels;
  header.question_types.assign(kQuestionTypes.begin(), kQuestionTypes.end());
  // Normalisation from the training pixels, per channel.
  const auto& pixels = dataset.splits[0].pixels;
  const int64_t plane = options.image_size * options.image_size;
  std::array<double, 3> sum{}, square{};
  for (size_t i = 0; i < pixels.size(); ++i) {
    const size_t channel = (i / static_cast<size_t>(plane)) % 3;
    const double value = pixels[i] / 255.0;
    sum[channel] += value;
    square[channel] += value * value;
  }
  const double count = static_cast<double>(pixels.size() / 3);
  for (size_t c = 0; c < 3; ++c) {
    const double mean = sum[c] / count;
    header.image_mean[c] = mean;
    header.image_std[c] = std::max(1e-3, std::sqrt(std::max(0.0, square[c] / count - mean * mean)));
  }
  return dataset;
}

}  // namespace vqa::prep
