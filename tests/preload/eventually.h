// Eventually(done): yields until `done()` is true or a generous deadline (20 s) passes, for the
// preload tests that wait on the shim's helper thread or a worker thread. Never a timing
// assertion: a rule that is broken shows as the caller's failed EXPECT on the false it returns.
#pragma once

#include <chrono>
#include <thread>

namespace vramscope::fake {

template <typename Done>
bool Eventually(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace vramscope::fake
