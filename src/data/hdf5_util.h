// Small layer over the HDF5 C API for the data path (reader and prep tool):
// an owning handle and typed helpers that throw DataFormatError naming the
// file, the object and the value. Internal to src/data and data_prep; the
// public loader header keeps hdf5.h out. Needs only HDF5: no LibTorch, no
// MPI start-up, so tools and fuzz targets can link it alone.
//
// Why these throw instead of using VQA_CHECK_HDF5 (which ends the job): the
// file is user input. The loader must report a bad file the same way on every
// rank, and the prep tool must remove its temporary output before it exits.
//
// Not thread-safe (neither is this HDF5 build): one thread at a time.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace vqa::data {

// Owns one HDF5 identifier of any kind and closes it with the matching call.
class Hdf5Id {
 public:
  Hdf5Id() = default;
  explicit Hdf5Id(hid_t id) : id_(id) {}
  ~Hdf5Id() { reset(); }
  Hdf5Id(Hdf5Id&& other) noexcept : id_(other.id_) { other.id_ = -1; }
  Hdf5Id& operator=(Hdf5Id&& other) noexcept;
  Hdf5Id(const Hdf5Id&) = delete;
  Hdf5Id& operator=(const Hdf5Id&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns the close call's status (negative on failure). A
  // destructor cannot report it, so code that must know (H5Fclose after
  // writing) calls this first.
  herr_t reset();

 private:
  hid_t id_ = -1;
};

// Turns off HDF5's automatic error-stack printing: the data path probes for
// objects and reports failures in its own words.
void hdf5_silence_errors();

// "0", "0.25", "nan", "1e-30" for messages (std::to_string gives
// "0.000000", also for 1e-30).
std::string number_text(double value);

// Throws DataFormatError "<path>: <what> failed: <HDF5 error stack>" when rc < 0.
void hdf5_try(int64_t rc, const char* what, const std::string& path);

bool hdf5_exists(hid_t location, const std::string& name);
// Opens a dataset; throws "<path>: dataset '<name>' is missing" when absent.
Hdf5Id hdf5_open_dataset(hid_t location, const std::string& name, const std::string& path);
std::vector<int64_t> hdf5_shape(hid_t dataset, const std::string& name, const std::string& path);

// The stored element kind, for dtype checks and messages.
struct Hdf5ElementType {
  H5T_class_t type_class = H5T_NO_CLASS;
  size_t size = 0;
  bool is_signed = false;
  bool variable_string = false;
  std::string describe() const;  // "int32", "uint8", "float16", "string", ...
};
Hdf5ElementType hdf5_element_type(hid_t dataset_or_attribute, bool is_attribute,
                                  const std::string& name, const std::string& path);

// Attributes of an object (the file root is `hid_t file`).
int64_t hdf5_read_int_attribute(hid_t object, const std::string& name, const std::string& path);
std::vector<double> hdf5_read_double_attribute(hid_t object, const std::string& name,
                                               const std::string& path);
std::string hdf5_read_string_attribute(hid_t object, const std::string& name,
                                       const std::string& path);
void hdf5_write_int_attribute(hid_t object, const std::string& name, int64_t value,
                              const std::string& path);
void hdf5_write_double_attribute(hid_t object, const std::string& name,
                                 const std::vector<double>& values, const std::string& path);
void hdf5_write_string_attribute(hid_t object, const std::string& name, const std::string& value,
                                 const std::string& path);

// A variable-length UTF-8 string type (caller owns it). Both throw
// std::runtime_error if HDF5 itself fails.
Hdf5Id hdf5_string_type();
// IEEE half precision, little endian (HDF5 1.10 has no predefined one).
Hdf5Id hdf5_float16_type();

// Rows [first, first + count) of a 1-D variable-length string dataset.
std::vector<std::string> hdf5_read_strings(hid_t dataset, int64_t first, int64_t count,
                                           const std::string& name, const std::string& path);

// A file-space selection of whole rows `rows` (sorted, unique) of a dataset
// whose other dimensions are `row_shape`; returns {file space, memory space}.
struct Hdf5RowSelection {
  Hdf5Id file_space;
  Hdf5Id memory_space;
};
Hdf5RowSelection hdf5_select_rows(hid_t dataset, const std::vector<int64_t>& rows,
                                  const std::string& name, const std::string& path);

// Whole rows `sorted_rows` (sorted, unique, in range) of a dataset whose rows
// hold row_elements values each, converted to memory_type (matching T).
template <typename T>
std::vector<T> hdf5_read_rows(hid_t dataset, hid_t memory_type,
                              const std::vector<int64_t>& sorted_rows, int64_t row_elements,
                              const std::string& name, const std::string& path) {
  std::vector<T> values(sorted_rows.size() * static_cast<size_t>(row_elements));
  if (sorted_rows.empty()) return values;
  Hdf5RowSelection selection = hdf5_select_rows(dataset, sorted_rows, name, path);
  hdf5_try(H5Dread(dataset, memory_type, selection.memory_space.get(), selection.file_space.get(),
                   H5P_DEFAULT, values.data()),
           ("H5Dread('" + name + "')").c_str(), path);
  return values;
}

}  // namespace vqa::data
