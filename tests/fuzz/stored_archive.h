// A LibTorch archive rewritten by LibTorch's own zip writer with every record
// stored (not deflated) and every zip checksum matching its bytes: the form in
// which the checkpoint fuzz target's mutations of class source, pickles and
// tensors reach the loader's checks (and, past them, LibTorch's parsers)
// instead of stopping at a CRC-32 that no longer matches.
#pragma once

#include <caffe2/serialize/inline_container.h>

#include <stdexcept>
#include <string>

#include "util/zip_records.h"  // zip_records, zip_record_bytes

namespace vqa::fuzz {

// `bytes` unchanged when they are not a zip that zip_records reads.
inline std::string stored_archive(const std::string& bytes) {
  std::vector<util::ZipRecord> records;
  try {
    records = util::zip_records(bytes);
  } catch (const std::runtime_error&) {
    return bytes;
  }
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  for (const util::ZipRecord& record : records) {
    const std::string name = record.name.substr(record.name.find('/') + 1);
    // The writer adds these itself; a second one would make a duplicate.
    if (name.empty() || name == "version" || name == "byteorder" || name.rfind(".data/", 0) == 0) {
      continue;
    }
    std::string contents = bytes.substr(record.data_offset, record.compressed);
    if (record.method != 0) {
      try {
        contents = util::zip_record_bytes(bytes, record);
      } catch (const std::runtime_error&) {
      }
    }
    try {
      writer.writeRecord(name, contents.data(), contents.size(), /*compress=*/false);
    } catch (const c10::Error&) {  // a name the writer refuses (a duplicate)
    }
  }
  writer.writeEndOfFile();
  return out;
}

}  // namespace vqa::fuzz
