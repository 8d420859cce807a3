// Reads a trace file in chunks, plain or gzip-compressed (recognised by its magic bytes, not its
// name), so a trace of any length is parsed in constant memory.
//
// Concatenated gzip members (`cat a.gz b.gz`) are read as one stream, as gzip(1) does.
//
// Thread safety: not thread-safe. Errors: absl::Status whose message starts with the path;
// kNotFound/kPermissionDenied for files that cannot be opened, kDataLoss for corrupt or truncated
// compressed data.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace vramscope::cli {

class TraceFile {
 public:
  static absl::StatusOr<std::unique_ptr<TraceFile>> Open(const std::string& path);
  ~TraceFile();
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  // The next chunk of decompressed bytes, valid until the next call; empty at the end of the file.
  absl::StatusOr<std::string_view> Next();

  bool compressed() const { return compressed_; }
  // Bytes of the file consumed so far and its total size (0 if unknown): for a progress bar.
  std::uint64_t file_bytes_read() const { return file_bytes_read_; }
  std::uint64_t file_size() const { return file_size_; }

 private:
  struct Inflater;
  TraceFile(std::string path, std::FILE* file, std::uint64_t file_size);
  absl::StatusOr<std::string_view> NextCompressed();
  absl::Status ReadInput();

  std::string path_;
  std::FILE* file_;
  std::uint64_t file_size_;
  std::uint64_t file_bytes_read_ = 0;
  bool compressed_ = false;
  bool input_eof_ = false;
  std::vector<char> input_;
  std::size_t input_begin_ = 0;  // unconsumed input is [input_begin_, input_end_)
  std::size_t input_end_ = 0;
  std::vector<char> output_;
  std::unique_ptr<Inflater> inflater_;
};

}  // namespace vramscope::cli
