// The exported dlsym.
//
// RTLD_NEXT must keep meaning "the next object after the *caller*", and RTLD_DEFAULT "the
// caller's scope" (glibc searches the caller's l_scope, which for a library opened RTLD_LOCAL
// includes its own dependencies). glibc's dlsym finds the caller from its own return address,
// so a C wrapper that calls it would make those lookups relative to libvramscope.so
// (HAMi-core PR #315: `import torch` hung that way). The entry is therefore a few instructions
// of assembly: for the two pseudo-handles it tail-jumps into the real dlsym with the caller's
// return address still on the stack (a cu* name found through RTLD_DEFAULT in the global scope
// is the shim's own export anyway, the preload comes first); a real handle, whose lookup does
// not depend on the caller, goes to vramscope_dlsym_impl, which calls the real dlsym and, only when
// the result is a driver entry point the shim hooks (identity table, driver.h), returns the shim's
// wrapper instead. The scope of a lookup is never changed and NULL is returned exactly when glibc
// returns NULL.
#include <dlfcn.h>

#include "driver.h"
#include "shim.h"

extern "C" {
__attribute__((visibility("hidden"))) void* vramscope_resolve_real_dlsym();
__attribute__((visibility("hidden"))) void* vramscope_dlsym_impl(void* handle, const char* symbol);
}

#if defined(__x86_64__)
// RTLD_NEXT is ((void*)-1), RTLD_DEFAULT is 0. On entry %rsp is 8 mod 16; the slow path (real dlsym
// not resolved yet) saves the two arguments plus 8 bytes of padding so the call is 16-byte aligned.
__asm__(
    ".text\n"
    ".globl dlsym\n"
    ".type dlsym, @function\n"
    ".p2align 4\n"
    "dlsym:\n"
    "  testq %rdi, %rdi\n"
    "  jz 0f\n"
    "  cmpq $-1, %rdi\n"
    "  jne 2f\n"
    "0:\n"
    "  movq vramscope_real_dlsym(%rip), %rax\n"
    "  testq %rax, %rax\n"
    "  jz 1f\n"
    "  jmp *%rax\n"
    "1:\n"
    "  pushq %rdi\n"
    "  pushq %rsi\n"
    "  subq $8, %rsp\n"
    "  call vramscope_resolve_real_dlsym\n"
    "  addq $8, %rsp\n"
    "  popq %rsi\n"
    "  popq %rdi\n"
    "  testq %rax, %rax\n"
    "  jz 3f\n"
    "  jmp *%rax\n"
    "3:\n"
    "  ret\n"
    "2:\n"
    "  jmp vramscope_dlsym_impl\n"
    ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(
    ".text\n"
    ".globl dlsym\n"
    ".type dlsym, %function\n"
    ".p2align 4\n"
    "dlsym:\n"
    "  cbz x0, 0f\n"
    "  cmn x0, #1\n"
    "  b.ne 2f\n"
    "0:\n"
    "  adrp x16, vramscope_real_dlsym\n"
    "  ldr x16, [x16, :lo12:vramscope_real_dlsym]\n"
    "  cbz x16, 1f\n"
    "  br x16\n"
    "1:\n"
    "  stp x29, x30, [sp, #-32]!\n"
    "  stp x0, x1, [sp, #16]\n"
    "  bl vramscope_resolve_real_dlsym\n"
    "  mov x16, x0\n"
    "  ldp x0, x1, [sp, #16]\n"
    "  ldp x29, x30, [sp], #32\n"
    "  cbz x16, 3f\n"
    "  br x16\n"
    "3:\n"
    "  mov x0, #0\n"
    "  ret\n"
    "2:\n"
    "  b vramscope_dlsym_impl\n"
    ".size dlsym, .-dlsym\n");
#else
#error "libvramscope.so: the dlsym entry stub exists for x86-64 and aarch64 only"
#endif

namespace vramscope::interposer {
namespace {

bool LooksLikeDriverName(const char* symbol) {
  return symbol != nullptr && symbol[0] == 'c' && symbol[1] == 'u' && symbol[2] >= 'A' &&
         symbol[2] <= 'Z';
}

}  // namespace
}  // namespace vramscope::interposer

extern "C" void* vramscope_dlsym_impl(void* handle, const char* symbol) {
  using namespace vramscope::interposer;
  auto real_dlsym = reinterpret_cast<DlsymFn>(vramscope_resolve_real_dlsym());
  if (real_dlsym == nullptr) return nullptr;
  void* found = real_dlsym(handle, symbol);
  if (found == nullptr || !LooksLikeDriverName(symbol)) return found;
  // Only identify once the driver is loaded; never load it from here (a cu* name looked up in
  // some other library must not drag libcuda in), and never while this thread initialises.
  if (!DriverLoaded() && !EnsureDriverFromDlsym()) return found;
  if (void* wrapper = WrapperFor(found); wrapper != nullptr) return wrapper;
  NoteUnwrapped("dlsym", symbol, found);
  return found;
}
