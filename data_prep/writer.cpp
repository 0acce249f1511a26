#include "writer.h"

#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "data/dataset_format.h"  // dataset names, DataFormatError
#include "runtime/check.h"        // VQA_CHECK_HDF5

namespace vqa::prep {

using data::hdf5_try;
using data::Hdf5Id;

void QuestionTable::add(const std::vector<int32_t>& tokens, int32_t image, int type, int64_t id,
                        int32_t question_type_code, const std::string& question,
                        const std::string& answer, const std::vector<int32_t>& labels,
                        const std::vector<float>& scores) {
  for (int64_t t = 0; t < max_length; ++t) {
    const bool real = t < static_cast<int64_t>(tokens.size());
    token_ids.push_back(real ? tokens[t] : pad_token);
    attention_mask.push_back(real ? 1 : 0);
  }
  for (int64_t m = 0; m < max_targets; ++m) {
    const bool real = m < static_cast<int64_t>(labels.size());
    target_labels.push_back(real ? labels[m] : -1);
    target_scores.push_back(real ? scores[m] : 0.0f);
  }
  image_row.push_back(image);
  answer_type.push_back(static_cast<uint8_t>(type));
  question_id.push_back(id);
  question_type.push_back(question_type_code);
  question_text.push_back(question);
  answer_text.push_back(answer);
}

namespace {

Hdf5Id link_creation_with_parents() {
  Hdf5Id list(H5Pcreate(H5P_LINK_CREATE));
  VQA_CHECK_HDF5(list.get());
  VQA_CHECK_HDF5(H5Pset_create_intermediate_group(list.get(), 1));
  return list;
}

// A contiguous dataset written whole: question arrays are small and read by
// scattered rows, which a contiguous layout serves without chunk overhead.
void write_array(hid_t location, const std::string& name, hid_t file_type, hid_t memory_type,
                 const std::vector<hsize_t>& shape, const void* values, const std::string& path) {
  Hdf5Id space(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr));
  hdf5_try(space.get(), "H5Screate_simple", path);
  Hdf5Id links = link_creation_with_parents();
  Hdf5Id dataset(H5Dcreate2(location, name.c_str(), file_type, space.get(), links.get(),
                            H5P_DEFAULT, H5P_DEFAULT));
  hdf5_try(dataset.get(), ("H5Dcreate2('" + name + "')").c_str(), path);
  if (shape.empty() || shape[0] > 0) {
    hdf5_try(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values),
             ("H5Dwrite('" + name + "')").c_str(), path);
  }
  hdf5_try(dataset.reset(), ("H5Dclose('" + name + "')").c_str(), path);
}

void write_strings(hid_t location, const std::string& name, const std::vector<std::string>& texts,
                   const std::string& path) {
  std::vector<const char*> pointers;
  pointers.reserve(texts.size());
  for (const auto& text : texts) pointers.push_back(text.c_str());
  Hdf5Id type = data::hdf5_string_type();
  write_array(location, name, type.get(), type.get(), {texts.size()}, pointers.data(), path);
}

}  // namespace

DatasetWriter::DatasetWriter(const std::string& path)
    : path_(path), partial_path_(path + ".partial") {
  data::hdf5_silence_errors();
  std::error_code ignored;
  std::filesystem::remove(partial_path_, ignored);  // left by a run that was killed
  file_ = Hdf5Id(H5Fcreate(partial_path_.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT));
  hdf5_try(file_.get(), "H5Fcreate", partial_path_);
}

DatasetWriter::~DatasetWriter() {
  if (committed_) return;
  source_pixels_.reset();
  images_.reset();
  split_group_.reset();
  file_.reset();
  std::error_code ignored;
  std::filesystem::remove(partial_path_, ignored);
}

void DatasetWriter::begin_split(const std::string& split, int64_t image_size,
                                int64_t feature_tokens, int64_t feature_dim, bool half_precision) {
  split_group_ =
      Hdf5Id(H5Gcreate2(file_.get(), ("/" + split).c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  hdf5_try(split_group_.get(), ("H5Gcreate2('/" + split + "')").c_str(), partial_path_);
  const bool features = image_size == 0;
  row_shape_ = features ? std::vector<int64_t>{feature_tokens, feature_dim}
                        : std::vector<int64_t>{3, image_size, image_size};
  // Extendible and chunked one row per chunk: images are appended as they
  // are decoded, and the loader reads one image with one chunk read.
  std::vector<hsize_t> dims{0}, max_dims{H5S_UNLIMITED}, chunk{1};
  for (int64_t d : row_shape_) {
    dims.push_back(d);
    max_dims.push_back(d);
    chunk.push_back(d);
  }
  Hdf5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims.data()));
  hdf5_try(space.get(), "H5Screate_simple", partial_path_);
  Hdf5Id create(H5Pcreate(H5P_DATASET_CREATE));
  hdf5_try(create.get(), "H5Pcreate", partial_path_);
  hdf5_try(H5Pset_chunk(create.get(), static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk",
           partial_path_);
  Hdf5Id half = data::hdf5_float16_type();
  const hid_t type = !features ? H5T_STD_U8LE : half_precision ? half.get() : H5T_IEEE_F32LE;
  const char* name = features ? data::kFeatures : data::kImages;
  images_ = Hdf5Id(H5Dcreate2(split_group_.get(), name, type, space.get(), H5P_DEFAULT,
                              create.get(), H5P_DEFAULT));
  hdf5_try(images_.get(), "H5Dcreate2(images)", partial_path_);
  image_rows_ = 0;
  source_offsets_.clear();
  source_shapes_.clear();
  source_bytes_ = 0;
}

int64_t DatasetWriter::append_row(hid_t memory_type, const void* row) {
  std::vector<hsize_t> dims{static_cast<hsize_t>(image_rows_ + 1)},
      start{static_cast<hsize_t>(image_rows_)}, count{1};
  for (int64_t d : row_shape_) {
    dims.push_back(d);
    start.push_back(0);
    count.push_back(d);
  }
  hdf5_try(H5Dset_extent(images_.get(), dims.data()), "H5Dset_extent(images)", partial_path_);
  Hdf5Id file_space(H5Dget_space(images_.get()));
  hdf5_try(file_space.get(), "H5Dget_space", partial_path_);
  hdf5_try(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                               count.data(), nullptr),
           "H5Sselect_hyperslab", partial_path_);
  Hdf5Id memory_space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  hdf5_try(memory_space.get(), "H5Screate_simple", partial_path_);
  hdf5_try(
      H5Dwrite(images_.get(), memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, row),
      "H5Dwrite(images)", partial_path_);
  return image_rows_++;
}

int64_t DatasetWriter::append_image(const uint8_t* pixels) {
  return append_row(H5T_NATIVE_UINT8, pixels);
}

int64_t DatasetWriter::append_features(const float* values) {
  return append_row(H5T_NATIVE_FLOAT, values);
}

void DatasetWriter::append_source_image(const data::SourceImage& source) {
  const auto count = static_cast<int64_t>(source_offsets_.size());
  if (row_shape_.size() != 3 || count + 1 != image_rows_ || source.width < 1 || source.height < 1 ||
      source.width > data::kMaxSourceImageSide || source.height > data::kMaxSourceImageSide ||
      source.rgb.size() != static_cast<size_t>(source.width) * source.height * 3) {
    throw std::logic_error("append_source_image: source " + std::to_string(count) + " (" +
                           std::to_string(source.width) + "x" + std::to_string(source.height) +
                           ", " + std::to_string(source.rgb.size()) + " bytes) after " +
                           std::to_string(image_rows_) + " images");
  }
  const std::string& path = partial_path_;
  if (!source_pixels_.valid()) {
    // One flat byte array, chunked by 1 MiB: an image is one contiguous
    // range, read with one hyperslab.
    const hsize_t dims[1] = {0}, max_dims[1] = {H5S_UNLIMITED}, chunk[1] = {hsize_t{1} << 20};
    Hdf5Id space(H5Screate_simple(1, dims, max_dims));
    hdf5_try(space.get(), "H5Screate_simple", path);
    Hdf5Id create(H5Pcreate(H5P_DATASET_CREATE));
    hdf5_try(create.get(), "H5Pcreate", path);
    hdf5_try(H5Pset_chunk(create.get(), 1, chunk), "H5Pset_chunk", path);
    Hdf5Id links = link_creation_with_parents();
    source_pixels_ = Hdf5Id(H5Dcreate2(split_group_.get(), data::kSourcePixels, H5T_STD_U8LE,
                                       space.get(), links.get(), create.get(), H5P_DEFAULT));
    hdf5_try(source_pixels_.get(), "H5Dcreate2(source_images/pixels)", path);
  }
  const auto bytes = static_cast<hsize_t>(source.rgb.size());
  const hsize_t extent[1] = {static_cast<hsize_t>(source_bytes_) + bytes};
  const hsize_t start[1] = {static_cast<hsize_t>(source_bytes_)};
  hdf5_try(H5Dset_extent(source_pixels_.get(), extent), "H5Dset_extent(source_images/pixels)",
           path);
  Hdf5Id file_space(H5Dget_space(source_pixels_.get()));
  hdf5_try(file_space.get(), "H5Dget_space", path);
  hdf5_try(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, &bytes, nullptr),
           "H5Sselect_hyperslab", path);
  Hdf5Id memory_space(H5Screate_simple(1, &bytes, nullptr));
  hdf5_try(memory_space.get(), "H5Screate_simple", path);
  hdf5_try(H5Dwrite(source_pixels_.get(), H5T_NATIVE_UINT8, memory_space.get(), file_space.get(),
                    H5P_DEFAULT, source.rgb.data()),
           "H5Dwrite(source_images/pixels)", path);
  source_offsets_.push_back(source_bytes_);
  source_shapes_.push_back(source.height);
  source_shapes_.push_back(source.width);
  source_bytes_ += static_cast<int64_t>(bytes);
}

void DatasetWriter::end_images(const std::vector<std::string>& image_names) {
  if (static_cast<int64_t>(image_names.size()) != image_rows_) {
    throw std::logic_error("end_images: " + std::to_string(image_names.size()) + " names for " +
                           std::to_string(image_rows_) + " images");
  }
  const auto sources = static_cast<int64_t>(source_offsets_.size());
  if (sources > 0) {
    if (sources != image_rows_) {
      throw std::logic_error("end_images: " + std::to_string(sources) + " source images for " +
                             std::to_string(image_rows_) + " images");
    }
    const auto n = static_cast<hsize_t>(sources);
    write_array(split_group_.get(), data::kSourceOffsets, H5T_STD_I64LE, H5T_NATIVE_INT64, {n},
                source_offsets_.data(), partial_path_);
    write_array(split_group_.get(), data::kSourceShapes, H5T_STD_I32LE, H5T_NATIVE_INT32, {n, 2},
                source_shapes_.data(), partial_path_);
    hdf5_try(source_pixels_.reset(), "H5Dclose(source_images/pixels)", partial_path_);
  }
  write_strings(split_group_.get(), data::kImageNames, image_names, partial_path_);
  hdf5_try(images_.reset(), "H5Dclose(images)", partial_path_);
  hdf5_try(split_group_.reset(), "H5Gclose", partial_path_);
}

void DatasetWriter::write_questions(const std::string& split, const QuestionTable& q) {
  Hdf5Id split_group(H5Gopen2(file_.get(), ("/" + split).c_str(), H5P_DEFAULT));
  hdf5_try(split_group.get(), ("H5Gopen2('/" + split + "')").c_str(), partial_path_);
  const hid_t group = split_group.get();
  const std::string& path = partial_path_;
  const auto n = static_cast<hsize_t>(q.size());
  const auto length = static_cast<hsize_t>(q.max_length);
  const auto targets = static_cast<hsize_t>(q.max_targets);
  write_array(group, data::kTokenIds, H5T_STD_I32LE, H5T_NATIVE_INT32, {n, length},
              q.token_ids.data(), path);
  write_array(group, data::kAttentionMask, H5T_STD_U8LE, H5T_NATIVE_UINT8, {n, length},
              q.attention_mask.data(), path);
  write_array(group, data::kImageRow, H5T_STD_I32LE, H5T_NATIVE_INT32, {n}, q.image_row.data(),
              path);
  write_array(group, data::kAnswerType, H5T_STD_U8LE, H5T_NATIVE_UINT8, {n}, q.answer_type.data(),
              path);
  write_array(group, data::kQuestionId, H5T_STD_I64LE, H5T_NATIVE_INT64, {n}, q.question_id.data(),
              path);
  write_array(group, data::kQuestionType, H5T_STD_I32LE, H5T_NATIVE_INT32, {n},
              q.question_type.data(), path);
  write_strings(group, data::kQuestionText, q.question_text, path);
  write_strings(group, data::kAnswerText, q.answer_text, path);
  write_array(group, data::kTargetLabels, H5T_STD_I32LE, H5T_NATIVE_INT32, {n, targets},
              q.target_labels.data(), path);
  write_array(group, data::kTargetScores, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {n, targets},
              q.target_scores.data(), path);
  hdf5_try(split_group.reset(), "H5Gclose", path);
}

void DatasetWriter::commit(const FileHeader& header) {
  const hid_t root = file_.get();
  const std::string& path = partial_path_;
  data::hdf5_write_string_attribute(root, data::kAttrFormat, data::kFormatName, path);
  data::hdf5_write_int_attribute(root, data::kAttrFormatVersion, data::kFormatVersion, path);
  data::hdf5_write_string_attribute(root, data::kAttrImageStorage,
                                    header.features ? "features" : "pixels", path);
  data::hdf5_write_int_attribute(root, data::kAttrImageSize, header.image_size, path);
  data::hdf5_write_double_attribute(root, data::kAttrImageMean, header.image_mean, path);
  data::hdf5_write_double_attribute(root, data::kAttrImageStd, header.image_std, path);
  data::hdf5_write_int_attribute(root, data::kAttrMaxQuestionLength, header.max_question_length,
                                 path);
  data::hdf5_write_int_attribute(root, data::kAttrNumAnswers,
                                 static_cast<int64_t>(header.answer_labels.size()), path);
  data::hdf5_write_string_attribute(root, data::kAttrTokenizer, header.tokenizer, path);
  data::hdf5_write_int_attribute(root, data::kAttrPadTokenId, header.special_tokens.pad, path);
  data::hdf5_write_int_attribute(root, data::kAttrClsTokenId, header.special_tokens.cls, path);
  data::hdf5_write_int_attribute(root, data::kAttrEosTokenId, header.special_tokens.eos, path);
  data::hdf5_write_int_attribute(root, data::kAttrUnkTokenId, header.special_tokens.unk, path);
  data::hdf5_write_string_attribute(root, data::kAttrTokenizerSha256, header.tokenizer_sha256,
                                    path);
  data::hdf5_write_string_attribute(root, data::kAttrImageNormalization, header.image_normalization,
                                    path);
  data::hdf5_write_string_attribute(root, data::kAttrCreatedBy, header.created_by, path);
  if (!header.answer_normalization.empty()) {
    data::hdf5_write_string_attribute(root, data::kAttrAnswerNormalization,
                                      header.answer_normalization, path);
  }
  if (!header.answer_label_set.empty()) {
    data::hdf5_write_string_attribute(root, data::kAttrAnswerLabelSet, header.answer_label_set,
                                      path);
  }
  write_strings(root, data::kAnswerVocabulary, header.answer_labels, path);
  write_strings(root, data::kTokenVocabulary, header.token_vocabulary, path);
  write_strings(root, data::kQuestionTypeVocabulary, header.question_types, path);
  // A failed close can mean unwritten data: check it before the rename.
  hdf5_try(file_.reset(), "H5Fclose", path);
  std::error_code error;
  std::filesystem::rename(partial_path_, path_, error);
  if (error) {
    throw data::DataFormatError(path_ + ": cannot rename " + partial_path_ +
                                " to it: " + error.message());
  }
  committed_ = true;
}

void prep_write_dataset(const std::string& path, const FileHeader& header,
                        const std::vector<SplitData>& splits) {
  DatasetWriter writer(path);
  for (const SplitData& split : splits) {
    writer.begin_split(split.name, split.image_size);
    const int64_t image_bytes = 3 * split.image_size * split.image_size;
    for (size_t i = 0; i < split.image_names.size(); ++i) {
      writer.append_image(split.pixels.data() + i * image_bytes);
      if (!split.sources.empty()) writer.append_source_image(split.sources.at(i));
    }
    writer.end_images(split.image_names);
    writer.write_questions(split.name, split.questions);
  }
  writer.commit(header);
}

}  // namespace vqa::prep
