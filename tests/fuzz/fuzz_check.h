// FUZZ_CHECK: how the libFuzzer targets of tests/fuzz state a contract. A violated contract prints
// what was expected and aborts, which libFuzzer reports as a crash and saves the input for.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

// `message` (anything a std::string can be built from) is only evaluated when `condition` fails.
#define FUZZ_CHECK(condition, message)                                                    \
  do {                                                                                    \
    if (!(condition)) {                                                                   \
      const std::string fuzz_check_message(message);                                      \
      std::fprintf(stderr, "%s:%d: fuzz contract violated: %s: %s\n", __FILE__, __LINE__, \
                   #condition, fuzz_check_message.c_str());                               \
      std::fflush(stderr);                                                                \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)
