#include "replay/trace_file.h"

#include <absl/strings/str_format.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace vramscope::cli {
namespace {

constexpr std::size_t kInputBytes = std::size_t{256} * 1024;
constexpr std::size_t kOutputBytes = std::size_t{1024} * 1024;

bool HasGzipMagic(const char* bytes, std::size_t size) {
  return size >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

absl::Status ErrnoError(int error, std::string_view path, std::string_view what) {
  std::string message = absl::StrFormat("%s: %s: %s", path, what, std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::UnavailableError(message);
  }
}

}  // namespace

struct TraceFile::Inflater {
  z_stream stream{};
  bool initialised = false;
  bool member_ended = false;  // between two gzip members (or after the last one)
  ~Inflater() {
    if (initialised) inflateEnd(&stream);
  }
};

absl::StatusOr<std::unique_ptr<TraceFile>> TraceFile::Open(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return ErrnoError(errno, path, "cannot open");
  struct stat info {};
  if (fstat(fileno(file), &info) != 0) {
    int error = errno;
    std::fclose(file);
    return ErrnoError(error, path, "cannot stat");
  }
  if (S_ISDIR(info.st_mode)) {
    std::fclose(file);
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: is a directory, not a trace file", path));
  }
  std::uint64_t size = S_ISREG(info.st_mode) ? static_cast<std::uint64_t>(info.st_size) : 0;
  std::unique_ptr<TraceFile> trace(new TraceFile(path, file, size));
  absl::Status status = trace->ReadInput();
  if (!status.ok()) return status;
  trace->compressed_ = HasGzipMagic(trace->input_.data(), trace->input_end_);
  if (trace->compressed_) {
    trace->inflater_ = std::make_unique<Inflater>();
    // 16 + MAX_WBITS: gzip wrapper only, with its CRC and length checked at the end.
    if (inflateInit2(&trace->inflater_->stream, 16 + MAX_WBITS) != Z_OK) {
      return absl::ResourceExhaustedError(absl::StrFormat("%s: cannot initialise zlib", path));
    }
    trace->inflater_->initialised = true;
    trace->output_.resize(kOutputBytes);
  }
  return trace;
}

TraceFile::TraceFile(std::string path, std::FILE* file, std::uint64_t file_size)
    : path_(std::move(path)), file_(file), file_size_(file_size), input_(kInputBytes) {}

TraceFile::~TraceFile() { std::fclose(file_); }

absl::Status TraceFile::ReadInput() {
  if (input_begin_ > 0) {
    std::memmove(input_.data(), input_.data() + input_begin_, input_end_ - input_begin_);
    input_end_ -= input_begin_;
    input_begin_ = 0;
  }
  while (!input_eof_ && input_end_ < input_.size()) {
    std::size_t got = std::fread(input_.data() + input_end_, 1, input_.size() - input_end_, file_);
    input_end_ += got;
    file_bytes_read_ += got;
    if (got == 0) {
      if (std::ferror(file_)) return ErrnoError(errno, path_, "read error");
      input_eof_ = true;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string_view> TraceFile::Next() {
  if (compressed_) return NextCompressed();
  if (input_begin_ == input_end_) {
    if (input_eof_) return std::string_view();
    absl::Status status = ReadInput();
    if (!status.ok()) return status;
  }
  std::string_view chunk(input_.data() + input_begin_, input_end_ - input_begin_);
  input_begin_ = input_end_;
  return chunk;
}

absl::StatusOr<std::string_view> TraceFile::NextCompressed() {
  Inflater& z = *inflater_;
  while (true) {
    if (input_end_ - input_begin_ < 2 && !input_eof_) {
      absl::Status status = ReadInput();
      if (!status.ok()) return status;
    }
    std::size_t available = input_end_ - input_begin_;
    if (z.member_ended) {
      if (available == 0) return std::string_view();  // a clean end after a whole member
      if (!HasGzipMagic(input_.data() + input_begin_, available)) {
        return absl::DataLossError(
            absl::StrFormat("%s: trailing garbage after the end of the gzip stream", path_));
      }
      inflateReset(&z.stream);  // another member follows (concatenated .gz files)
      z.member_ended = false;
    }
    if (available == 0) {
      return absl::DataLossError(
          absl::StrFormat("%s: truncated gzip stream (the file ends inside compressed data; "
                          "was it copied completely?)",
                          path_));
    }
    z.stream.next_in = reinterpret_cast<Bytef*>(input_.data() + input_begin_);
    z.stream.avail_in = static_cast<uInt>(available);
    z.stream.next_out = reinterpret_cast<Bytef*>(output_.data());
    z.stream.avail_out = static_cast<uInt>(output_.size());
    int ret = inflate(&z.stream, Z_NO_FLUSH);
    std::size_t consumed = available - z.stream.avail_in;
    std::size_t produced = output_.size() - z.stream.avail_out;
    input_begin_ += consumed;
    switch (ret) {
      case Z_STREAM_END:
        z.member_ended = true;
        break;
      case Z_OK:
      case Z_BUF_ERROR:  // no progress possible: caught below
        break;
      case Z_MEM_ERROR:
        return absl::ResourceExhaustedError(absl::StrFormat("%s: out of memory in zlib", path_));
      default:  // Z_DATA_ERROR, Z_NEED_DICT, Z_STREAM_ERROR
        return absl::DataLossError(
            absl::StrFormat("%s: corrupt gzip data (%s)", path_,
                            z.stream.msg != nullptr ? z.stream.msg : "zlib error"));
    }
    if (produced > 0) return std::string_view(output_.data(), produced);
    // inflate always progresses while it has input and output room; never spin if it does not.
    if (consumed == 0 && ret != Z_STREAM_END) {
      return absl::DataLossError(absl::StrFormat("%s: corrupt gzip data (no progress)", path_));
    }
  }
}

}  // namespace vramscope::cli
