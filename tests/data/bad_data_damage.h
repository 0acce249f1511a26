// The damage test_bad_data_ranks.cpp does to copies of a good dataset file,
// one HDF5 edit (or byte edit) each, as corruption or a foreign writer would.
// Included by that one test only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "data/dataset_format.h"  // dataset and attribute names
#include "data/hdf5_util.h"       // Hdf5Id, hdf5_write_*_attribute

namespace {

using vqa::data::Hdf5Id;

void with_file(const std::string& path, const std::function<void(hid_t)>& edit) {
  vqa::data::hdf5_silence_errors();
  Hdf5Id file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  ASSERT_TRUE(file.valid()) << path;
  edit(file.get());
  ASSERT_GE(file.reset(), 0) << path;
}

void delete_object(hid_t file, const std::string& name) {
  ASSERT_GE(H5Ldelete(file, name.c_str(), H5P_DEFAULT), 0) << name;
}

void set_int_attribute(hid_t file, const std::string& name, int64_t value) {
  ASSERT_GE(H5Adelete(file, name.c_str()), 0) << name;
  vqa::data::hdf5_write_int_attribute(file, name, value, "damaged file");
}

// Writes `value` at element [row, column] of a numeric dataset (converted by
// HDF5 from memory_type: the stored type stays).
template <typename T>
void set_element(hid_t file, const std::string& name, int64_t row, int64_t column, T value,
                 hid_t memory_type) {
  Hdf5Id dataset(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
  ASSERT_TRUE(dataset.valid()) << name;
  Hdf5Id space(H5Dget_space(dataset.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  const hsize_t start[2] = {static_cast<hsize_t>(row), static_cast<hsize_t>(column)};
  const hsize_t count[2] = {1, 1};
  ASSERT_GE(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), 0);
  const hsize_t one = 1;
  Hdf5Id memory(H5Screate_simple(1, &one, nullptr));
  ASSERT_GE(H5Dwrite(dataset.get(), memory_type, memory.get(), space.get(), H5P_DEFAULT, &value), 0)
      << name << " rank " << rank;
}

// Replaces a dataset by one of another dtype or shape (zeros).
void replace_dataset(hid_t file, const std::string& name, hid_t type,
                     const std::vector<hsize_t>& shape) {
  delete_object(file, name);
  Hdf5Id space(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr));
  Hdf5Id dataset(
      H5Dcreate2(file, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_TRUE(dataset.valid()) << name;
}

// Flips two bytes in the middle of every stored chunk of a chunked dataset
// (a file with checksums: h5repack -f NAME:FLET), as a bad disk or copy would.
void damage_every_chunk(const std::string& path, const std::string& name) {
  std::vector<std::pair<haddr_t, hsize_t>> chunks;
  {
    vqa::data::hdf5_silence_errors();
    Hdf5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    Hdf5Id dataset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT));
    Hdf5Id space(H5Dget_space(dataset.get()));
    hsize_t count = 0;
    ASSERT_GE(H5Dget_num_chunks(dataset.get(), space.get(), &count), 0) << name;
    ASSERT_GT(count, 0u) << name;
    for (hsize_t i = 0; i < count; ++i) {
      hsize_t offset[4];
      unsigned filter_mask = 0;
      haddr_t address = 0;
      hsize_t size = 0;
      ASSERT_GE(
          H5Dget_chunk_info(dataset.get(), space.get(), i, offset, &filter_mask, &address, &size),
          0);
      chunks.emplace_back(address, size);
    }
  }
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  for (const auto& [address, size] : chunks) {
    file.seekp(static_cast<std::streamoff>(address + size / 2));
    file.put('\x5a');
    file.put('\xa5');
  }
  ASSERT_TRUE(file.good()) << path;
}

}  // namespace
