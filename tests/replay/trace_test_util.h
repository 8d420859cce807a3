// Helpers shared by the replay tests: temporary files, gzip in memory, the bundled traces.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

namespace vramscope::cli::testing {

// A file under the test's temporary directory, removed when the object dies.
class TempFile {
 public:
  TempFile(std::string_view name, std::string_view contents)
      : path_(::testing::TempDir() + "/" + std::to_string(getpid()) + "_" + std::string(name)) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// `text` as one gzip member (what gzip(1) writes).
inline std::string Gzip(std::string_view text) {
  z_stream stream{};
  // 16 + MAX_WBITS: a gzip wrapper rather than zlib's.
  EXPECT_EQ(deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8,
                         Z_DEFAULT_STRATEGY),
            Z_OK);
  std::string out(deflateBound(&stream, text.size()) + 64, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  stream.avail_in = static_cast<uInt>(text.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

// The decompressed text of a bundled trace (traces/NAME.csv.gz); the directory comes from the
// VRAMSCOPE_TRACES_DIR environment variable that tests/replay/meson.build sets.
inline std::string TracesDir() {
  const char* dir = std::getenv("VRAMSCOPE_TRACES_DIR");
  return dir != nullptr ? dir : "traces";
}

inline std::string ReadBundledTrace(std::string_view name) {
  const std::string path = TracesDir() + "/" + std::string(name) + ".csv.gz";
  gzFile file = gzopen(path.c_str(), "rb");
  EXPECT_NE(file, nullptr) << path;
  if (file == nullptr) return "";
  std::string text;
  char buffer[1 << 16];
  int got = 0;
  while ((got = gzread(file, buffer, sizeof buffer)) > 0) text.append(buffer, got);
  gzclose(file);
  return text;
}

}  // namespace vramscope::cli::testing
