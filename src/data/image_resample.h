// The image transforms of CLIP and M3AE, reproduced without Python:
// evaluation's torchvision Resize(S) on a PIL image (the shorter side to S
// with PIL's antialiased bicubic filter) then CenterCrop(S), which vqa_prep
// stores; and training's RandomResizedCrop (M3AE's clip_resizedcrop), which
// the loader applies to the stored source images batch by batch.
//
// The resampling follows Pillow's src/libImaging/Resample.c (Image.resize
// with BICUBIC and reducing_gap=None, as torchvision calls it): a separable
// cubic convolution (a = -0.5) whose support widens by the downscale factor,
// coefficients normalised per output pixel and rounded to 22-bit fixed
// point, a horizontal pass then a vertical pass, each rounded to 8 bits.
// tests/data/test_image_resize.cpp compares the result with Pillow's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/splitmix64.h"  // SplitMix64

namespace vqa::data {

// A decoded 8-bit RGB image as PIL holds it: interleaved channels,
// height x width x 3, row-major.
struct SourceImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Where the square comes from: resize to width x height, then crop the
// size x size square at (left, top).
struct SquareCrop {
  int width = 0, height = 0, left = 0, top = 0;
};

// torchvision's rules: the shorter side becomes `size`, the longer
// int(size * long / short) (truncated); the crop starts at
// int(round((side - size) / 2.0)) on each axis (Python's round: half to even).
SquareCrop image_plan_square(int width, int height, int size);

// Pillow's bicubic resize of an 8-bit image with interleaved channels
// (height x width x channels, row-major) to out_width x out_height.
std::vector<uint8_t> image_resize_bicubic(const uint8_t* pixels, int width, int height,
                                          int channels, int out_width, int out_height);

// A crop box in pixels of the image it is cut from.
struct CropBox {
  int left = 0, top = 0, width = 0, height = 0;
};

// The ranges of torchvision's RandomResizedCrop (M3AE's clip_resizedcrop:
// scale 0.9 to 1.0, ratio 3/4 to 4/3, the defaults' ratio).
struct RandomCropRanges {
  double scale_min = 0.9, scale_max = 1.0;              // of the image's area
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // width / height
};

// torchvision's RandomResizedCrop.get_params with `rng` for torch's
// generator: up to 10 tries of an area drawn uniformly in
// [scale_min, scale_max] x the image's area and an aspect ratio drawn
// log-uniformly in [ratio_min, ratio_max]; width and height are the rounded
// (half to even, as Python's round) square roots of area x ratio and
// area / ratio, and the first box that fits gets a uniform top and left.
// When none fits: the whole image clamped to the ratio range, centred
// (*fell_back set). Throws std::invalid_argument on an empty image or
// ranges that are empty or outside (0, inf).
CropBox image_random_crop_box(int width, int height, const RandomCropRanges& ranges,
                              vqa::util::SplitMix64& rng, bool* fell_back = nullptr);

// torchvision's resized_crop on a PIL image: Pillow's crop to `box`, then
// its bicubic resize to out_width x out_height (image_resize_bicubic).
// Throws std::invalid_argument when the box is empty or leaves the image.
std::vector<uint8_t> image_crop_resize_bicubic(const uint8_t* pixels, int width, int height,
                                               int channels, const CropBox& box, int out_width,
                                               int out_height);

}  // namespace vqa::data
