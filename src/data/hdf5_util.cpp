#include "data/hdf5_util.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "data/dataset_format.h"  // DataFormatError
#include "util/hdf5_error.h"      // hdf5_error_stack

namespace vqa::data {

Hdf5Id& Hdf5Id::operator=(Hdf5Id&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    other.id_ = -1;
  }
  return *this;
}

herr_t Hdf5Id::reset() {
  if (id_ < 0) return 0;
  herr_t rc = -1;
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      rc = H5Fclose(id_);
      break;
    case H5I_GROUP:
      rc = H5Gclose(id_);
      break;
    case H5I_DATASET:
      rc = H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      rc = H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      rc = H5Tclose(id_);
      break;
    case H5I_ATTR:
      rc = H5Aclose(id_);
      break;
    case H5I_GENPROP_LST:
      rc = H5Pclose(id_);
      break;
    default:
      rc = -1;
      break;
  }
  id_ = -1;
  return rc;
}

void hdf5_silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {
// For HDF5 calls that involve no file (types): they fail only when the library does.
void hdf5_require(int64_t rc, const char* what) {
  if (rc < 0)
    throw std::runtime_error(std::string("HDF5: ") + what + " failed: " + util::hdf5_error_stack());
}
}  // namespace

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", value);
  return text;
}

void hdf5_try(int64_t rc, const char* what, const std::string& path) {
  if (rc < 0) {
    throw DataFormatError(path + ": " + what + " failed: " + util::hdf5_error_stack());
  }
}

bool hdf5_exists(hid_t location, const std::string& name) {
  // H5Lexists fails (rather than answering false) when an intermediate group
  // is missing, so walk the path one component at a time.
  std::string prefix = name.rfind('/', 0) == 0 ? "/" : "";
  size_t start = prefix.size();
  while (start <= name.size()) {
    const size_t end = name.find('/', start);
    const std::string component = name.substr(start, end - start);
    if (!component.empty()) {
      prefix += component;
      if (H5Lexists(location, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      if (H5Oexists_by_name(location, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      prefix += "/";
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return true;
}

Hdf5Id hdf5_open_dataset(hid_t location, const std::string& name, const std::string& path) {
  if (!hdf5_exists(location, name)) {
    throw DataFormatError(path + ": dataset '" + name + "' is missing");
  }
  Hdf5Id dataset(H5Dopen2(location, name.c_str(), H5P_DEFAULT));
  if (!dataset.valid()) {
    throw DataFormatError(path + ": '" + name +
                          "' is not a readable dataset: " + util::hdf5_error_stack());
  }
  return dataset;
}

std::vector<int64_t> hdf5_shape(hid_t dataset, const std::string& name, const std::string& path) {
  Hdf5Id space(H5Dget_space(dataset));
  hdf5_try(space.get(), ("H5Dget_space('" + name + "')").c_str(), path);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  hdf5_try(rank, ("H5Sget_simple_extent_ndims('" + name + "')").c_str(), path);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  hdf5_try(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr),
           "H5Sget_simple_extent_dims", path);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

std::string Hdf5ElementType::describe() const {
  switch (type_class) {
    case H5T_INTEGER:
      return (is_signed ? "int" : "uint") + std::to_string(8 * size);
    case H5T_FLOAT:
      return "float" + std::to_string(8 * size);
    case H5T_STRING:
      return variable_string ? "string" : "fixed-length string";
    default:
      return "HDF5 type class " + std::to_string(static_cast<int>(type_class));
  }
}

Hdf5ElementType hdf5_element_type(hid_t object, bool is_attribute, const std::string& name,
                                  const std::string& path) {
  Hdf5Id type(is_attribute ? H5Aget_type(object) : H5Dget_type(object));
  hdf5_try(type.get(), ("reading the type of '" + name + "'").c_str(), path);
  Hdf5ElementType result;
  result.type_class = H5Tget_class(type.get());
  result.size = H5Tget_size(type.get());
  if (result.type_class == H5T_INTEGER) result.is_signed = H5Tget_sign(type.get()) == H5T_SGN_2;
  if (result.type_class == H5T_STRING) result.variable_string = H5Tis_variable_str(type.get()) > 0;
  return result;
}

namespace {

// An attribute that HDF5 fails to look up or read: the header or the global
// heap that holds it is damaged (HDF5 1.14 reports what HDF5 1.10 can crash
// on, tests/fuzz/hdf5_crashes).
void attribute_try(int64_t rc, const std::string& name, const std::string& path) {
  if (rc < 0) {
    throw DataFormatError(
        path + ": attribute '" + name +
        "': cannot be read (the file is most likely damaged): " + util::hdf5_error_stack());
  }
}

Hdf5Id open_attribute(hid_t object, const std::string& name, const std::string& path) {
  const htri_t exists = H5Aexists(object, name.c_str());
  attribute_try(exists, name, path);  // an error is not an absence
  if (exists == 0) throw DataFormatError(path + ": attribute '" + name + "' is missing");
  Hdf5Id attribute(H5Aopen(object, name.c_str(), H5P_DEFAULT));
  attribute_try(attribute.get(), name, path);
  return attribute;
}

int64_t attribute_elements(hid_t attribute, const std::string& name, const std::string& path) {
  Hdf5Id space(H5Aget_space(attribute));
  hdf5_try(space.get(), ("H5Aget_space('" + name + "')").c_str(), path);
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  hdf5_try(count, "H5Sget_simple_extent_npoints", path);
  return count;
}

}  // namespace

int64_t hdf5_read_int_attribute(hid_t object, const std::string& name, const std::string& path) {
  Hdf5Id attribute = open_attribute(object, name, path);
  const Hdf5ElementType type = hdf5_element_type(attribute.get(), true, name, path);
  const int64_t count = attribute_elements(attribute.get(), name, path);
  if (type.type_class != H5T_INTEGER || count != 1) {
    throw DataFormatError(path + ": attribute '" + name + "' must be one integer, found " +
                          std::to_string(count) + " x " + type.describe());
  }
  int64_t value = 0;
  attribute_try(H5Aread(attribute.get(), H5T_NATIVE_INT64, &value), name, path);
  return value;
}

std::vector<double> hdf5_read_double_attribute(hid_t object, const std::string& name,
                                               const std::string& path) {
  Hdf5Id attribute = open_attribute(object, name, path);
  const Hdf5ElementType type = hdf5_element_type(attribute.get(), true, name, path);
  const int64_t count = attribute_elements(attribute.get(), name, path);
  if ((type.type_class != H5T_FLOAT && type.type_class != H5T_INTEGER) || count > 1024) {
    throw DataFormatError(path + ": attribute '" + name +
                          "' must be a short list of numbers, found " + std::to_string(count) +
                          " x " + type.describe());
  }
  std::vector<double> values(static_cast<size_t>(count));
  attribute_try(H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, values.data()), name, path);
  return values;
}

std::string hdf5_read_string_attribute(hid_t object, const std::string& name,
                                       const std::string& path) {
  Hdf5Id attribute = open_attribute(object, name, path);
  const Hdf5ElementType type = hdf5_element_type(attribute.get(), true, name, path);
  if (type.type_class != H5T_STRING || !type.variable_string ||
      attribute_elements(attribute.get(), name, path) != 1) {
    throw DataFormatError(path + ": attribute '" + name +
                          "' must be one variable-length string, found " + type.describe());
  }
  Hdf5Id memory_type = hdf5_string_type();
  char* text = nullptr;
  attribute_try(H5Aread(attribute.get(), memory_type.get(), &text), name, path);
  std::string value = text ? text : "";
  H5free_memory(text);
  return value;
}

namespace {
Hdf5Id create_attribute(hid_t object, const std::string& name, hid_t type, hsize_t count,
                        const std::string& path) {
  Hdf5Id space(count == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &count, nullptr));
  hdf5_try(space.get(), "H5Screate", path);
  Hdf5Id attribute(H5Acreate2(object, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  hdf5_try(attribute.get(), ("H5Acreate2('" + name + "')").c_str(), path);
  return attribute;
}
}  // namespace

void hdf5_write_int_attribute(hid_t object, const std::string& name, int64_t value,
                              const std::string& path) {
  Hdf5Id attribute = create_attribute(object, name, H5T_STD_I64LE, 0, path);
  hdf5_try(H5Awrite(attribute.get(), H5T_NATIVE_INT64, &value),
           ("H5Awrite('" + name + "')").c_str(), path);
}

void hdf5_write_double_attribute(hid_t object, const std::string& name,
                                 const std::vector<double>& values, const std::string& path) {
  Hdf5Id attribute = create_attribute(object, name, H5T_IEEE_F64LE, values.size(), path);
  hdf5_try(H5Awrite(attribute.get(), H5T_NATIVE_DOUBLE, values.data()),
           ("H5Awrite('" + name + "')").c_str(), path);
}

void hdf5_write_string_attribute(hid_t object, const std::string& name, const std::string& value,
                                 const std::string& path) {
  Hdf5Id type = hdf5_string_type();
  Hdf5Id attribute = create_attribute(object, name, type.get(), 0, path);
  const char* text = value.c_str();
  hdf5_try(H5Awrite(attribute.get(), type.get(), &text), ("H5Awrite('" + name + "')").c_str(),
           path);
}

Hdf5Id hdf5_string_type() {
  Hdf5Id type(H5Tcopy(H5T_C_S1));
  hdf5_require(type.get(), "H5Tcopy(H5T_C_S1)");
  hdf5_require(H5Tset_size(type.get(), H5T_VARIABLE), "H5Tset_size");
  hdf5_require(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset");
  return type;
}

Hdf5Id hdf5_float16_type() {
  // The same layout h5py and NumPy use for float16: 1 sign, 5 exponent and
  // 10 mantissa bits, exponent bias 15.
  Hdf5Id type(H5Tcopy(H5T_IEEE_F32LE));
  hdf5_require(type.get(), "H5Tcopy(H5T_IEEE_F32LE)");
  hdf5_require(H5Tset_fields(type.get(), 15, 10, 5, 0, 10), "H5Tset_fields");
  hdf5_require(H5Tset_size(type.get(), 2), "H5Tset_size");
  hdf5_require(H5Tset_ebias(type.get(), 15), "H5Tset_ebias");
  return type;
}

std::vector<std::string> hdf5_read_strings(hid_t dataset, int64_t first, int64_t count,
                                           const std::string& name, const std::string& path) {
  std::vector<std::string> result;
  if (count <= 0) return result;
  const Hdf5ElementType type = hdf5_element_type(dataset, false, name, path);
  if (type.type_class != H5T_STRING || !type.variable_string) {
    throw DataFormatError(path + ": dataset '" + name +
                          "' must hold variable-length strings, found " + type.describe());
  }
  Hdf5Id file_space(H5Dget_space(dataset));
  hdf5_try(file_space.get(), "H5Dget_space", path);
  const hsize_t start = static_cast<hsize_t>(first), block = static_cast<hsize_t>(count);
  hdf5_try(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &block, nullptr),
           ("selecting rows of '" + name + "'").c_str(), path);
  Hdf5Id memory_space(H5Screate_simple(1, &block, nullptr));
  hdf5_try(memory_space.get(), "H5Screate_simple", path);
  Hdf5Id memory_type = hdf5_string_type();
  std::vector<char*> texts(static_cast<size_t>(count), nullptr);
  const herr_t status = H5Dread(dataset, memory_type.get(), memory_space.get(), file_space.get(),
                                H5P_DEFAULT, texts.data());
  // A read that fails part way (a damaged string heap) has already allocated
  // some strings: free them too, after taking the error text (the next HDF5
  // call clears the error stack).
  const std::string error = status < 0 ? util::hdf5_error_stack() : "";
  if (status >= 0) {
    result.reserve(texts.size());
    for (char* text : texts) result.emplace_back(text ? text : "");
  }
  H5Dvlen_reclaim(memory_type.get(), memory_space.get(), H5P_DEFAULT, texts.data());
  if (status < 0) throw DataFormatError(path + ": H5Dread('" + name + "') failed: " + error);
  return result;
}

Hdf5RowSelection hdf5_select_rows(hid_t dataset, const std::vector<int64_t>& rows,
                                  const std::string& name, const std::string& path) {
  const std::vector<int64_t> shape = hdf5_shape(dataset, name, path);
  Hdf5RowSelection selection;
  selection.file_space = Hdf5Id(H5Dget_space(dataset));
  hdf5_try(selection.file_space.get(), "H5Dget_space", path);
  std::vector<hsize_t> start(shape.size(), 0), count(shape.begin(), shape.end());
  hdf5_try(H5Sselect_none(selection.file_space.get()), "H5Sselect_none", path);
  // Consecutive rows become one hyperslab: fewer, larger reads.
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    start[0] = static_cast<hsize_t>(rows[i]);
    count[0] = static_cast<hsize_t>(j - i);
    hdf5_try(H5Sselect_hyperslab(selection.file_space.get(), H5S_SELECT_OR, start.data(), nullptr,
                                 count.data(), nullptr),
             ("selecting rows of '" + name + "'").c_str(), path);
    i = j;
  }
  std::vector<hsize_t> memory_shape(shape.begin(), shape.end());
  memory_shape[0] = rows.size();
  selection.memory_space =
      Hdf5Id(H5Screate_simple(static_cast<int>(memory_shape.size()), memory_shape.data(), nullptr));
  hdf5_try(selection.memory_space.get(), "H5Screate_simple", path);
  return selection;
}

}  // namespace vqa::data
