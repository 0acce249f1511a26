// Fuzz target: dataset files built from structured edits. A small valid file
// is held as a list of objects (root attributes and datasets, with dtype,
// shape and values); the input is a sequence of edits to that list (a value,
// a dtype, a dimension, the rank, a missing object, chunked or not, pixels
// to features), and the result is written with HDF5 and opened with
// DatasetReader (fuzz_exercise_reader). Raw byte mutations mostly break
// HDF5's own metadata; these edits reach every check of the reader with
// files HDF5 accepts, which is where the reader's bugs would be.
#include <cmath>
#include <cstring>
#include <limits>

#include "data/dataset_format.h"  // dataset and attribute names, limits
#include "data/hdf5_util.h"       // Hdf5Id, hdf5_string_type, hdf5_float16_type
#include "fuzz_support.h"         // fuzz_exercise_reader, fuzz_scratch_path

namespace {

using vqa::data::Hdf5Id;

enum class Kind {
  kInt8,
  kUint8,
  kInt16,
  kInt32,
  kInt64,
  kUint32,
  kFloat16,
  kFloat32,
  kFloat64,
  kString,
  kFixedString,
  kCount
};

bool is_string(Kind kind) { return kind == Kind::kString || kind == Kind::kFixedString; }
bool is_float(Kind kind) {
  return kind == Kind::kFloat16 || kind == Kind::kFloat32 || kind == Kind::kFloat64;
}

// Above this many elements a dataset is declared but not written: HDF5 then
// returns the fill value (0) for it, as for a file whose writer stopped early.
constexpr int64_t kMaxWritten = int64_t{1} << 16;
constexpr int kMaxEdits = 32;

struct Object {
  std::string name;  // a root attribute name, or a dataset path
  bool attribute = false;
  Kind kind = Kind::kInt32;
  std::vector<int64_t> shape;  // empty: scalar
  std::vector<double> values;  // numbers (exact for |x| < 2^53)
  std::vector<std::string> strings;
  bool present = true, chunked = false, written = true;

  // Elements, or -1 when the count overflows.
  int64_t count() const {
    int64_t total = 1;
    for (int64_t d : shape) {
      if (d != 0 && total > std::numeric_limits<int64_t>::max() / d) return -1;
      total *= d;
    }
    return total;
  }
  void resize_data() {
    const int64_t n = count();
    written = n >= 0 && n <= kMaxWritten;
    const size_t size = written ? static_cast<size_t>(n) : 0;
    values.resize(is_string(kind) ? 0 : size, 0.0);
    strings.resize(is_string(kind) ? size : 0, "");
  }
};

Object numeric(const std::string& name, Kind kind, std::vector<int64_t> shape,
               std::vector<double> values, bool attribute = false) {
  Object object;
  object.name = name;
  object.attribute = attribute;
  object.kind = kind;
  object.shape = std::move(shape);
  object.values = std::move(values);
  object.resize_data();
  return object;
}

Object strings(const std::string& name, std::vector<int64_t> shape, std::vector<std::string> texts,
               bool attribute = false) {
  Object object;
  object.name = name;
  object.attribute = attribute;
  object.kind = Kind::kString;
  object.shape = std::move(shape);
  object.strings = std::move(texts);
  object.resize_data();
  return object;
}

// 4 questions over 2 images of 2x2 pixels per split, L = 4, K = 3, V = 6, M = 1.
std::vector<Object> valid_file() {
  namespace d = vqa::data;
  std::vector<Object> objects = {
      strings(d::kAttrFormat, {}, {"vqa-hpc"}, true),
      numeric(d::kAttrFormatVersion, Kind::kInt64, {}, {1}, true),
      strings(d::kAttrImageStorage, {}, {"pixels"}, true),
      numeric(d::kAttrImageSize, Kind::kInt64, {}, {2}, true),
      numeric(d::kAttrImageMean, Kind::kFloat64, {3}, {0.5, 0.5, 0.5}, true),
      numeric(d::kAttrImageStd, Kind::kFloat64, {3}, {0.25, 0.25, 0.25}, true),
      numeric(d::kAttrMaxQuestionLength, Kind::kInt64, {}, {4}, true),
      numeric(d::kAttrNumAnswers, Kind::kInt64, {}, {3}, true),
      strings(d::kAttrTokenizer, {}, {"word"}, true),
      strings(d::kAttrCreatedBy, {}, {"fuzz"}, true),
      strings(d::kAnswerVocabulary, {3}, {"yes", "no", "2"}),
      strings(d::kTokenVocabulary, {6}, {"<pad>", "<unk>", "<cls>", "is", "there", "a"}),
      strings(d::kQuestionTypeVocabulary, {2}, {"PRES", "SIZE"}),
  };
  for (const std::string split : {"/train/", "/test/"}) {
    std::vector<double> pixels(24);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<double>(i * 10);
    Object images = numeric(split + d::kImages, Kind::kUint8, {2, 3, 2, 2}, pixels);
    images.chunked = true;
    objects.push_back(images);
    objects.push_back(strings(split + d::kImageNames, {2}, {"a.png", "b.png"}));
    objects.push_back(numeric(split + d::kTokenIds, Kind::kInt32, {4, 4},
                              {2, 3, 4, 5, 2, 3, 0, 0, 2, 1, 0, 0, 2, 5, 4, 3}));
    objects.push_back(numeric(split + d::kAttentionMask, Kind::kUint8, {4, 4},
                              {1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1}));
    objects.push_back(numeric(split + d::kImageRow, Kind::kInt32, {4}, {0, 1, 0, 1}));
    objects.push_back(numeric(split + d::kAnswerType, Kind::kUint8, {4}, {0, 1, 0, 1}));
    objects.push_back(numeric(split + d::kQuestionId, Kind::kInt64, {4}, {1, 2, 3, 4}));
    objects.push_back(numeric(split + d::kQuestionType, Kind::kInt32, {4}, {0, 1, -1, 0}));
    objects.push_back(strings(split + d::kQuestionText, {4}, {"is there a", "is", "a", "there"}));
    objects.push_back(strings(split + d::kAnswerText, {4}, {"yes", "no", "2", "maybe"}));
    objects.push_back(numeric(split + d::kTargetLabels, Kind::kInt32, {4, 1}, {0, 1, 2, -1}));
    objects.push_back(numeric(split + d::kTargetScores, Kind::kFloat32, {4, 1}, {1, 1, 0.5, 0}));
  }
  return objects;
}

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return position_ >= size_; }
  uint8_t byte() { return position_ < size_ ? data_[position_++] : 0; }
  uint64_t u64() {
    uint64_t value = 0;
    for (int i = 0; i < 8; ++i) value = (value << 8) | byte();
    return value;
  }

 private:
  const uint8_t* data_;
  size_t size_, position_ = 0;
};

double interesting_value(uint8_t index) {
  static const double kValues[] = {0,
                                   1,
                                   -1,
                                   2,
                                   3,
                                   4,
                                   5,
                                   6,
                                   7,
                                   127,
                                   128,
                                   255,
                                   256,
                                   65535,
                                   65536,
                                   2147483647.0,
                                   -2147483648.0,
                                   2147483648.0,
                                   4294967296.0,
                                   9007199254740992.0,
                                   -9007199254740992.0,
                                   4096,
                                   4097,
                                   1000000,
                                   1000001,
                                   10000000,
                                   10000001,
                                   64,
                                   65,
                                   16777216,
                                   16777217,
                                   0.5,
                                   -0.5,
                                   1.5,
                                   1e30,
                                   -1e30,
                                   1e-30,
                                   std::numeric_limits<double>::quiet_NaN(),
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity()};
  return kValues[index % (sizeof(kValues) / sizeof(kValues[0]))];
}

int64_t interesting_dimension(uint8_t index) {
  static const int64_t kDimensions[] = {0,
                                        1,
                                        2,
                                        3,
                                        4,
                                        5,
                                        6,
                                        7,
                                        8,
                                        16,
                                        64,
                                        65,
                                        4096,
                                        4097,
                                        int64_t{1} << 20,
                                        int64_t{1} << 31,
                                        int64_t{1} << 40};
  return kDimensions[index % (sizeof(kDimensions) / sizeof(kDimensions[0]))];
}

std::string interesting_string(uint8_t index) {
  static const char* kStrings[] = {"",  "vqa-hpc",  "pixels", "features", "word",
                                   "x", "\xff\xfe", "train",  "<cls>",    "a.png"};
  if (index % 11 == 10) return std::string(300, 'q');
  return kStrings[index % 11 % 10];
}

void apply_edit(std::vector<Object>& objects, Input& input) {
  const uint8_t op = input.byte() % 10;
  Object& object = objects[input.byte() % objects.size()];
  const uint64_t element = input.u64();
  switch (op) {
    case 0:    // one value from the table of edge values
    case 1: {  // one raw value
      if (object.values.empty()) break;
      double& value = object.values[element % object.values.size()];
      if (op == 0) {
        value = interesting_value(input.byte());
      } else {
        const uint64_t bits = input.u64();
        value = is_float(object.kind) ? [&] { double d; std::memcpy(&d, &bits, 8); return d; }()
                                      : static_cast<double>(static_cast<int32_t>(bits));
      }
      break;
    }
    case 2:
      object.present = false;
      break;
    case 3: {  // another dtype; numbers <-> strings lose the values
      const Kind kind = static_cast<Kind>(input.byte() % static_cast<int>(Kind::kCount));
      const bool was_string = is_string(object.kind);
      object.kind = kind;
      if (was_string != is_string(kind)) {
        object.values.clear();
        object.strings.clear();
      }
      object.resize_data();
      break;
    }
    case 4: {  // one dimension
      if (object.shape.empty()) object.shape.push_back(1);
      object.shape[element % object.shape.size()] = interesting_dimension(input.byte());
      object.resize_data();
      break;
    }
    case 5:  // rank
      if (input.byte() & 1 || object.shape.empty()) {
        object.shape.push_back(1 + input.byte() % 3);
      } else {
        object.shape.pop_back();
      }
      object.resize_data();
      break;
    case 6:
      if (!object.strings.empty()) {
        object.strings[element % object.strings.size()] = interesting_string(input.byte());
      }
      break;
    case 7:
      object.chunked = !object.chunked;
      break;
    case 8: {  // pixels -> features of [T, D] per image
      const int64_t tokens = 1 + input.byte() % 4, dim = 1 + input.byte() % 4;
      const Kind kind = input.byte() & 1 ? Kind::kFloat16 : Kind::kFloat32;
      for (Object& o : objects) {
        if (o.name == vqa::data::kAttrImageStorage) o.strings = {"features"};
        if (o.name == vqa::data::kAttrImageSize) o.values = {0};
        const size_t at = o.name.rfind(std::string("/") + vqa::data::kImages);
        if (at != std::string::npos && at + 7 == o.name.size()) {
          o.name = o.name.substr(0, at + 1) + vqa::data::kFeatures;
          o.kind = kind;
          o.shape = {2, tokens, dim};
          o.resize_data();
          for (size_t i = 0; i < o.values.size(); ++i) o.values[i] = 0.25 * static_cast<double>(i);
        }
      }
      break;
    }
    case 9: {  // every question array of a split gets a new row count
      const int64_t rows = interesting_dimension(input.byte());
      const std::string split = input.byte() & 1 ? "/test/" : "/train/";
      for (Object& o : objects) {
        if (o.name.rfind(split + "questions/", 0) == 0 ||
            o.name.rfind(split + "targets/", 0) == 0) {
          if (o.shape.empty()) o.shape.push_back(rows);
          o.shape[0] = rows;
          o.resize_data();
        }
      }
      break;
    }
  }
}

Hdf5Id file_type(Kind kind) {
  switch (kind) {
    case Kind::kInt8:
      return Hdf5Id(H5Tcopy(H5T_STD_I8LE));
    case Kind::kUint8:
      return Hdf5Id(H5Tcopy(H5T_STD_U8LE));
    case Kind::kInt16:
      return Hdf5Id(H5Tcopy(H5T_STD_I16LE));
    case Kind::kInt32:
      return Hdf5Id(H5Tcopy(H5T_STD_I32LE));
    case Kind::kInt64:
      return Hdf5Id(H5Tcopy(H5T_STD_I64LE));
    case Kind::kUint32:
      return Hdf5Id(H5Tcopy(H5T_STD_U32LE));
    case Kind::kFloat16:
      return vqa::data::hdf5_float16_type();
    case Kind::kFloat32:
      return Hdf5Id(H5Tcopy(H5T_IEEE_F32LE));
    case Kind::kFloat64:
      return Hdf5Id(H5Tcopy(H5T_IEEE_F64LE));
    case Kind::kString:
      return vqa::data::hdf5_string_type();
    case Kind::kFixedString: {
      Hdf5Id type(H5Tcopy(H5T_C_S1));
      H5Tset_size(type.get(), 8);
      return type;
    }
    case Kind::kCount:
      break;
  }
  return Hdf5Id();
}

// Writes one object; HDF5 refusing it (an impossible shape) leaves it out.
void write_object(hid_t file, const Object& object) {
  std::vector<hsize_t> dims(object.shape.begin(), object.shape.end());
  std::vector<hsize_t> max_dims = dims;
  if (object.chunked && !dims.empty()) max_dims.assign(dims.size(), H5S_UNLIMITED);
  Hdf5Id space(dims.empty()
                   ? H5Screate(H5S_SCALAR)
                   : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims.data()));
  Hdf5Id type = file_type(object.kind);
  if (!space.valid() || !type.valid()) return;
  Hdf5Id target;
  if (object.attribute) {
    target = Hdf5Id(
        H5Acreate2(file, object.name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  } else {
    Hdf5Id links(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(links.get(), 1);
    Hdf5Id create(H5Pcreate(H5P_DATASET_CREATE));
    if (object.chunked && !dims.empty()) {
      std::vector<hsize_t> chunk(dims.size());
      for (size_t i = 0; i < dims.size(); ++i)
        chunk[i] = i == 0 ? 1 : std::max<hsize_t>(1, std::min<hsize_t>(dims[i], 16));
      H5Pset_chunk(create.get(), static_cast<int>(chunk.size()), chunk.data());
    }
    target = Hdf5Id(H5Dcreate2(file, object.name.c_str(), type.get(), space.get(), links.get(),
                               create.get(), H5P_DEFAULT));
  }
  if (!target.valid() || !object.written || object.count() == 0) return;
  std::vector<const char*> texts;
  std::vector<char> fixed;
  const void* buffer = object.values.data();
  hid_t memory_type = H5T_NATIVE_DOUBLE;
  if (object.kind == Kind::kString) {
    for (const auto& text : object.strings) texts.push_back(text.c_str());
    buffer = texts.data();
    memory_type = type.get();
  } else if (object.kind == Kind::kFixedString) {
    for (const auto& text : object.strings) {
      std::string padded = text.substr(0, 8);
      padded.resize(8, '\0');
      fixed.insert(fixed.end(), padded.begin(), padded.end());
    }
    buffer = fixed.data();
    memory_type = type.get();
  }
  if (object.attribute) {
    H5Awrite(target.get(), memory_type, buffer);
  } else {
    H5Dwrite(target.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = vqa::fuzz::fuzz_scratch_path("edits.h5");
  vqa::data::hdf5_silence_errors();
  std::vector<Object> objects = valid_file();
  Input input(data, size);
  int edits = 0;
  for (; edits < kMaxEdits && !input.empty(); ++edits) apply_edit(objects, input);
  {
    Hdf5Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    vqa::fuzz::fuzz_require(file.valid(), "cannot create " + path);
    for (const Object& object : objects) {
      if (object.present) write_object(file.get(), object);
    }
    vqa::fuzz::fuzz_require(file.reset() >= 0, "cannot close " + path);
  }
  const int accepted = vqa::fuzz::fuzz_exercise_reader(path);
  // The unedited file must pass, or the edits start from a refused file.
  vqa::fuzz::fuzz_require(edits > 0 || accepted == 2, "the unedited file was refused");
  std::remove(path.c_str());
  return 0;
}
