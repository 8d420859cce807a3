// Helpers shared by the tests: temporary directories, synthetic batches, files, the environment.
#ifndef VRAMSCOPE_TESTS_COLLECTOR_TEST_UTIL_H_
#define VRAMSCOPE_TESTS_COLLECTOR_TEST_UTIL_H_

#include <stdlib.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

#include "vramscope/v1/events.pb.h"

namespace vramscope::testing {

// A fresh directory under $TMPDIR, removed with everything in it when the object goes.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/vramscope-test-XXXXXX";
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline v1::ProcessKey Key(uint32_t pid, std::string host = "node1") {
  v1::ProcessKey key;
  key.set_host(std::move(host));
  key.set_pid(pid);
  key.set_start_time_ns(1700000000000000000ull + pid);
  return key;
}

// `events` alloc events numbered from `first_address`; a process-start event first when
// sequence is 1, a device counter snapshot at the end.
inline v1::EventBatch Batch(const v1::ProcessKey& key, uint64_t sequence, int events,
                            uint64_t first_address = 0x1000) {
  v1::EventBatch batch;
  *batch.mutable_process() = key;
  batch.set_sequence(sequence);
  if (sequence == 1) {
    v1::Event* start = batch.add_events();
    start->set_time_ns(1);
    start->mutable_process_start()->set_pid(key.pid());
    start->mutable_process_start()->add_command_line("./app");
    start->mutable_process_start()->add_command_line("--steps=3");
    --events;
  }
  for (int i = 0; i < events; ++i) {
    v1::Event* event = batch.add_events();
    event->set_time_ns(sequence * 100000 + static_cast<uint64_t>(i));
    event->mutable_alloc()->set_address(first_address + static_cast<uint64_t>(i) * 512);
    event->mutable_alloc()->set_requested_bytes(500);
    event->mutable_alloc()->set_allocated_bytes(512);
    event->mutable_alloc()->set_kind(v1::ALLOCATION_KIND_POOLED);
  }
  v1::DeviceCounters* counters = batch.add_counters();
  counters->set_device(0);
  counters->set_peak_reserved_bytes(sequence << 20);
  return batch;
}

inline v1::EventBatch ExitBatch(const v1::ProcessKey& key, uint64_t sequence, int exit_code) {
  v1::EventBatch batch;
  *batch.mutable_process() = key;
  batch.set_sequence(sequence);
  v1::Event* event = batch.add_events();
  event->set_time_ns(sequence * 100000);
  event->mutable_process_exit()->set_exit_code(exit_code);
  return batch;
}

// The variable's value, or "" when unset (meson passes paths to the tests this way).
inline std::string Env(const char* name) {
  const char* value = getenv(name);
  return value != nullptr ? value : "";
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Bytes of disk a file, or a directory's files (not recursive), actually occupy (st_blocks):
// a sparse file's holes count nothing.
inline std::uint64_t DiskUsage(const std::string& path) {
  auto usage = [](const std::string& file) -> std::uint64_t {
    struct stat st {};
    return ::lstat(file.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_blocks) * 512 : 0;
  };
  if (!std::filesystem::is_directory(path)) return usage(path);
  std::uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    total += usage(entry.path().string());
  }
  return total;
}

// A program's `key=value` lines (one per line; other lines ignored) as numbers.
inline std::map<std::string, std::uint64_t> ReadFigures(const std::string& path) {
  std::map<std::string, std::uint64_t> figures;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) figures[line.substr(0, eq)] = std::stoull(line.substr(eq + 1));
  }
  return figures;
}

}  // namespace vramscope::testing

#endif  // VRAMSCOPE_TESTS_COLLECTOR_TEST_UTIL_H_
