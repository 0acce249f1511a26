// Image and feature sources for `vqa_prep convert`: OpenCV decoding and
// PIL's resize (image_resample.h) to the stored [3, S, S] RGB layout, and
// rows of a precomputed-features file. (The checked path of an image inside
// its folder is in convert_records.h.)
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/hdf5_util.h"       // Hdf5Id
#include "data/image_resample.h"  // SourceImage

namespace vqa::prep {

// Decodes a JPEG/PNG file, resizes its shorter side to `size` and crops the
// centre square as torchvision's Resize + CenterCrop on a PIL image do
// (image_resample.h), into uint8 [3, size, size] RGB. With `source`, also
// the decoded image itself in RGB (what the loader's random resized crop
// cuts from). Returns an error text, empty on success.
std::string image_load_square(const std::string& file, int64_t size, std::vector<uint8_t>& chw,
                              data::SourceImage* source = nullptr);

// Loads `names` on `threads` threads; errors[i] is empty when images[i] was
// read. With `sources`, (*sources)[i] is the decoded image (image_load_square).
void image_load_all(const std::vector<std::string>& files, int64_t size, int threads,
                    std::vector<std::vector<uint8_t>>& images, std::vector<std::string>& errors,
                    std::vector<data::SourceImage>* sources = nullptr);

// Per-image features from an HDF5 file: a float dataset [N, T, D] and a
// string dataset [N] naming each row's image (file name, with or without
// its folder and extension).
class FeatureSource {
 public:
  FeatureSource(const std::string& path, const std::string& dataset, const std::string& index);
  int64_t tokens() const { return tokens_; }
  int64_t dim() const { return dim_; }
  bool half_precision() const { return half_precision_; }
  // The row for an image name, or -1.
  int64_t find(const std::string& image_name) const;
  std::vector<float> read(int64_t row);

 private:
  std::string path_, dataset_name_;
  data::Hdf5Id file_, dataset_;
  int64_t tokens_ = 0, dim_ = 0;
  bool half_precision_ = false;
  std::unordered_map<std::string, int64_t> rows_;
};

}  // namespace vqa::prep
