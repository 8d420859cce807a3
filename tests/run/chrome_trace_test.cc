// ChromeTrace's JSON for names holding any byte: every NVTX name and domain of every single byte,
// quotes, backslashes, control characters and malformed UTF-8 (truncated, overlong, surrogate,
// stray continuation), and a command line with such bytes. The file must pass a strict parser
// (tests/run/json_strict.py: strict UTF-8, RFC 8259, no duplicate keys), and each slice's name
// must read back as ToValidUtf8 of what was pushed.
#include "run/chrome_trace.h"

#include <absl/strings/escaping.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "vramscope/utf8.h"

namespace vramscope::cli {
namespace {

std::string Hex(const std::string& bytes) {
  return bytes.empty() ? "-" : absl::BytesToHexString(bytes);
}

TEST(ChromeTraceTest, AnyBytesInNamesGiveStrictlyValidJson) {
  std::vector<std::string> names;
  for (int b = 0; b < 256; ++b) names.push_back(std::string(1, static_cast<char>(b)));
  names.insert(names.end(), {"", "say \"hi\"", "C:\\path\\", "tab\there\nline\r\b\f", "caf\xc3\xa9",
                             "trunc\xc3", "overlong\xc0\xaf", "surrogate\xed\xa0\x80",
                             "stray\x80\xbf", "\xff\xfe\xfd", "above\xf4\x90\x80\x80",
                             "\\x41 looks escaped", std::string("nul\0in", 6), "del\x7f"});
  ChromeTrace trace;
  std::uint64_t time = 1000;
  std::uint32_t id = 1;
  for (const std::string& name : names) {
    v1::Event push;
    push.set_time_ns(time += 1000);
    push.set_thread_id(7);
    push.mutable_nvtx_push()->set_range_id(id);
    push.mutable_nvtx_push()->set_name(name);
    push.mutable_nvtx_push()->set_domain("dom" + name);
    trace.Add(42, push);
    v1::Event pop;
    pop.set_time_ns(time += 1000);
    pop.set_thread_id(7);
    pop.mutable_nvtx_pop()->set_range_id(id++);
    trace.Add(42, pop);
  }
  v1::Report report;
  report.mutable_process()->set_pid(42);
  report.add_command_line("/opt/\xff\"app\x01\\");
  const std::string json = trace.Json({report});

  char path[] = "/tmp/vramscope-chrome-trace.XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path, std::ios::binary) << json;
  const char* script = getenv("VRAMSCOPE_JSON_STRICT");
  ASSERT_NE(script, nullptr) << "VRAMSCOPE_JSON_STRICT is not set (meson sets it)";
  const std::string command = std::string("python3 ") + script + " " + path;
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = pclose(pipe);
  unlink(path);
  ASSERT_EQ(status, 0) << "the trace is not strict JSON: " << out;

  std::string expected;
  for (const std::string& name : names) {
    expected += Hex(ToValidUtf8(name)) + " " + Hex(ToValidUtf8("dom" + name)) + "\n";
  }
  EXPECT_EQ(out, expected);
}

// Allocations are async slices with one id each, ending at their free or at the last event; past
// the cap they are counted (vramscope run says how many were left out), host memory is skipped.
TEST(ChromeTraceTest, AllocationsAreAsyncSlicesAndCountedPastTheCap) {
  ChromeTrace trace(/*max_slices=*/2);
  auto event = [](std::uint64_t ms) {
    v1::Event e;
    e.set_time_ns(ms * 1000000);
    e.set_device(1);
    return e;
  };
  for (std::uint64_t i = 0; i < 3; ++i) {
    v1::Event alloc = event(i + 1);
    alloc.mutable_alloc()->set_address(0x1000 * (i + 1));
    alloc.mutable_alloc()->set_requested_bytes(100);
    alloc.mutable_alloc()->set_kind(v1::ALLOCATION_KIND_POOLED);
    trace.Add(42, alloc);
  }
  v1::Event host = event(4);
  host.mutable_alloc()->set_address(0x9000);
  host.mutable_alloc()->set_kind(v1::ALLOCATION_KIND_HOST);
  trace.Add(42, host);
  v1::Event free = event(5);
  free.mutable_free()->set_address(0x1000);
  trace.Add(42, free);
  trace.Add(42, event(9));  // the last event: where the live one ends
  EXPECT_EQ(trace.slices_dropped(), 1u);
  const std::string json = trace.Json({});
  EXPECT_NE(json.find(R"({"ph":"b","cat":"alloc","name":"100 B","id":"0x1","pid":42,"tid":42,)"
                      R"("ts":1000.000,"args":{"device":1,"requested_bytes":100,)"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find(R"({"ph":"e","cat":"alloc","name":"100 B","id":"0x1","pid":42,"tid":42,)"
                      R"("ts":5000.000})"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("id":"0x2","pid":42,"tid":42,"ts":9000.000})"), std::string::npos) << json;
  EXPECT_EQ(json.find("0x9000"), std::string::npos);
}

}  // namespace
}  // namespace vramscope::cli
