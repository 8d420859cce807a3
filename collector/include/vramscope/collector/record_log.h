// The collector's on-disk format: one append-only log file per process.
//
//   file   := magic record*
//   magic  := "VSLOG001" (8 bytes)
//   record := length:u32le crc32:u32le payload[length]
//   payload:= one serialized vramscope.v1.EventBatch
//
// crc32 is IEEE 802.3 (the zlib polynomial) over the payload only. A record is written with one
// write(2) of header and payload together and acknowledged only after it returned (and, with
// fsync on, after fdatasync), so after a crash the only damage a file can show is a torn or
// garbled last record. Anything else is reported as corruption by ReadLog.
//
// Thread safety: the functions are reentrant; a file is owned by one caller at a time.
// Errors: absl::Status; messages name the file, the offset and what to do.
#ifndef VRAMSCOPE_COLLECTOR_RECORD_LOG_H_
#define VRAMSCOPE_COLLECTOR_RECORD_LOG_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace vramscope::collector {

inline constexpr absl::string_view kLogMagic = "VSLOG001";
inline constexpr size_t kRecordHeaderBytes = 8;
// A record longer than this is taken as a garbled length field, not as data.
inline constexpr uint32_t kMaxRecordBytes = 1u << 30;

// IEEE CRC-32 (zlib's crc32()), continuing from `crc` (0 to start).
uint32_t Crc32(absl::string_view data, uint32_t crc = 0);

// Header and payload of one record, ready for a single write.
std::string FrameRecord(absl::string_view payload);
// The same into `out` (its capacity is reused: no allocation per record once warm).
void FrameRecordInto(absl::string_view payload, std::string* out);

// The write(2) the log uses; tests replace it to inject ENOSPC or short writes.
using WriteFn = std::function<ssize_t(int fd, const void* data, size_t size)>;

// Appends `bytes` (a FrameRecord result, or the magic) at the end of `fd`, whose current size is
// `file_size`. On any failure the file is truncated back to `file_size`, so a failed append
// leaves no partial record; ENOSPC and EDQUOT become RESOURCE_EXHAUSTED.
absl::Status AppendAll(int fd, uint64_t file_size, absl::string_view bytes, const WriteFn& write_fn,
                       absl::string_view path);

// What ReadLog found in one file.
struct LogScan {
  uint64_t records = 0;      // records delivered to the callback
  uint64_t valid_bytes = 0;  // file offset just past the last good record
  uint64_t file_bytes = 0;   // size of the file as found
  // Set when a damaged record ends the good prefix: where, and why.
  bool damaged = false;
  bool damaged_is_tail = false;  // the damaged record is the last thing in the file (torn write)
  std::string damage;
};

// Opens an existing file of the data directory: regular files only. A symbolic link, FIFO,
// socket, device or directory is refused with FAILED_PRECONDITION naming what it is, without
// being opened (lstat first) or, if it was swapped in between, without blocking on it or following
// it (O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, then fstat). `flags` is O_RDONLY or O_RDWR; the
// returned descriptor is in blocking mode. Other failures are INTERNAL.
absl::StatusOr<int> OpenRegularFile(absl::string_view path, int flags);

// Reads `path` record by record, calling `on_record(offset, payload)` for each record whose
// length and CRC check out. `on_record` may reject a record (a payload that does not parse, a
// sequence gap) by returning an error: that record then counts as damaged and reading stops.
// Returns an error only when the file cannot be read at all, is not a regular file
// (FAILED_PRECONDITION, see OpenRegularFile) or does not start with the magic (DATA_LOSS);
// damage after the magic is described in the returned LogScan.
absl::Status ReadLog(absl::string_view path,
                     const std::function<absl::Status(uint64_t, absl::string_view)>& on_record,
                     LogScan* scan);

// The same over an open descriptor (from OpenRegularFile); `path` only names it in messages.
// Reads with pread: the file offset is left alone.
absl::Status ReadLogFd(int fd, absl::string_view path,
                       const std::function<absl::Status(uint64_t, absl::string_view)>& on_record,
                       LogScan* scan);

}  // namespace vramscope::collector

#endif  // VRAMSCOPE_COLLECTOR_RECORD_LOG_H_
