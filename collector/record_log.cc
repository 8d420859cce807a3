#include "vramscope/collector/record_log.h"

#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <string>

namespace vramscope::collector {
namespace {

void PutU32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

// Reads exactly `size` bytes at `offset`, or fewer only at end of file.
absl::StatusOr<size_t> ReadAt(int fd, char* out, size_t size, uint64_t offset,
                              absl::string_view path) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrFormat("%s: read at offset %d failed: %s", path,
                                                 offset + done, strerror(errno)));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

const char* FileTypeName(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFLNK:
      return "a symbolic link";
    case S_IFIFO:
      return "a FIFO";
    case S_IFSOCK:
      return "a socket";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFDIR:
      return "a directory";
    default:
      return "not a plain file";
  }
}

}  // namespace

uint32_t Crc32(absl::string_view data, uint32_t crc) {
  // zlib's CRC-32 (IEEE 802.3: polynomial 0xEDB88320 reflected, inverted in and out), what every
  // log carries; collector_test checks it against a plain table-driven reference. zlib's braided
  // loop is about twice as fast as slicing-by-8 tables.
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(data.data()), data.size()));
}

void FrameRecordInto(absl::string_view payload, std::string* out) {
  out->resize(kRecordHeaderBytes + payload.size());
  PutU32(out->data(), static_cast<uint32_t>(payload.size()));
  PutU32(out->data() + 4, Crc32(payload));
  std::memcpy(out->data() + kRecordHeaderBytes, payload.data(), payload.size());
}

std::string FrameRecord(absl::string_view payload) {
  std::string out;
  FrameRecordInto(payload, &out);
  return out;
}

absl::Status AppendAll(int fd, uint64_t file_size, absl::string_view bytes, const WriteFn& write_fn,
                       absl::string_view path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write_fn ? write_fn(fd, bytes.data() + done, bytes.size() - done)
                         : ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      // Leave no partial record behind: the next append must start on a record boundary.
      if (::ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
        return absl::DataLossError(absl::StrFormat(
            "%s: append failed (%s) and truncating back to %d bytes failed too (%s); the file "
            "ends in a partial record that the next start will truncate",
            path, strerror(err), file_size, strerror(errno)));
      }
      std::string message = absl::StrFormat("%s: writing %d bytes at offset %d failed: %s", path,
                                            bytes.size(), file_size, strerror(err));
      if (err == ENOSPC || err == EDQUOT) {
        return absl::ResourceExhaustedError(
            absl::StrCat(message, "; the disk is full: free space in the data directory"));
      }
      return absl::InternalError(message);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> OpenRegularFile(absl::string_view path, int flags) {
  std::string path_str(path);
  auto refuse = [&](mode_t mode) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: not a regular file (%s); skipped: move it out of the data directory",
                        path, FileTypeName(mode)));
  };
  // lstat first: a FIFO or device is never opened at all (opening some devices has effects).
  struct stat st {};
  if (::lstat(path_str.c_str(), &st) != 0) {
    return absl::InternalError(absl::StrFormat("%s: cannot stat: %s", path, strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return refuse(st.st_mode);
  // The name may have been swapped since: O_NOFOLLOW and O_NONBLOCK keep open from following a
  // link or waiting for a FIFO's writer, and fstat checks what was actually opened.
  int fd = ::open(path_str.c_str(), flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) return refuse(S_IFLNK);
    if (errno == EISDIR) return refuse(S_IFDIR);
    return absl::InternalError(absl::StrFormat("%s: cannot open: %s", path, strerror(errno)));
  }
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrFormat("%s: cannot stat: %s", path, strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return refuse(st.st_mode);
  }
  // Regular files ignore O_NONBLOCK, but the descriptor may outlive recovery as the append fd.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

absl::Status ReadLog(absl::string_view path,
                     const std::function<absl::Status(uint64_t, absl::string_view)>& on_record,
                     LogScan* scan) {
  *scan = LogScan{};
  absl::StatusOr<int> fd = OpenRegularFile(path, O_RDONLY);
  if (!fd.ok()) return fd.status();
  absl::Status status = ReadLogFd(*fd, path, on_record, scan);
  ::close(*fd);
  return status;
}

absl::Status ReadLogFd(int fd, absl::string_view path,
                       const std::function<absl::Status(uint64_t, absl::string_view)>& on_record,
                       LogScan* scan) {
  *scan = LogScan{};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrFormat("%s: cannot stat: %s", path, strerror(errno)));
  }
  scan->file_bytes = static_cast<uint64_t>(st.st_size);

  char magic[8];
  absl::StatusOr<size_t> got = ReadAt(fd, magic, sizeof(magic), 0, path);
  if (!got.ok()) return got.status();
  if (*got != kLogMagic.size() || absl::string_view(magic, 8) != kLogMagic) {
    return absl::DataLossError(absl::StrFormat(
        "%s: not a vramscope log (%d bytes, does not start with \"%s\"); skipped: move it out of "
        "the data directory",
        path, scan->file_bytes, kLogMagic));
  }

  uint64_t offset = kLogMagic.size();
  scan->valid_bytes = offset;
  std::string payload;
  while (offset < scan->file_bytes) {
    auto damaged = [&](bool is_tail, std::string why) {
      scan->damaged = true;
      scan->damaged_is_tail = is_tail;
      scan->damage = absl::StrFormat("record at offset %d: %s", offset, why);
    };
    uint64_t left = scan->file_bytes - offset;
    if (left < kRecordHeaderBytes) {
      damaged(true, absl::StrFormat("torn header (%d of %d bytes)", left, kRecordHeaderBytes));
      break;
    }
    char header[kRecordHeaderBytes];
    got = ReadAt(fd, header, sizeof(header), offset, path);
    if (!got.ok()) return got.status();
    uint32_t length = GetU32(header);
    uint32_t crc = GetU32(header + 4);
    if (length > kMaxRecordBytes) {
      damaged(false, absl::StrFormat("length field %d exceeds the %d-byte limit", length,
                                     kMaxRecordBytes));
      break;
    }
    if (length > left - kRecordHeaderBytes) {
      damaged(true, absl::StrFormat("torn record (%d of %d payload bytes present)",
                                    left - kRecordHeaderBytes, length));
      break;
    }
    bool is_last = offset + kRecordHeaderBytes + length == scan->file_bytes;
    payload.resize(length);
    got = ReadAt(fd, payload.data(), length, offset + kRecordHeaderBytes, path);
    if (!got.ok()) return got.status();
    if (*got != length) {
      damaged(true, "file shrank while reading");
      break;
    }
    uint32_t actual = Crc32(payload);
    if (actual != crc) {
      damaged(is_last, absl::StrFormat("CRC mismatch (stored %08x, computed %08x)", crc, actual));
      break;
    }
    absl::Status accepted = on_record(offset, payload);
    if (!accepted.ok()) {
      damaged(is_last, std::string(accepted.message()));
      break;
    }
    ++scan->records;
    offset += kRecordHeaderBytes + length;
    scan->valid_bytes = offset;
  }
  return absl::OkStatus();
}

}  // namespace vramscope::collector
