#include "data/image_resample.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace vqa::data {

namespace {

// Pillow's fixed point for 8-bit images: 32 - 8 - 2 bits, so that a sum of
// 255 x coefficients (each < 2^22, a few above 1 in magnitude) fits an int32.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr double kBicubicSupport = 2.0;

double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// One axis's filter: output pixel i reads `count[i]` input pixels from
// `first[i]` with fixed-point weights weights[i * taps ..].
struct AxisFilter {
  int taps = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;
};

// Pillow's precompute_coeffs and normalize_coeffs_8bpc for the box [0, in_size).
AxisFilter axis_filter(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);  // downscaling widens the filter: antialiasing
  const double support = kBicubicSupport * filter_scale;
  AxisFilter filter;
  filter.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  filter.first.resize(static_cast<size_t>(out_size));
  filter.count.resize(static_cast<size_t>(out_size));
  filter.weights.assign(static_cast<size_t>(out_size) * static_cast<size_t>(filter.taps), 0);
  std::vector<double> k(static_cast<size_t>(filter.taps));
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    // (int) truncation, as in Pillow, then clamped to the image.
    const int low = std::max(0, static_cast<int>(center - support + 0.5));
    const int high = std::min(in_size, static_cast<int>(center + support + 0.5));
    const int count = high - low;
    double sum = 0.0;
    const double inverse_scale = 1.0 / filter_scale;  // a product, as in Pillow (not a quotient)
    for (int x = 0; x < count; ++x) {
      k[x] = bicubic((x + low - center + 0.5) * inverse_scale);
      sum += k[x];
    }
    for (int x = 0; x < count; ++x) {
      const double weight = sum != 0.0 ? k[x] / sum : k[x];
      const double fixed = weight * (1 << kPrecisionBits);
      filter.weights[static_cast<size_t>(i) * filter.taps + x] =
          static_cast<int32_t>(weight < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    filter.first[i] = low;
    filter.count[i] = count;
  }
  return filter;
}

// Sums are int32 as in Pillow: 255 x the positive weights (at most ~1.2 x
// 2^22, the cubic's negative lobes being small) stays below 2^31.
uint8_t clip8(int32_t value) {
  if (value >= (int32_t{1} << kPrecisionBits << 8)) return 255;
  if (value <= 0) return 0;
  return static_cast<uint8_t>(value >> kPrecisionBits);
}

// Pillow's two passes over an image whose rows are `stride` bytes apart
// (a crop is a window of its source: no copy).
std::vector<uint8_t> resize_window(const uint8_t* pixels, size_t stride, int width, int height,
                                   int channels, int out_width, int out_height) {
  const AxisFilter horizontal = axis_filter(width, out_width);
  const AxisFilter vertical = axis_filter(height, out_height);
  const int32_t round_half = int32_t{1} << (kPrecisionBits - 1);

  // Horizontal pass, over the input rows the vertical pass reads (as Pillow).
  const uint8_t* source = pixels;
  size_t source_stride = stride;
  int row_offset = 0;
  std::vector<uint8_t> rows;
  if (out_width != width) {
    const int first_row = vertical.first.front();
    const int last_row = vertical.first.back() + vertical.count.back();
    const size_t out_stride = static_cast<size_t>(out_width) * channels;
    rows.resize(static_cast<size_t>(last_row - first_row) * out_stride);
    for (int y = first_row; y < last_row; ++y) {
      const uint8_t* in = pixels + static_cast<size_t>(y) * stride;
      uint8_t* out = rows.data() + static_cast<size_t>(y - first_row) * out_stride;
      for (int x = 0; x < out_width; ++x) {
        const int32_t* k = &horizontal.weights[static_cast<size_t>(x) * horizontal.taps];
        const uint8_t* start = in + static_cast<size_t>(horizontal.first[x]) * channels;
        const int count = horizontal.count[x];
        if (channels == 3) {  // RGB, the common case: the three sums side by side
          int32_t s0 = round_half, s1 = round_half, s2 = round_half;
          for (int t = 0; t < count; ++t) {
            s0 += start[3 * t] * k[t];
            s1 += start[3 * t + 1] * k[t];
            s2 += start[3 * t + 2] * k[t];
          }
          out[3 * x] = clip8(s0);
          out[3 * x + 1] = clip8(s1);
          out[3 * x + 2] = clip8(s2);
          continue;
        }
        for (int c = 0; c < channels; ++c) {
          int32_t sum = round_half;
          for (int t = 0; t < count; ++t) sum += start[t * channels + c] * k[t];
          out[x * channels + c] = clip8(sum);
        }
      }
    }
    source = rows.data();
    source_stride = out_stride;
    row_offset = first_row;
  }
  const size_t row_bytes = static_cast<size_t>(out_width) * channels;
  std::vector<uint8_t> result(static_cast<size_t>(out_height) * row_bytes);
  if (out_height == height) {
    for (int y = 0; y < height; ++y) {
      std::copy(source + y * source_stride, source + y * source_stride + row_bytes,
                result.data() + y * row_bytes);
    }
    return result;
  }
  // Vertical pass: one output row's sums at a time, tap by tap (vectorises).
  std::vector<int32_t> sums(row_bytes);
  for (int y = 0; y < out_height; ++y) {
    const int32_t* k = &vertical.weights[static_cast<size_t>(y) * vertical.taps];
    const uint8_t* start =
        source + static_cast<size_t>(vertical.first[y] - row_offset) * source_stride;
    std::fill(sums.begin(), sums.end(), round_half);
    for (int t = 0; t < vertical.count[y]; ++t) {
      const uint8_t* in = start + t * source_stride;
      const int32_t weight = k[t];
      for (size_t i = 0; i < row_bytes; ++i) sums[i] += in[i] * weight;
    }
    uint8_t* out = result.data() + static_cast<size_t>(y) * row_bytes;
    for (size_t i = 0; i < row_bytes; ++i) out[i] = clip8(sums[i]);
  }
  return result;
}

}  // namespace

SquareCrop image_plan_square(int width, int height, int size) {
  if (width < 1 || height < 1 || size < 1) {
    throw std::invalid_argument("image_plan_square: " + std::to_string(width) + "x" +
                                std::to_string(height) + " to " + std::to_string(size));
  }
  SquareCrop crop;
  const int shorter = std::min(width, height), longer = std::max(width, height);
  // Python's int(S * long / short): the product is exact, the quotient a double, then truncated.
  const double exact_long = static_cast<double>(int64_t{size} * longer) / shorter;
  if (exact_long > (1 << 20)) {  // an absurd aspect ratio: refuse rather than allocate gigabytes
    throw std::invalid_argument("image_plan_square: " + std::to_string(width) + "x" +
                                std::to_string(height) + " would become " +
                                std::to_string(exact_long) + " pixels long");
  }
  const int new_long = static_cast<int>(exact_long);
  crop.width = width <= height ? size : new_long;
  crop.height = width <= height ? new_long : size;
  auto offset = [size](int side) {
    const int twice = side - size;  // round(twice / 2.0), ties to even
    const int half = twice / 2;
    return twice % 2 != 0 && half % 2 != 0 ? half + 1 : half;
  };
  crop.left = offset(crop.width);
  crop.top = offset(crop.height);
  return crop;
}

std::vector<uint8_t> image_resize_bicubic(const uint8_t* pixels, int width, int height,
                                          int channels, int out_width, int out_height) {
  if (width < 1 || height < 1 || out_width < 1 || out_height < 1 || channels < 1) {
    throw std::invalid_argument("image_resize_bicubic: bad size");
  }
  return resize_window(pixels, static_cast<size_t>(width) * channels, width, height, channels,
                       out_width, out_height);
}

namespace {

// Uniform in [low, high), as torch's uniform_ on a double: 53 random bits.
double uniform(vqa::util::SplitMix64& rng, double low, double high) {
  const double unit = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
  return low + (high - low) * unit;
}

}  // namespace

CropBox image_random_crop_box(int width, int height, const RandomCropRanges& ranges,
                              vqa::util::SplitMix64& rng, bool* fell_back) {
  if (width < 1 || height < 1) {
    throw std::invalid_argument("random crop of an empty image (" + std::to_string(width) + "x" +
                                std::to_string(height) + ")");
  }
  if (!(ranges.scale_min > 0.0 && ranges.scale_min <= ranges.scale_max) ||
      !(ranges.ratio_min > 0.0 && ranges.ratio_min <= ranges.ratio_max) ||
      !std::isfinite(ranges.scale_max) || !std::isfinite(ranges.ratio_max)) {
    throw std::invalid_argument(
        "random crop: scale and ratio must be ranges low <= high in (0, inf)");
  }
  if (fell_back) *fell_back = false;
  const double area = static_cast<double>(width) * height;
  const double log_low = std::log(ranges.ratio_min), log_high = std::log(ranges.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * uniform(rng, ranges.scale_min, ranges.scale_max);
    const double ratio = std::exp(uniform(rng, log_low, log_high));
    // std::nearbyint rounds half to even in the default rounding mode, as Python's round.
    const int w = static_cast<int>(std::nearbyint(std::sqrt(target_area * ratio)));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(target_area / ratio)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      CropBox box;
      box.width = w;
      box.height = h;
      box.top = static_cast<int>(rng.below(static_cast<uint64_t>(height - h + 1)));
      box.left = static_cast<int>(rng.below(static_cast<uint64_t>(width - w + 1)));
      return box;
    }
  }
  if (fell_back) *fell_back = true;
  CropBox box{0, 0, width, height};
  const double in_ratio = static_cast<double>(width) / height;
  if (in_ratio < ranges.ratio_min) {
    box.height = static_cast<int>(std::nearbyint(width / ranges.ratio_min));
  } else if (in_ratio > ranges.ratio_max) {
    box.width = static_cast<int>(std::nearbyint(height * ranges.ratio_max));
  }
  box.top = (height - box.height) / 2;
  box.left = (width - box.width) / 2;
  return box;
}

std::vector<uint8_t> image_crop_resize_bicubic(const uint8_t* pixels, int width, int height,
                                               int channels, const CropBox& box, int out_width,
                                               int out_height) {
  if (box.width < 1 || box.height < 1 || box.left < 0 || box.top < 0 ||
      box.left + box.width > width || box.top + box.height > height) {
    throw std::invalid_argument("crop box " + std::to_string(box.width) + "x" +
                                std::to_string(box.height) + " at (" + std::to_string(box.left) +
                                ", " + std::to_string(box.top) + ") is not inside the " +
                                std::to_string(width) + "x" + std::to_string(height) + " image");
  }
  if (out_width < 1 || out_height < 1 || channels < 1) {
    throw std::invalid_argument("image_crop_resize_bicubic: bad size");
  }
  // Pillow's crop then resize: the resize reads only the box.
  const size_t stride = static_cast<size_t>(width) * channels;
  return resize_window(pixels + box.top * stride + static_cast<size_t>(box.left) * channels, stride,
                       box.width, box.height, channels, out_width, out_height);
}

}  // namespace vqa::data
