// The image transform of CLIP and M3AE's evaluation, reproduced without
// Python: torchvision's Resize(S) on a PIL image (the shorter side to S with
// PIL's antialiased bicubic filter) then CenterCrop(S).
//
// The resampling follows Pillow's src/libImaging/Resample.c (Image.resize
// with BICUBIC and reducing_gap=None, as torchvision calls it): a separable
// cubic convolution (a = -0.5) whose support widens by the downscale factor,
// coefficients normalised per output pixel and rounded to 22-bit fixed
// point, a horizontal pass then a vertical pass, each rounded to 8 bits.
// tests/data/test_image_resize.cpp compares the result with Pillow's.
#pragma once

#include <cstdint>
#include <vector>

namespace vqa::prep {

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

}  // namespace vqa::prep
