// libvramscope.so links nothing heavy and exports only its hooks (docs/design.md: the shim carries
// no gRPC, protobuf, Abseil, libcudart or libcuda). Reads `readelf -d` and `nm -D` of the
// library named by VRAMSCOPE_SHIM_PATH.
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string RunCommand(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  return out;
}

std::string ShimPath() {
  const char* path = getenv("VRAMSCOPE_SHIM_PATH");
  return path != nullptr ? path : "";
}

TEST(ShimSymbolsTest, NeededLibrariesAreOnlyTheSystemOnes) {
  ASSERT_FALSE(ShimPath().empty());
  const std::string out = RunCommand("readelf -d '" + ShimPath() + "'");
  ASSERT_NE(out.find("Dynamic section"), std::string::npos) << out;
  const std::regex needed(R"(\(NEEDED\)\s+Shared library: \[([^\]]+)\])");
#ifdef __SANITIZE_ADDRESS__
  // A sanitizer build (build-asan) links the shim against the sanitizer runtimes too.
  const std::regex allowed(
      R"((libc|libdl|libpthread|libstdc\+\+|libgcc_s|libm|libasan|libubsan)\.so\.\d+|ld-linux[-\w.]*\.so\.\d+)");
#else
  const std::regex allowed(
      R"((libc|libdl|libpthread|libstdc\+\+|libgcc_s|libm)\.so\.\d+|ld-linux[-\w.]*\.so\.\d+)");
#endif
  int count = 0;
  for (std::sregex_iterator it(out.begin(), out.end(), needed), end; it != end; ++it) {
    ++count;
    const std::string library = (*it)[1];
    EXPECT_TRUE(std::regex_match(library, allowed)) << "unexpected NEEDED " << library;
  }
  EXPECT_GE(count, 1);
}

TEST(ShimSymbolsTest, ExportsOnlyHooks) {
  ASSERT_FALSE(ShimPath().empty());
  const std::string out = RunCommand("nm -D --defined-only '" + ShimPath() + "'");
  std::istringstream lines(out);
  std::string line;
  std::set<std::string> exported;
  // InitializeInjectionNvtx2: NVTX's injection entry point (NVTX_INJECTION64_PATH, nvtx.h);
  // InitializeInjection: CUDA's (CUDA_INJECTION64_PATH, cupti.h). Those are unversioned (no
  // "@": they bind references of any version); the shared runtime's cudaMalloc and cudaFree
  // carry libcudart.so.13 (hooks_runtime.cc), whose version node is itself a symbol.
  const std::regex hook(
      R"(cu[A-Z]\w*|dlsym|vramscope_\w+|InitializeInjectionNvtx2|InitializeInjection|)"
      R"((cudaMalloc|cudaFree)@@libcudart\.so\.13|libcudart\.so\.13)");
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string address, type, name;
    if (!(fields >> address >> type >> name)) continue;
    exported.insert(name);
    EXPECT_TRUE(std::regex_match(name, hook))
        << "unexpected export " << name << " (" << type << ")";
  }
  for (const char* name : {"dlsym",
                           "cudaMalloc@@libcudart.so.13",
                           "cudaFree@@libcudart.so.13",
                           "cuGetProcAddress",
                           "cuGetProcAddress_v2",
                           "cuMemAlloc_v2",
                           "cuMemFree_v2",
                           "cuMemGetInfo_v2",
                           "cuMemAllocAsync",
                           "cuMemAllocAsync_ptsz",
                           "cuMemFreeAsync_ptsz",
                           "cuMemAllocFromPoolAsync_ptsz",
                           "cuMemCreate",
                           "cuMemMap",
                           "cuIpcGetMemHandle",
                           "cuCtxSynchronize",
                           "cuDevicePrimaryCtxReset_v2",
                           "cuStreamBeginCapture_v2_ptsz",
                           "InitializeInjectionNvtx2",
                           "InitializeInjection",
                           "cuArrayCreate_v2",
                           "cuArray3DCreate_v2",
                           "cuMipmappedArrayCreate",
                           "cuArrayDestroy",
                           "cuMipmappedArrayDestroy",
                           "cuGraphAddMemAllocNode",
                           "cuGraphAddNode",
                           "cuGraphAddNode_v2",
                           "cuGraphInstantiate",
                           "cuGraphInstantiate_v2",
                           "cuGraphInstantiateWithFlags",
                           "cuGraphInstantiateWithParams",
                           "cuGraphInstantiateWithParams_ptsz",
                           "cuGraphUpload",
                           "cuGraphUpload_ptsz",
                           "cuGraphLaunch",
                           "cuGraphLaunch_ptsz",
                           "cuGraphExecDestroy",
                           "cuGraphDestroy",
                           "cuDeviceGraphMemTrim"}) {
    EXPECT_EQ(exported.count(name), 1u) << name << " is not exported";
  }
}

}  // namespace
