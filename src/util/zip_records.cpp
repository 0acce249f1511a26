#include "util/zip_records.h"

#include <zlib.h>

#include <limits>
#include <stdexcept>

#include "util/durable_file.h"  // crc32_update

namespace vqa::util {

namespace {

constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kEntrySignature = 0x02014b50;
constexpr uint32_t kLocalSignature = 0x04034b50;
constexpr uint32_t kFull32 = 0xffffffff;

// Little-endian fields, each read only after its bounds are checked.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  bool has(uint64_t offset, uint64_t count) const {
    return offset <= bytes_.size() && count <= bytes_.size() - offset;
  }
  uint64_t read(uint64_t offset, int width) const {
    if (!has(offset, static_cast<uint64_t>(width))) fail("a field lies past the end of the file");
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) {
      value = (value << 8) | static_cast<unsigned char>(bytes_[offset + static_cast<uint64_t>(i)]);
    }
    return value;
  }
  uint16_t u16(uint64_t offset) const { return static_cast<uint16_t>(read(offset, 2)); }
  uint32_t u32(uint64_t offset) const { return static_cast<uint32_t>(read(offset, 4)); }
  uint64_t u64(uint64_t offset) const { return read(offset, 8); }
  std::string_view view(uint64_t offset, uint64_t count) const {
    if (!has(offset, count)) fail("a field lies past the end of the file");
    return bytes_.substr(offset, count);
  }
  size_t size() const { return bytes_.size(); }
  [[noreturn]] static void fail(const std::string& what) { throw std::runtime_error(what); }

 private:
  std::string_view bytes_;
};

struct Directory {
  uint64_t entries = 0;
  uint64_t offset = 0;
};

Directory find_directory(const Reader& zip) {
  // The end record is the last 22 bytes, before a comment of up to 65,535.
  if (zip.size() < 22) Reader::fail("is too short for a zip file");
  const uint64_t last = zip.size() - 22;
  const uint64_t first = last > 65535 ? last - 65535 : 0;
  for (uint64_t at = last + 1; at-- > first;) {
    if (zip.u32(at) != kEndSignature || at + 22 + zip.u16(at + 20) != zip.size()) continue;
    Directory directory{zip.u16(at + 10), zip.u32(at + 16)};
    if (at >= 20 && zip.u32(at - 20) == kZip64LocatorSignature) {
      const uint64_t end64 = zip.u64(at - 20 + 8);
      if (zip.u32(end64) != kZip64EndSignature) Reader::fail("has a damaged zip64 end record");
      directory = Directory{zip.u64(end64 + 32), zip.u64(end64 + 48)};
    }
    return directory;
  }
  Reader::fail("has no end of central directory record (not a zip file)");
}

// Sizes and the offset that did not fit 32 bits are in the zip64 extra field.
void read_zip64_extra(const Reader& zip, uint64_t extra, uint64_t extra_end, ZipRecord& record,
                      uint64_t& local_offset) {
  while (extra + 4 <= extra_end) {
    const uint16_t id = zip.u16(extra);
    const uint64_t length = zip.u16(extra + 2);
    uint64_t field = extra + 4;
    if (field + length > extra_end)
      Reader::fail("record " + record.name + " has a damaged extra field");
    if (id == 0x0001) {
      for (uint64_t* value : {&record.size, &record.compressed, &local_offset}) {
        if (*value != kFull32) continue;
        if (field + 8 > extra + 4 + length) {
          Reader::fail("record " + record.name + " has a short zip64 extra field");
        }
        *value = zip.u64(field);
        field += 8;
      }
    }
    extra += 4 + length;
  }
}

}  // namespace

std::vector<ZipRecord> zip_records(std::string_view bytes) {
  const Reader zip(bytes);
  const Directory directory = find_directory(zip);
  std::vector<ZipRecord> records;
  uint64_t at = directory.offset;
  for (uint64_t i = 0; i < directory.entries; ++i) {
    if (zip.u32(at) != kEntrySignature) {
      Reader::fail("has a damaged central directory at entry " + std::to_string(i));
    }
    ZipRecord record;
    record.method = zip.u16(at + 10);
    record.crc32 = zip.u32(at + 16);
    record.compressed = zip.u32(at + 20);
    record.size = zip.u32(at + 24);
    const uint64_t name_length = zip.u16(at + 28);
    const uint64_t extra_length = zip.u16(at + 30);
    const uint64_t comment_length = zip.u16(at + 32);
    uint64_t local = zip.u32(at + 42);
    record.name = std::string(zip.view(at + 46, name_length));
    const uint64_t extra = at + 46 + name_length;
    read_zip64_extra(zip, extra, extra + extra_length, record, local);
    at = extra + extra_length + comment_length;
    if (zip.u32(local) != kLocalSignature) {
      Reader::fail("record " + record.name + " has no local header where the directory says");
    }
    record.data_offset = local + 30 + zip.u16(local + 26) + zip.u16(local + 28);
    if (!zip.has(record.data_offset, record.compressed)) {
      Reader::fail("record " + record.name + " ends past the end of the file");
    }
    records.push_back(std::move(record));
  }
  return records;
}

std::string zip_record_bytes(std::string_view bytes, const ZipRecord& record) {
  const std::string_view data = Reader(bytes).view(record.data_offset, record.compressed);
  if (record.size > std::numeric_limits<uInt>::max() ||
      record.compressed > std::numeric_limits<uInt>::max()) {
    Reader::fail("record " + record.name + " is too large to check");
  }
  std::string out;
  if (record.method == 0) {
    if (record.compressed != record.size) {
      Reader::fail("record " + record.name + " is stored with two different sizes");
    }
    out = std::string(data);
  } else if (record.method == 8) {
    // Deflate expands at most about 1,032 to 1: a larger size is a lie that
    // must not become an allocation.
    if (record.size / 1032 > record.compressed + 1) {
      Reader::fail("record " + record.name + " claims " + std::to_string(record.size) +
                   " bytes from " + std::to_string(record.compressed) + " compressed");
    }
    out.resize(record.size);
    z_stream stream{};
    if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) Reader::fail("zlib cannot start inflating");
    stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    stream.avail_in = static_cast<uInt>(data.size());
    stream.next_out = reinterpret_cast<Bytef*>(out.data());
    stream.avail_out = static_cast<uInt>(out.size());
    const int status = inflate(&stream, Z_FINISH);
    const uint64_t produced = stream.total_out;
    inflateEnd(&stream);
    if (status != Z_STREAM_END || produced != record.size) {
      Reader::fail("record " + record.name + " has a damaged deflate stream");
    }
  } else {
    Reader::fail("record " + record.name + " uses compression method " +
                 std::to_string(record.method) + ", not stored or deflate");
  }
  if (crc32_update(0, out.data(), out.size()) != record.crc32)
    Reader::fail("record " + record.name + " fails its CRC-32");
  return out;
}

}  // namespace vqa::util
