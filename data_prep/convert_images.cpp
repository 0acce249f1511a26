#include "convert_images.h"

#include <algorithm>
#include <filesystem>
#include <opencv2/imgcodecs.hpp>
#include <thread>

#include "data/dataset_format.h"  // DataFormatError, kMaxFeatureElements
#include "data/image_resample.h"  // image_plan_square, image_resize_bicubic

namespace vqa::prep {

using data::image_plan_square;
using data::image_resize_bicubic;
using data::SquareCrop;

namespace fs = std::filesystem;

std::string image_load_square(const std::string& file, int64_t size, std::vector<uint8_t>& chw,
                              data::SourceImage* source) {
  std::error_code code;
  if (!fs::is_regular_file(file, code)) return "no such image file: " + file;
  cv::Mat image;
  try {
    // As PIL opens it (M3AE, CLIP): EXIF orientation is not applied.
    image = cv::imread(file, cv::IMREAD_COLOR | cv::IMREAD_IGNORE_ORIENTATION);
  } catch (const cv::Exception& e) {
    return "cannot decode image " + file + ": " + e.what();
  }
  if (image.empty() || image.rows < 1 || image.cols < 1) {
    return "cannot decode image " + file + " (unreadable, or not a JPEG/PNG image)";
  }
  if (!image.isContinuous()) image = image.clone();
  // Shorter side to `size`, then the centre square: CLIP's and M3AE's eval transform.
  const int side = static_cast<int>(size);
  SquareCrop crop;
  std::vector<uint8_t> resized;
  try {  // this runs on a worker thread: an exception must not leave it
    crop = image_plan_square(image.cols, image.rows, side);
    resized = image_resize_bicubic(image.data, image.cols, image.rows, 3, crop.width, crop.height);
  } catch (const std::exception& e) {
    return "cannot resize image " + file + " (" + std::to_string(image.cols) + "x" +
           std::to_string(image.rows) + " to a shorter side of " + std::to_string(size) +
           "): " + e.what();
  }
  if (source) {
    source->width = image.cols;
    source->height = image.rows;
    source->rgb.resize(static_cast<size_t>(image.cols) * image.rows * 3);
    const uint8_t* bgr = image.data;
    for (size_t p = 0; p < source->rgb.size(); p += 3) {
      source->rgb[p] = bgr[p + 2];
      source->rgb[p + 1] = bgr[p + 1];
      source->rgb[p + 2] = bgr[p];
    }
  }
  chw.resize(static_cast<size_t>(3 * size * size));
  const int64_t plane = size * size;
  for (int y = 0; y < side; ++y) {
    const uint8_t* row =
        resized.data() + (static_cast<size_t>(y + crop.top) * crop.width + crop.left) * 3;
    for (int x = 0; x < side; ++x) {
      const int64_t offset = y * size + x;
      chw[offset] = row[3 * x + 2];  // OpenCV decodes to BGR; the format stores RGB
      chw[plane + offset] = row[3 * x + 1];
      chw[2 * plane + offset] = row[3 * x];
    }
  }
  return "";
}

void image_load_all(const std::vector<std::string>& files, int64_t size, int threads,
                    std::vector<std::vector<uint8_t>>& images, std::vector<std::string>& errors,
                    std::vector<data::SourceImage>* sources) {
  images.assign(files.size(), {});
  if (sources) sources->assign(files.size(), {});
  errors.assign(files.size(), "");
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = static_cast<int>(
      std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(1, files.size())));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < files.size(); i += static_cast<size_t>(threads)) {
        errors[i] =
            image_load_square(files[i], size, images[i], sources ? &(*sources)[i] : nullptr);
      }
    });
  }
  for (auto& worker : workers) worker.join();
}

FeatureSource::FeatureSource(const std::string& path, const std::string& dataset,
                             const std::string& index)
    : path_(path), dataset_name_(dataset) {
  data::hdf5_silence_errors();
  std::error_code code;
  if (!fs::is_regular_file(path, code))
    throw data::DataFormatError(path + ": no such features file");
  file_ = data::Hdf5Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  data::hdf5_try(file_.get(), "H5Fopen", path);
  dataset_ = data::hdf5_open_dataset(file_.get(), dataset, path);
  const auto type = data::hdf5_element_type(dataset_.get(), false, dataset, path);
  const auto shape = data::hdf5_shape(dataset_.get(), dataset, path);
  if (type.type_class != H5T_FLOAT || (type.size != 2 && type.size != 4) || shape.size() != 3 ||
      shape[1] < 1 || shape[2] < 1 || shape[1] * shape[2] > data::kMaxFeatureElements) {
    throw data::DataFormatError(path + ": dataset '" + dataset +
                                "' must be float16/float32 [images, tokens, dim], found " +
                                type.describe() + " of rank " + std::to_string(shape.size()));
  }
  tokens_ = shape[1];
  dim_ = shape[2];
  half_precision_ = type.size == 2;
  data::Hdf5Id names = data::hdf5_open_dataset(file_.get(), index, path);
  const auto name_shape = data::hdf5_shape(names.get(), index, path);
  if (name_shape.size() != 1 || name_shape[0] != shape[0]) {
    throw data::DataFormatError(path + ": dataset '" + index + "' must name each of the " +
                                std::to_string(shape[0]) + " feature rows");
  }
  const auto texts = data::hdf5_read_strings(names.get(), 0, name_shape[0], index, path);
  for (size_t row = 0; row < texts.size(); ++row)
    rows_.emplace(texts[row], static_cast<int64_t>(row));
}

int64_t FeatureSource::find(const std::string& image_name) const {
  const fs::path name(image_name);
  for (const std::string& key : {image_name, name.filename().string(), name.stem().string()}) {
    auto it = rows_.find(key);
    if (it != rows_.end()) return it->second;
  }
  return -1;
}

std::vector<float> FeatureSource::read(int64_t row) {
  std::vector<float> values(static_cast<size_t>(tokens_ * dim_));
  data::Hdf5Id file_space(H5Dget_space(dataset_.get()));
  data::hdf5_try(file_space.get(), "H5Dget_space", path_);
  const hsize_t start[3] = {static_cast<hsize_t>(row), 0, 0};
  const hsize_t count[3] = {1, static_cast<hsize_t>(tokens_), static_cast<hsize_t>(dim_)};
  data::hdf5_try(
      H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
      "H5Sselect_hyperslab", path_);
  data::Hdf5Id memory_space(H5Screate_simple(3, count, nullptr));
  data::hdf5_try(memory_space.get(), "H5Screate_simple", path_);
  data::hdf5_try(H5Dread(dataset_.get(), H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(),
                         H5P_DEFAULT, values.data()),
                 ("H5Dread('" + dataset_name_ + "')").c_str(), path_);
  return values;
}

}  // namespace vqa::prep
