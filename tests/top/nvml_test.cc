// viewer-cli/top/nvml.h over tests/top/fake_nvml.cc (VRAMSCOPE_NVML_LIBRARY, set by meson):
// GPUs, capacities and per-process memory as NVML gives them, a list that grows between the
// size query and the fill, memory NVML cannot see, and the two ways NVML is absent.
#include "top/nvml.h"

#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

namespace vramscope::cli::top {
namespace {

using ::testing::HasSubstr;

TEST(NvmlTest, GpusAndTheirProcesses) {
  std::string processes;
  for (int pid = 1; pid <= 40; ++pid) {  // more than the first guess of 16
    absl::StrAppend(&processes, pid > 1 ? "," : "", pid, ":", pid * 1000);
  }
  const std::string spec =
      absl::StrCat("GPU-aaaa|Fake H200|150000000000|20000000000|", processes,
                   ";GPU-bbbb|Fake H100|80000000000|0|;GPU-cccc|Fake L4|24000000000|1000|7:-");
  setenv("VRAMSCOPE_FAKE_NVML", spec.c_str(), 1);
  std::string why;
  std::unique_ptr<Nvml> nvml = Nvml::Load(&why);
  ASSERT_NE(nvml, nullptr) << why;
  const std::vector<GpuMemory> gpus = nvml->Query();
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0].index, 0u);
  EXPECT_EQ(gpus[0].uuid, "GPU-aaaa");
  EXPECT_EQ(gpus[0].name, "Fake H200");
  EXPECT_EQ(gpus[0].total_bytes, 150000000000u);
  EXPECT_EQ(gpus[0].used_bytes, 20000000000u);
  ASSERT_EQ(gpus[0].processes.size(), 40u);
  EXPECT_EQ(gpus[0].processes[39].pid, 40u);
  EXPECT_EQ(gpus[0].processes[39].used_bytes, 40000u);
  EXPECT_TRUE(gpus[1].processes.empty());
  ASSERT_EQ(gpus[2].processes.size(), 1u);
  EXPECT_FALSE(gpus[2].processes[0].known);
  EXPECT_EQ(gpus[2].processes[0].used_bytes, 0u);
}

TEST(NvmlTest, NoDriverMeansNoNvml) {
  setenv("VRAMSCOPE_FAKE_NVML_FAIL", "init", 1);
  std::string why;
  EXPECT_EQ(Nvml::Load(&why), nullptr);
  EXPECT_THAT(why, HasSubstr("nvmlInit_v2 failed"));
  unsetenv("VRAMSCOPE_FAKE_NVML_FAIL");
}

TEST(NvmlTest, NoLibraryMeansNoNvml) {
  const std::string fake = getenv("VRAMSCOPE_NVML_LIBRARY");
  setenv("VRAMSCOPE_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  std::string why;
  EXPECT_EQ(Nvml::Load(&why), nullptr);
  EXPECT_THAT(why, HasSubstr("cannot load /nonexistent/libnvidia-ml.so.1"));
  setenv("VRAMSCOPE_NVML_LIBRARY", fake.c_str(), 1);
}

}  // namespace
}  // namespace vramscope::cli::top
