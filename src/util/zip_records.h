// The records of a zip file held in memory, read from its central directory
// (PKWARE's APPNOTE: the end record, zip64's end record and extra field), and
// a record's bytes inflated with zlib and checked against its CRC-32.
//
// LibTorch reads its archives with miniz built without CRC checks: a damaged
// deflate stream gives it a buffer of whatever the allocator held, without an
// error. Before LibTorch parses an archive's source and pickles, the
// checkpoint loader (train/checkpoint_archive.h) reads them here, where a
// damaged record is an error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vqa::util {

struct ZipRecord {
  std::string name;          // as stored, e.g. "archive/code/__torch__.py"
  uint16_t method = 0;       // 0 stored, 8 deflate
  uint32_t crc32 = 0;        // of the uncompressed bytes
  uint64_t compressed = 0;   // bytes in the file
  uint64_t size = 0;         // bytes once uncompressed
  uint64_t data_offset = 0;  // where the record's bytes start in the file
};

// Every record of the zip in `bytes`, in the central directory's order.
// Throws std::runtime_error saying what is wrong ("no end of central
// directory record", "record 12 ends past the end of the file", ...).
std::vector<ZipRecord> zip_records(std::string_view bytes);

// The record's uncompressed bytes. Throws std::runtime_error when the method
// is neither stored nor deflate, the stream is damaged, or the size or the
// CRC-32 differs from the directory's.
std::string zip_record_bytes(std::string_view bytes, const ZipRecord& record);

}  // namespace vqa::util
