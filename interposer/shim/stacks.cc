#include "stacks.h"

#include <link.h>
#include <string.h>
#include <unistd.h>
#include <unwind.h>

#include <atomic>
#include <cstddef>

#include "fast_unwind.h"
#include "state.h"

namespace vramscope::interposer {
namespace {

constexpr int kMaxFrames = VRAMSCOPE_RING_MAX_SITE_FRAMES;
constexpr int kMaxRawFrames = kMaxFrames + 32;  // room for the shim's own frames
constexpr std::size_t kSiteSlots = std::size_t{1} << 14;
constexpr int kMaxProbes = 64;
constexpr int kMaxModules = 1024;
constexpr std::size_t kPathBytes =
    VRAMSCOPE_RING_MODULE_INLINE_PATH +
    (VRAMSCOPE_RING_MAX_MODULE_CHUNKS - 1) * VRAMSCOPE_RING_TEXT_RECORD_BYTES;

// Seen site ids (0 = empty slot). Never shrinks.
constinit std::atomic<std::uint64_t> g_sites[kSiteSlots] = {};

struct Module {
  std::uintptr_t start;
  std::uintptr_t end;
  std::uintptr_t bias;
};
// Guarded by g_lock: the module map and the sending of new sites' frames (rare: once a site).
constinit Module g_modules[kMaxModules] = {};
constinit int g_module_count = 0;
constinit std::atomic_flag g_lock = ATOMIC_FLAG_INIT;
// The shim's own text, whose frames are skipped (0/0 until found).
constinit std::atomic<std::uintptr_t> g_self_start{0};
constinit std::atomic<std::uintptr_t> g_self_end{0};

struct SpinLock {
  SpinLock() {
    while (g_lock.test_and_set(std::memory_order_acquire)) {
    }
  }
  ~SpinLock() { g_lock.clear(std::memory_order_release); }
};

struct Unwound {
  std::uintptr_t frames[kMaxRawFrames];
  int count;
};

_Unwind_Reason_Code CollectFrame(_Unwind_Context* context, void* arg) {
  auto* out = static_cast<Unwound*>(arg);
  const std::uintptr_t ip = _Unwind_GetIP(context);
  if (ip == 0) return _URC_END_OF_STACK;
  out->frames[out->count++] = ip;
  return out->count < kMaxRawFrames ? _URC_NO_REASON : _URC_END_OF_STACK;
}

void Range(const dl_phdr_info* info, std::uintptr_t* start, std::uintptr_t* end) {
  *start = ~std::uintptr_t{0};
  *end = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    const std::uintptr_t hi = lo + ph.p_memsz;
    if (lo < *start) *start = lo;
    if (hi > *end) *end = hi;
  }
}

int FindSelf(dl_phdr_info* info, std::size_t /*size*/, void* /*arg*/) {
  std::uintptr_t start, end;
  Range(info, &start, &end);
  const auto self = reinterpret_cast<std::uintptr_t>(&CaptureSite);
  if (self < start || self >= end) return 0;
  g_self_start.store(start, std::memory_order_relaxed);
  g_self_end.store(end, std::memory_order_release);
  return 1;
}

bool KnownModule(std::uintptr_t address) {
  for (int i = 0; i < g_module_count; ++i) {
    if (address >= g_modules[i].start && address < g_modules[i].end) return true;
  }
  return false;
}

vramscope_ring_record NewRecord(std::uint8_t kind) {
  vramscope_ring_record r;
  memset(&r, 0, sizeof(r));
  r.kind = kind;
  r.tid = RingThreadId();
  r.time_ns = RingNowNs();
  return r;
}

void WriteModule(RingWriter* ring, int id, const Module& module, const char* path,
                 std::size_t path_len) {
  const std::size_t rest = path_len > VRAMSCOPE_RING_MODULE_INLINE_PATH
                               ? path_len - VRAMSCOPE_RING_MODULE_INLINE_PATH
                               : 0;
  const std::size_t chunks =
      1 + (rest + VRAMSCOPE_RING_TEXT_RECORD_BYTES - 1) / VRAMSCOPE_RING_TEXT_RECORD_BYTES;
  vramscope_ring_record r = NewRecord(VRAMSCOPE_RING_KIND_MODULE);
  r.aux = static_cast<std::uint32_t>(id);
  r.flags = static_cast<std::uint8_t>(chunks);
  r.payload.module.load_bias = module.bias;
  r.payload.module.start = module.start;
  r.payload.module.end = module.end;
  std::size_t done = path_len < VRAMSCOPE_RING_MODULE_INLINE_PATH
                         ? path_len
                         : std::size_t{VRAMSCOPE_RING_MODULE_INLINE_PATH};
  memcpy(r.payload.module.path, path, done);
  (void)ring->Write(r);
  for (std::size_t k = 1; k < chunks; ++k) {
    vramscope_ring_record t = NewRecord(VRAMSCOPE_RING_KIND_MODULE);
    t.aux = static_cast<std::uint32_t>(id);
    t.sub = static_cast<std::uint8_t>(k);
    t.flags = static_cast<std::uint8_t>(chunks);
    const std::size_t n = path_len - done < VRAMSCOPE_RING_TEXT_RECORD_BYTES
                              ? path_len - done
                              : std::size_t{VRAMSCOPE_RING_TEXT_RECORD_BYTES};
    memcpy(t.payload.text, path + done, n);
    done += n;
    (void)ring->Write(t);
  }
}

// dl_iterate_phdr callback (loader lock held): adds and announces modules not seen yet. Lock
// order: the loader's lock, then g_lock (never the other way: a thread inside dlopen may be
// allocating from a library constructor).
int AddModule(dl_phdr_info* info, std::size_t /*size*/, void* arg) {
  auto* ring = static_cast<RingWriter*>(arg);
  Module module;
  Range(info, &module.start, &module.end);
  module.bias = info->dlpi_addr;
  if (module.end <= module.start) return 0;
  SpinLock lock;
  for (int i = 0; i < g_module_count; ++i) {
    if (g_modules[i].start == module.start && g_modules[i].end == module.end &&
        g_modules[i].bias == module.bias) {
      return 0;
    }
  }
  if (g_module_count >= kMaxModules) return 1;
  char exe[kPathBytes];
  const char* path = info->dlpi_name;
  if (path == nullptr || path[0] == '\0') {
    // The main program has no name here.
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    exe[n > 0 ? n : 0] = '\0';
    path = exe;
  }
  g_modules[g_module_count] = module;
  ++g_module_count;
  WriteModule(ring, g_module_count, module, path, strnlen(path, kPathBytes));
  return 0;
}

void WriteSite(RingWriter* ring, std::uint64_t id, const std::uintptr_t* frames, int count) {
  const int chunks = (count + static_cast<int>(VRAMSCOPE_RING_SITE_FRAMES_PER_RECORD) - 1) /
                     static_cast<int>(VRAMSCOPE_RING_SITE_FRAMES_PER_RECORD);
  for (int k = 0; k < chunks; ++k) {
    vramscope_ring_record r = NewRecord(VRAMSCOPE_RING_KIND_SITE);
    r.aux = static_cast<std::uint32_t>(count);
    r.sub = static_cast<std::uint8_t>(k);
    r.flags = static_cast<std::uint8_t>(chunks);
    r.payload.site.site = id;
    for (unsigned j = 0; j < VRAMSCOPE_RING_SITE_FRAMES_PER_RECORD; ++j) {
      const int f =
          k * static_cast<int>(VRAMSCOPE_RING_SITE_FRAMES_PER_RECORD) + static_cast<int>(j);
      r.payload.site.frames[j] = f < count ? frames[f] : 0;
    }
    (void)ring->Write(r);
  }
}

void SendSite(RingWriter* ring, std::uint64_t id, const std::uintptr_t* frames, int count) {
  bool unknown = false;
  {
    SpinLock lock;
    for (int i = 0; i < count && !unknown; ++i) unknown = !KnownModule(frames[i]);
  }
  // Modules first: the reader needs them to name the site's addresses. A module another thread
  // is adding is in the ring before it is in the table (both under g_lock).
  if (unknown) dl_iterate_phdr(AddModule, ring);
  WriteSite(ring, id, frames, count);
}

// One frame into one lane of the site hash.
inline std::uint64_t Mix(std::uint64_t lane, std::uintptr_t frame) {
  lane = (lane ^ frame) * 0x100000001b3ull;
  return lane ^ (lane >> 29);
}

}  // namespace

std::uint64_t CaptureSite(RingWriter* ring) {
  if (ring == nullptr || !Cfg().stacks) return 0;
  if (__builtin_expect(g_self_end.load(std::memory_order_acquire) == 0, 0)) {
    dl_iterate_phdr(FindSelf, nullptr);  // idempotent; racing threads store the same range
  }
  Unwound unwound;
  unwound.count = Cfg().stacks_libgcc ? -1 : FastBacktrace(unwound.frames, kMaxRawFrames);
  if (unwound.count < 0) {
    unwound.count = 0;
    _Unwind_Backtrace(CollectFrame, &unwound);
  }
  const std::uintptr_t self_start = g_self_start.load(std::memory_order_relaxed);
  const std::uintptr_t self_end = g_self_end.load(std::memory_order_relaxed);
  int first = 0;
  while (first < unwound.count && unwound.frames[first] >= self_start &&
         unwound.frames[first] < self_end) {
    ++first;
  }
  const int count = unwound.count - first < kMaxFrames ? unwound.count - first : kMaxFrames;
  if (count <= 0) return 0;
  const std::uintptr_t* frames = unwound.frames + first;
  // Four independent lanes, so the multiplications of successive frames overlap (one chain of
  // 40 frames cost more than the walk's own cache probes), then mixed into one id.
  std::uint64_t l0 = 0xcbf29ce484222325ull, l1 = 0x9E3779B97F4A7C15ull;
  std::uint64_t l2 = 0xC2B2AE3D27D4EB4Full, l3 = 0x165667B19E3779F9ull;
  int i = 0;
  for (; i + 4 <= count; i += 4) {
    l0 = Mix(l0, frames[i]);
    l1 = Mix(l1, frames[i + 1]);
    l2 = Mix(l2, frames[i + 2]);
    l3 = Mix(l3, frames[i + 3]);
  }
  for (; i < count; ++i) l0 = Mix(l0, frames[i]);
  std::uint64_t hash = static_cast<std::uint64_t>(count);
  for (const std::uint64_t lane : {l0, l1, l2, l3}) {
    hash = (hash ^ lane) * 0xff51afd7ed558ccdull;
    hash ^= hash >> 32;
  }
  if (hash == 0) hash = 1;
  std::size_t slot = (hash * 0x9E3779B97F4A7C15ull) >> 50;  // 14 bits
  for (int probe = 0; probe < kMaxProbes; ++probe, slot = (slot + 1) & (kSiteSlots - 1)) {
    std::uint64_t seen = g_sites[slot].load(std::memory_order_relaxed);
    if (seen == hash) return hash;
    if (seen != 0) continue;
    if (g_sites[slot].compare_exchange_strong(seen, hash, std::memory_order_relaxed)) {
      SendSite(ring, hash, frames, count);
      return hash;
    }
    if (seen == hash) return hash;  // another thread inserted it just now
  }
  return hash;  // table full around here: named, frames not sent
}

void StacksForkChild() {
  UnwindForkChild();
  for (auto& site : g_sites) site.store(0, std::memory_order_relaxed);
  g_module_count = 0;
  g_lock.clear(std::memory_order_relaxed);
}

}  // namespace vramscope::interposer
