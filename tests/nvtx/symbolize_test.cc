// viewer-cli/run/symbolize.h without a program: addr2line over this test's own executable (built
// with -g), the one-line site label skipping CUDA's frames, and the folded-stacks format.
#include "run/symbolize.h"

#include <absl/strings/str_format.h>
#include <gtest/gtest.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace vramscope::cli {
namespace {

__attribute__((noinline)) int SymbolizeMe() { return 42; }

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

TEST(SymbolizeTest, ResolvesModuleOffsetsWithAddr2line) {
  const auto address = reinterpret_cast<std::uintptr_t>(&SymbolizeMe);
  std::vector<v1::Report> reports(1);
  v1::SiteStats* site = reports[0].add_devices()->add_top_sites();
  site->set_site(1);
  // +1: the symboliser looks up the byte before a return address.
  site->add_frames(absl::StrFormat("%s+0x%x", Self(), address - LoadBias() + 1));
  site->add_frames("/nonexistent/libgone.so+0x1234");
  site->add_frames("0x7fff0000");
  const SymbolizeResult result = SymbolizeReports(&reports);
  EXPECT_TRUE(result.warning.empty()) << result.warning;
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
  EXPECT_TRUE(result.warning.empty()) << result.warning;
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

TEST(SymbolizeTest, MissingAddr2lineIsOneWarning) {
  std::vector<v1::Report> reports(1);
  v1::SiteStats* site = reports[0].add_devices()->add_top_sites();
  site->add_frames(Self() + "+0x10");
  const SymbolizeResult result = SymbolizeReports(&reports, "/nonexistent/addr2line");
  EXPECT_NE(result.warning.find("/nonexistent/addr2line"), std::string::npos);
  EXPECT_EQ(reports[0].devices(0).top_sites(0).frames(0), Self() + "+0x10");
}

TEST(SymbolizeTest, NamesThatAreNotUtf8AreEscaped) {
  // An addr2line whose answer names a function and a file in Latin-1, as debug info of a
  // program compiled from such a path does.
  char dir[] = "/tmp/vramscope-symbolize-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string fake = std::string(dir) + "/addr2line";
  {
    std::ofstream script(fake);
    script << "#!/bin/sh\nprintf '0x000000000000000f\\ncaf\\351()\\n/src/caf\\351.cc:12\\n'\n";
  }
  ASSERT_EQ(chmod(fake.c_str(), 0700), 0);
  std::vector<v1::Report> reports(1);
  reports[0].add_devices()->add_top_sites()->add_frames(Self() + "+0x10");
  const SymbolizeResult result = SymbolizeReports(&reports, fake);
  EXPECT_TRUE(result.warning.empty()) << result.warning;
  const v1::SiteStats& out = reports[0].devices(0).top_sites(0);
  ASSERT_EQ(out.frames_size(), 1);
  EXPECT_EQ(out.frames(0), "caf\\xE9() (/src/caf\\xE9.cc:12)");
  // The report (JSON, the collector) can carry it.
  v1::Report parsed;
  EXPECT_TRUE(parsed.ParseFromString(reports[0].SerializeAsString()));
  unlink(fake.c_str());
  rmdir(dir);
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
