#include "nvtx.h"

#include <string.h>
#include <wchar.h>

#include <cstddef>

#include "nvtx_ranges.h"
#include "ring_events.h"
#include "shim.h"

// Types only: the NVTX implementation (and its weak injection symbols) stays out of the shim.
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

namespace vramscope::interposer {
namespace {

using nvtx_internal::g_any_range;
using nvtx_internal::kMaxDepth;
using nvtx_internal::t_stack;
using nvtx_internal::ThreadStack;

constexpr int kMaxDomains = 256;  // index 0 = the default domain
constexpr int kDomainNameBytes = 64;
constexpr int kMaxStrings = 4096;
constexpr int kStringBytes = VRAMSCOPE_RING_MAX_NVTX_TEXT;

// What nvtxDomainHandle_t and nvtxStringHandle_t point at (NVTX treats both as opaque).
struct Domain {
  std::uint16_t len;
  char name[kDomainNameBytes];
};
struct RegisteredString {
  std::uint16_t len;
  char text[kStringBytes];
};

constinit Domain g_domains[kMaxDomains] = {};
constinit std::atomic<int> g_domain_count{1};
// Serialises domain creation (rare) so two threads creating the same name get one handle.
constinit std::atomic_flag g_domain_lock = ATOMIC_FLAG_INIT;
constinit RegisteredString g_strings[kMaxStrings] = {};
constinit std::atomic<int> g_string_count{0};
// Range ids: process-unique, never 0.
constinit std::atomic<std::uint32_t> g_next_range{1};
// Set once the shim's initialisation was attempted for NVTX (the first push may precede every
// driver call; the ring opens with the shim).
constinit std::atomic<bool> g_init_tried{false};

RingWriter* NvtxRing() {
  RingWriter* ring = Ring();
  if (__builtin_expect(ring != nullptr, 1)) return ring;
  if (!g_init_tried.load(std::memory_order_relaxed)) {
    g_init_tried.store(true, std::memory_order_relaxed);
    (void)EnsureDriver();
  } else {
    MaybeOpenPendingRing();
  }
  return Ring();
}

// Length of the longest prefix of s[0, len) that is at most `limit` bytes and ends on a UTF-8
// character boundary (the proto string the reader makes of it must stay valid UTF-8).
std::size_t Utf8Prefix(const char* s, std::size_t len, std::size_t limit) {
  if (len <= limit) return len;
  std::size_t n = limit;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

// Wide (UTF-32 on Linux) to UTF-8 into out[0, cap); returns bytes written, whole characters only.
std::size_t WideToUtf8(const wchar_t* in, char* out, std::size_t cap) {
  std::size_t n = 0;
  if (in == nullptr) return 0;
  for (; *in != 0; ++in) {
    std::uint32_t c = static_cast<std::uint32_t>(*in);
    if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) c = 0xFFFD;
    unsigned char buf[4];
    std::size_t k;
    if (c < 0x80) {
      buf[0] = static_cast<unsigned char>(c);
      k = 1;
    } else if (c < 0x800) {
      buf[0] = static_cast<unsigned char>(0xC0 | (c >> 6));
      buf[1] = static_cast<unsigned char>(0x80 | (c & 0x3F));
      k = 2;
    } else if (c < 0x10000) {
      buf[0] = static_cast<unsigned char>(0xE0 | (c >> 12));
      buf[1] = static_cast<unsigned char>(0x80 | ((c >> 6) & 0x3F));
      buf[2] = static_cast<unsigned char>(0x80 | (c & 0x3F));
      k = 3;
    } else {
      buf[0] = static_cast<unsigned char>(0xF0 | (c >> 18));
      buf[1] = static_cast<unsigned char>(0x80 | ((c >> 12) & 0x3F));
      buf[2] = static_cast<unsigned char>(0x80 | ((c >> 6) & 0x3F));
      buf[3] = static_cast<unsigned char>(0x80 | (c & 0x3F));
      k = 4;
    }
    if (n + k > cap) break;
    memcpy(out + n, buf, k);
    n += k;
  }
  return n;
}

// A message, borrowed (ASCII, registered) or converted into `buffer` (wide).
struct Text {
  const char* data = "";
  std::size_t len = 0;
};

Text AsciiText(const char* s) {
  Text t;
  if (s != nullptr) {
    t.data = s;
    t.len = strnlen(s, kStringBytes + 1);
  }
  return t;
}

Text MessageText(const nvtxEventAttributes_t* attrib, char* buffer) {
  if (attrib == nullptr) return {};
  // Fields up to `message` exist in every version of the struct NVTX v2/v3 hands out.
  switch (attrib->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII:
      return AsciiText(attrib->message.ascii);
    case NVTX_MESSAGE_TYPE_UNICODE:
      return {buffer, WideToUtf8(attrib->message.unicode, buffer, kStringBytes)};
    case NVTX_MESSAGE_TYPE_REGISTERED: {
      const auto* s = reinterpret_cast<const RegisteredString*>(attrib->message.registered);
      if (s == nullptr) return {};
      return {s->text, s->len};
    }
    default:
      return {};
  }
}

std::uint16_t DomainIndex(nvtxDomainHandle_t domain) {
  if (domain == nullptr) return 0;
  const auto* d = reinterpret_cast<const Domain*>(domain);
  if (d < g_domains || d >= g_domains + kMaxDomains) return 0;
  return static_cast<std::uint16_t>(d - g_domains);
}

void Record(std::uint32_t id, std::uint32_t parent, std::uint32_t category, Text name,
            std::uint16_t domain) {
  RingWriter* ring = NvtxRing();
  if (ring == nullptr) return;
  const Domain& d = g_domains[domain];
  const std::size_t name_len =
      Utf8Prefix(name.data, name.len, VRAMSCOPE_RING_MAX_NVTX_TEXT - std::size_t{d.len});
  (void)ring->RecordNvtxPush(0, id, parent, category, name.data, name_len, d.name, d.len);
}

int Push(std::uint16_t domain, std::uint32_t category, Text name) {
  ThreadStack& stack = t_stack;
  int level = 0;
  for (int i = 0; i < stack.depth; ++i) level += stack.domains[i] == domain ? 1 : 0;
  if (stack.depth >= kMaxDepth) {
    ++stack.overflow;
    return level + stack.overflow - 1;
  }
  const std::uint32_t id = g_next_range.fetch_add(1, std::memory_order_relaxed);
  const std::uint32_t parent = stack.depth > 0 ? stack.ids[stack.depth - 1] : 0;
  // The record first, then the stack: an allocation on this thread names the range only once
  // its push is in the ring ahead of it.
  Record(id, parent, category, name, domain);
  stack.ids[stack.depth] = id;
  stack.domains[stack.depth] = domain;
  ++stack.depth;
  if (!g_any_range.load(std::memory_order_relaxed)) {
    g_any_range.store(true, std::memory_order_relaxed);
  }
  return level;
}

int Pop(std::uint16_t domain) {
  ThreadStack& stack = t_stack;
  if (stack.overflow > 0) {
    --stack.overflow;
    return kMaxDepth;  // approximate: deeper than we track
  }
  int i = stack.depth - 1;
  while (i >= 0 && stack.domains[i] != domain) --i;
  if (i < 0) return -1;  // NVTX: a pop without a push is an error (negative)
  const std::uint32_t id = stack.ids[i];
  int level = 0;
  for (int j = 0; j < i; ++j) level += stack.domains[j] == domain ? 1 : 0;
  for (int j = i; j + 1 < stack.depth; ++j) {
    stack.ids[j] = stack.ids[j + 1];
    stack.domains[j] = stack.domains[j + 1];
  }
  --stack.depth;
  if (RingWriter* ring = Ring()) (void)ring->RecordNvtxPop(0, id);
  return level;
}

nvtxRangeId_t Start(std::uint16_t domain, const nvtxEventAttributes_t* attrib) {
  char buffer[kStringBytes];
  const std::uint32_t id = g_next_range.fetch_add(1, std::memory_order_relaxed);
  Record(id, 0, attrib != nullptr ? attrib->category : 0, MessageText(attrib, buffer), domain);
  return id;
}

void End(nvtxRangeId_t id) {
  if (id == 0 || id > 0xFFFFFFFFu) return;
  if (RingWriter* ring = Ring()) (void)ring->RecordNvtxPop(0, static_cast<std::uint32_t>(id));
}

// --- CORE ------------------------------------------------------------------------------------

int RangePushA(const char* message) { return Push(0, 0, AsciiText(message)); }

int RangePushW(const wchar_t* message) {
  char buffer[kStringBytes];
  return Push(0, 0, {buffer, WideToUtf8(message, buffer, kStringBytes)});
}

int RangePushEx(const nvtxEventAttributes_t* attrib) {
  char buffer[kStringBytes];
  return Push(0, attrib != nullptr ? attrib->category : 0, MessageText(attrib, buffer));
}

int RangePop() { return Pop(0); }

nvtxRangeId_t RangeStartEx(const nvtxEventAttributes_t* attrib) { return Start(0, attrib); }

nvtxRangeId_t RangeStartA(const char* message) {
  nvtxEventAttributes_t attrib = {};
  attrib.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attrib.message.ascii = message;
  return Start(0, &attrib);
}

nvtxRangeId_t RangeStartW(const wchar_t* message) {
  nvtxEventAttributes_t attrib = {};
  attrib.messageType = NVTX_MESSAGE_TYPE_UNICODE;
  attrib.message.unicode = message;
  return Start(0, &attrib);
}

void RangeEnd(nvtxRangeId_t id) { End(id); }

// --- CORE2 (domains) ---------------------------------------------------------------------------

int DomainRangePushEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attrib) {
  char buffer[kStringBytes];
  return Push(DomainIndex(domain), attrib != nullptr ? attrib->category : 0,
              MessageText(attrib, buffer));
}

int DomainRangePop(nvtxDomainHandle_t domain) { return Pop(DomainIndex(domain)); }

nvtxRangeId_t DomainRangeStartEx(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attrib) {
  return Start(DomainIndex(domain), attrib);
}

void DomainRangeEnd(nvtxDomainHandle_t /*domain*/, nvtxRangeId_t id) { End(id); }

nvtxDomainHandle_t CreateDomain(const char* name, std::size_t len) {
  len = Utf8Prefix(name, len, kDomainNameBytes);
  while (g_domain_lock.test_and_set(std::memory_order_acquire)) {
  }
  const int count = g_domain_count.load(std::memory_order_relaxed);
  int found = 0;
  for (int i = 1; i < count; ++i) {
    if (g_domains[i].len == len && memcmp(g_domains[i].name, name, len) == 0) {
      found = i;
      break;
    }
  }
  if (found == 0 && count < kMaxDomains) {
    memcpy(g_domains[count].name, name, len);
    g_domains[count].len = static_cast<std::uint16_t>(len);
    g_domain_count.store(count + 1, std::memory_order_release);
    found = count;
  }
  g_domain_lock.clear(std::memory_order_release);
  // Table full: the default domain (index 0, unnamed) rather than an invalid handle.
  return reinterpret_cast<nvtxDomainHandle_t>(&g_domains[found]);
}

nvtxDomainHandle_t DomainCreateA(const char* name) {
  if (name == nullptr) return nullptr;
  return CreateDomain(name, strnlen(name, kDomainNameBytes + 4));
}

nvtxDomainHandle_t DomainCreateW(const wchar_t* name) {
  if (name == nullptr) return nullptr;
  char buffer[kDomainNameBytes];
  return CreateDomain(buffer, WideToUtf8(name, buffer, sizeof(buffer)));
}

void DomainDestroy(nvtxDomainHandle_t /*domain*/) {
  // Handles stay valid for the life of the process (ranges in flight may still name them).
}

nvtxStringHandle_t RegisterString(const char* text, std::size_t len) {
  const int index = g_string_count.fetch_add(1, std::memory_order_relaxed);
  if (index >= kMaxStrings) {
    g_string_count.store(kMaxStrings, std::memory_order_relaxed);
    return nullptr;  // ranges naming it get an empty name
  }
  RegisteredString& s = g_strings[index];
  len = Utf8Prefix(text, len, kStringBytes);
  memcpy(s.text, text, len);
  s.len = static_cast<std::uint16_t>(len);
  return reinterpret_cast<nvtxStringHandle_t>(&s);
}

nvtxStringHandle_t DomainRegisterStringA(nvtxDomainHandle_t /*domain*/, const char* text) {
  if (text == nullptr) return nullptr;
  return RegisterString(text, strnlen(text, kStringBytes + 4));
}

nvtxStringHandle_t DomainRegisterStringW(nvtxDomainHandle_t /*domain*/, const wchar_t* text) {
  if (text == nullptr) return nullptr;
  char buffer[kStringBytes];
  return RegisterString(buffer, WideToUtf8(text, buffer, sizeof(buffer)));
}

void Initialize(const void* /*reserved*/) {}

template <typename F>
void Assign(NvtxFunctionTable table, unsigned int size, unsigned int id, F function) {
  if (table == nullptr || id >= size || table[id] == nullptr) return;
  *table[id] = reinterpret_cast<NvtxFunctionPointer>(function);
}

}  // namespace

}  // namespace vramscope::interposer

extern "C" int InitializeInjectionNvtx2(const void* (*get_export_table)(std::uint32_t)) {
  namespace i = vramscope::interposer;
  if (get_export_table == nullptr) return 0;
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->struct_size < sizeof(NvtxExportTableCallbacks) ||
      callbacks->GetModuleFunctionTable == nullptr) {
    return 0;
  }
  NvtxFunctionTable core = nullptr;
  unsigned int core_size = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &core_size) == 0)
    core = nullptr;
  NvtxFunctionTable core2 = nullptr;
  unsigned int core2_size = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core2, &core2_size) == 0) {
    core2 = nullptr;
  }
  if (core == nullptr && core2 == nullptr) return 0;
  i::Assign(core, core_size, NVTX_CBID_CORE_RangeStartEx, &i::RangeStartEx);
  i::Assign(core, core_size, NVTX_CBID_CORE_RangeStartA, &i::RangeStartA);
  i::Assign(core, core_size, NVTX_CBID_CORE_RangeStartW, &i::RangeStartW);
  i::Assign(core, core_size, NVTX_CBID_CORE_RangeEnd, &i::RangeEnd);
  i::Assign(core, core_size, NVTX_CBID_CORE_RangePushEx, &i::RangePushEx);
  i::Assign(core, core_size, NVTX_CBID_CORE_RangePushA, &i::RangePushA);
  i::Assign(core, core_size, NVTX_CBID_CORE_RangePushW, &i::RangePushW);
  i::Assign(core, core_size, NVTX_CBID_CORE_RangePop, &i::RangePop);
  i::Assign(core2, core2_size, NVTX_CBID_CORE2_DomainRangeStartEx, &i::DomainRangeStartEx);
  i::Assign(core2, core2_size, NVTX_CBID_CORE2_DomainRangeEnd, &i::DomainRangeEnd);
  i::Assign(core2, core2_size, NVTX_CBID_CORE2_DomainRangePushEx, &i::DomainRangePushEx);
  i::Assign(core2, core2_size, NVTX_CBID_CORE2_DomainRangePop, &i::DomainRangePop);
  i::Assign(core2, core2_size, NVTX_CBID_CORE2_DomainRegisterStringA, &i::DomainRegisterStringA);
  i::Assign(core2, core2_size, NVTX_CBID_CORE2_DomainRegisterStringW, &i::DomainRegisterStringW);
  i::Assign(core2, core2_size, NVTX_CBID_CORE2_DomainCreateA, &i::DomainCreateA);
  i::Assign(core2, core2_size, NVTX_CBID_CORE2_DomainCreateW, &i::DomainCreateW);
  i::Assign(core2, core2_size, NVTX_CBID_CORE2_DomainDestroy, &i::DomainDestroy);
  i::Assign(core2, core2_size, NVTX_CBID_CORE2_Initialize, &i::Initialize);
  return 1;
}
