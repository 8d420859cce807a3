// The shim's settings (interposer/shim/config.cc) read from the environment: the size variables
// take the one size grammar of every vramscope program (vramscope/size_parse.h), anything else is
// ignored with a warning and the default kept; counts and switches are plain decimal numbers.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <utility>

#include "interposer/shim/config.h"

namespace vramscope::interposer {
namespace {

std::uint64_t CapacityFor(const char* value) {
  setenv("VRAMSCOPE_POOL_CAPACITY", value, 1);
  const Config config = ReadConfig();
  unsetenv("VRAMSCOPE_POOL_CAPACITY");
  return config.capacity_bytes;
}

TEST(ShimConfigTest, SizesTakeTheOneGrammar) {
  EXPECT_EQ(CapacityFor("512MiB"), 512ull << 20);
  EXPECT_EQ(CapacityFor("512M"), 512ull << 20);
  EXPECT_EQ(CapacityFor("0.5GiB"), 512ull << 20);
  EXPECT_EQ(CapacityFor("1G"), 1ull << 30);
  EXPECT_EQ(CapacityFor("1GB"), 1000000000u);
  EXPECT_EQ(CapacityFor("4096"), 4096u);
  setenv("VRAMSCOPE_FENCE_BATCH_BYTES", "64MB", 1);
  EXPECT_EQ(ReadConfig().fence_batch_bytes, 64000000u);
  unsetenv("VRAMSCOPE_FENCE_BATCH_BYTES");
}

TEST(ShimConfigTest, GarbageKeepsTheDefault) {
  const std::uint64_t unlimited = Config().capacity_bytes;
  for (const char* garbage : {"12XB", "-1", "1e9", "0x10", "18446744073709551616", "G", "4 "}) {
    EXPECT_EQ(CapacityFor(garbage), unlimited) << garbage;
  }
  setenv("VRAMSCOPE_FENCE_BATCH_FREES", "0x10", 1);
  EXPECT_EQ(ReadConfig().fence_batch_frees, Config().fence_batch_frees);
  setenv("VRAMSCOPE_FENCE_BATCH_FREES", "16", 1);
  EXPECT_EQ(ReadConfig().fence_batch_frees, 16u);
  unsetenv("VRAMSCOPE_FENCE_BATCH_FREES");
}

// VRAMSCOPE_VMM_PIECE: a size, rounded down to a power of two; 0 turns pieces off.
TEST(ShimConfigTest, VmmPieceIsAPowerOfTwoOrOff) {
  EXPECT_EQ(Config().vmm_piece_bytes, 64ull << 20);
  for (const auto& [value, want] : {std::pair<const char*, std::size_t>{"0", 0},
                                    {"2MiB", 2ull << 20},
                                    {"3MiB", 2ull << 20},
                                    {"64M", 64ull << 20}}) {
    setenv("VRAMSCOPE_VMM_PIECE", value, 1);
    EXPECT_EQ(ReadConfig().vmm_piece_bytes, want) << value;
  }
  unsetenv("VRAMSCOPE_VMM_PIECE");
}

// The reuse rule: event fences with GPU-side waits by default (their rounds 500 us apart, polls
// every 100 us); VRAMSCOPE_FENCE_GPU_WAIT=0 gives host waits (50 us, 20 us),
// VRAMSCOPE_FENCE_EVENTS=0 the amortised device synchronisation alone.
TEST(ShimConfigTest, GpuSideWaitsAreTheDefaultRule) {
  unsetenv("VRAMSCOPE_FENCE_EVENTS");
  unsetenv("VRAMSCOPE_FENCE_GPU_WAIT");
  Config config = ReadConfig();
  EXPECT_TRUE(config.fence_events);
  EXPECT_TRUE(config.fence_gpu_wait);
  EXPECT_EQ(config.fence_round_us, Config::kGpuWaitRoundUs);
  EXPECT_EQ(config.fence_poll_us, Config::kGpuWaitPollUs);
  setenv("VRAMSCOPE_FENCE_GPU_WAIT", "0", 1);
  config = ReadConfig();
  EXPECT_TRUE(config.fence_events);
  EXPECT_FALSE(config.fence_gpu_wait);
  EXPECT_EQ(config.fence_round_us, 50u);
  EXPECT_EQ(config.fence_poll_us, 20u);
  unsetenv("VRAMSCOPE_FENCE_GPU_WAIT");
  setenv("VRAMSCOPE_FENCE_EVENTS", "0", 1);
  EXPECT_FALSE(ReadConfig().fence_events);
  unsetenv("VRAMSCOPE_FENCE_EVENTS");
}

}  // namespace
}  // namespace vramscope::interposer
