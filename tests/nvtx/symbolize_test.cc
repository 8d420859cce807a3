// viewer-cli/common/symbolize.h without a program: libdw over this test's own executable (built
// with -g) and over libstdc++ (stripped), the one-line site label skipping CUDA's frames, and
// the folded-stacks format.
#include "common/symbolize.h"

#include <absl/strings/str_format.h>
#include <gtest/gtest.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unwind.h>

#include <fstream>
#include <string>
#include <thread>

namespace vramscope::cli {
namespace {

__attribute__((noinline)) int SymbolizeMe() { return 42; }

}  // namespace
}  // namespace vramscope::cli

// A function whose symbol is Latin-1, as code compiled from such sources can have.
extern "C" __attribute__((noinline)) int Latin1Function() asm("caf\xe9_fn");
extern "C" __attribute__((noinline)) int Latin1Function() { return 7; }

namespace vramscope::cli {
namespace {

struct Module {
  std::uintptr_t address = 0;
  std::uintptr_t bias = 0;
  std::string path;
};

// The module holding `address` and its load bias.
Module ModuleOf(std::uintptr_t address) {
  Module module{address, 0, ""};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* arg) {
        auto* m = static_cast<Module*>(arg);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type != PT_LOAD || m->address < lo || m->address >= lo + ph.p_memsz) continue;
          m->bias = info->dlpi_addr;
          m->path = info->dlpi_name;
          return 1;
        }
        return 0;
      },
      &module);
  return module;
}

struct Frames {
  std::uintptr_t ips[32];
  int count = 0;
};

_Unwind_Reason_Code Collect(_Unwind_Context* context, void* arg) {
  auto* frames = static_cast<Frames*>(arg);
  frames->ips[frames->count++] = _Unwind_GetIP(context);
  return frames->count < 32 ? _URC_NO_REASON : _URC_END_OF_STACK;
}

// This executable's load bias: PATH+0x(address - bias) is what the drain would send.
std::uintptr_t LoadBias() {
  std::uintptr_t bias = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) {
        *static_cast<std::uintptr_t*>(out) = info->dlpi_addr;
        return 1;  // the first entry is the main program
      },
      &bias);
  return bias;
}

std::string Self() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, static_cast<std::size_t>(n)) : "";
}

TEST(SymbolizeTest, ResolvesModuleOffsetsWithLibdw) {
  const auto address = reinterpret_cast<std::uintptr_t>(&SymbolizeMe);
  std::vector<v1::Report> reports(1);
  v1::SiteStats* site = reports[0].add_devices()->add_top_sites();
  site->set_site(1);
  // +1: the symboliser looks up the byte before a return address.
  site->add_frames(absl::StrFormat("%s+0x%x", Self(), address - LoadBias() + 1));
  site->add_frames("/nonexistent/libgone.so+0x1234");
  site->add_frames("0x7fff0000");
  const SymbolizeResult result = SymbolizeReports(&reports);
  EXPECT_EQ(result.unreadable_modules, 0u);
  EXPECT_EQ(result.frames, 2u);
  EXPECT_EQ(result.resolved, 1u);
  const v1::SiteStats& out = reports[0].devices(0).top_sites(0);
  ASSERT_EQ(out.frames_size(), 3) << out.DebugString();
  EXPECT_NE(out.frames(0).find("SymbolizeMe"), std::string::npos) << out.DebugString();
  EXPECT_NE(out.frames(0).find("symbolize_test.cc:"), std::string::npos) << out.DebugString();
  EXPECT_EQ(out.frames(1), "/nonexistent/libgone.so+0x1234");
  EXPECT_EQ(out.frames(2), "0x7fff0000");
}

TEST(SymbolizeTest, SitesOfRecordedEventsAreResolvedInPlace) {
  // The event log of `vramscope run --events --stacks`: every site definition resolved, others
  // untouched, two processes.
  const auto address = reinterpret_cast<std::uintptr_t>(&SymbolizeMe);
  const std::string frame = absl::StrFormat("%s+0x%x", Self(), address - LoadBias() + 1);
  RecordedEvents events;
  for (std::uint32_t pid : {1u, 2u}) {
    v1::ProcessKey key;
    key.set_pid(pid);
    v1::Event site;
    site.mutable_site_definition()->set_site(pid);
    site.mutable_site_definition()->add_frames(frame);
    site.mutable_site_definition()->add_frames("/nonexistent/libgone.so+0x1234");
    events.Add(key, site);
    v1::Event alloc;
    alloc.mutable_alloc()->set_site(pid);
    events.Add(key, alloc);
  }
  const SymbolizeResult result = SymbolizeSites(&events);
  EXPECT_EQ(result.unreadable_modules, 0u);
  ASSERT_EQ(events.processes().size(), 2u);
  for (const ProcessEvents& process : events.processes()) {
    ASSERT_EQ(process.events.size(), 2u);
    const v1::SiteDefinition& site = process.events[0].site_definition();
    ASSERT_EQ(site.frames_size(), 2) << site.DebugString();
    EXPECT_NE(site.frames(0).find("SymbolizeMe"), std::string::npos) << site.DebugString();
    EXPECT_NE(site.frames(0).find("symbolize_test.cc:"), std::string::npos);
    EXPECT_EQ(site.frames(1), "/nonexistent/libgone.so+0x1234");
    EXPECT_EQ(process.events[1].alloc().site(), process.key.pid());
  }
}

TEST(SymbolizeTest, AFileThatIsNotElfIsCountedAndKeepsItsFrame) {
  char path[] = "/tmp/vramscope-symbolize-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "not an ELF file", 15), 15);
  close(fd);
  std::vector<v1::Report> reports(1);
  const std::string frame = std::string(path) + "+0x10";
  reports[0].add_devices()->add_top_sites()->add_frames(frame);
  const SymbolizeResult result = SymbolizeReports(&reports);
  EXPECT_EQ(result.unreadable_modules, 1u);
  EXPECT_EQ(result.resolved, 0u);
  EXPECT_EQ(reports[0].devices(0).top_sites(0).frames(0), frame);
  unlink(path);
}

TEST(SymbolizeTest, NamesThatAreNotUtf8AreEscaped) {
  ASSERT_EQ(Latin1Function(), 7);
  const Module self = ModuleOf(reinterpret_cast<std::uintptr_t>(&Latin1Function));
  std::vector<v1::Report> reports(1);
  reports[0].add_devices()->add_top_sites()->add_frames(
      absl::StrFormat("%s+0x%x", Self(), self.address - self.bias + 1));
  const SymbolizeResult result = SymbolizeReports(&reports);
  EXPECT_EQ(result.resolved, 1u);
  const v1::SiteStats& out = reports[0].devices(0).top_sites(0);
  ASSERT_EQ(out.frames_size(), 1);
  EXPECT_EQ(out.frames(0).rfind("caf\\xE9_fn (", 0), 0u) << out.frames(0);
  EXPECT_NE(out.frames(0).find("symbolize_test.cc:"), std::string::npos) << out.frames(0);
  // The report (JSON, the collector) can carry it.
  v1::Report parsed;
  EXPECT_TRUE(parsed.ParseFromString(reports[0].SerializeAsString()));
}

// A thread's own frames, as a stack recorded in it shows them: the frame between the thread
// entry (start_thread) and the thread function is libstdc++'s execute_native_thread_routine,
// which the stripped library does not export. addr2line named it after the nearest exported
// symbol before it (std::error_code::default_error_condition); the symboliser must either
// name it rightly or leave it as MODULE+0xOFFSET.
TEST(SymbolizeTest, AThreadEntryFrameIsNeverNamedAfterANeighbouringSymbol) {
  Frames frames;
  std::thread([&frames] { _Unwind_Backtrace(Collect, &frames); }).join();
  std::vector<v1::Report> reports(1);
  v1::SiteStats* site = reports[0].add_devices()->add_top_sites();
  int in_libstdcxx = 0;
  for (int i = 0; i < frames.count; ++i) {
    const Module module = ModuleOf(frames.ips[i]);
    if (module.path.find("libstdc++") == std::string::npos) continue;
    ++in_libstdcxx;
    site->add_frames(absl::StrFormat("%s+0x%x", module.path, frames.ips[i] - module.bias));
  }
  ASSERT_GT(in_libstdcxx, 0) << "no libstdc++ frame between the thread entry and its function";
  SymbolizeReports(&reports);
  for (const std::string& frame : reports[0].devices(0).top_sites(0).frames()) {
    EXPECT_EQ(frame.find("error_c"), std::string::npos) << frame;
    EXPECT_TRUE(frame.find("libstdc++") != std::string::npos ||
                frame.find("execute_native_thread_routine") != std::string::npos)
        << frame;
  }
}

TEST(SymbolizeTest, SiteLabelSkipsCudaFrames) {
  v1::SiteStats site;
  site.set_site(0xabc);
  EXPECT_EQ(SiteLabel(site), "site 0xabc");
  site.add_frames("cudaMalloc");
  site.add_frames("/usr/lib/libcudart.so.13+0x4000");
  site.add_frames("cuMemAlloc_v2 (x.cc:1)");
  site.add_frames("train_step (model.cc:12)");
  site.add_frames("main (model.cc:40)");
  EXPECT_EQ(SiteLabel(site), "train_step (model.cc:12)");
  v1::SiteStats cuda_only;
  cuda_only.add_frames("cudaMalloc");
  EXPECT_EQ(SiteLabel(cuda_only), "cudaMalloc");
}

TEST(SymbolizeTest, FoldedStacksAreOutermostFirstWithTotalBytes) {
  std::vector<v1::Report> reports(2);
  for (v1::Report& report : reports) {
    v1::SiteStats* site = report.add_devices()->add_top_sites();
    site->add_frames("Alloc(unsigned long) (a.cc:3)");
    site->add_frames("weird;name (a.cc:9)");
    site->add_frames("/lib/libx.so+0x10");
    site->set_total_bytes(1000);
    site->set_peak_live_bytes(10);
  }
  v1::SiteStats* other = reports[0].mutable_devices(0)->add_top_sites();
  other->set_site(0x5);
  other->set_total_bytes(7);
  EXPECT_EQ(FoldedStacks(reports),
            "libx.so+0x10;weird,name;Alloc(unsigned long) 2000\n"
            "site 0x5 7\n");
}

}  // namespace
}  // namespace vramscope::cli
