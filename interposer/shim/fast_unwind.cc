#include "fast_unwind.h"

#include <dlfcn.h>  // _dl_find_object (glibc >= 2.35)
#include <pthread.h>
#include <string.h>

#include <atomic>
#include <cstddef>

namespace vramscope::interposer {
namespace {

// x86-64 DWARF register numbers.
constexpr unsigned kRegRbp = 6;
constexpr unsigned kRegRsp = 7;
constexpr unsigned kRegRa = 16;
// A frame's CFA lies above the previous one by less than this, or the walk stops.
constexpr std::uintptr_t kMaxFrameBytes = std::uintptr_t{1} << 26;

// What one code address's frame looks like (see unwind.h).
enum RuleKind : std::uint8_t { kFollow = 0, kEnd = 1, kGiveUp = 2 };
struct Rule {
  RuleKind kind = kGiveUp;
  bool cfa_is_rbp = false;  // CFA = rbp + cfa_offset, else rsp + cfa_offset
  bool rbp_saved = false;   // the caller's rbp is at CFA + rbp_offset, else rbp is unchanged
  std::int32_t cfa_offset = 0;
  std::int16_t rbp_offset = 0;
};

// A rule in one word: bits 0-31 cfa_offset, 32 cfa_is_rbp, 33 rbp_saved, 34-35 kind, 48-63
// rbp_offset.
std::uint64_t Pack(const Rule& r) {
  return std::uint64_t{static_cast<std::uint32_t>(r.cfa_offset)} |
         std::uint64_t{r.cfa_is_rbp} << 32 | std::uint64_t{r.rbp_saved} << 33 |
         std::uint64_t{r.kind} << 34 |
         std::uint64_t{static_cast<std::uint16_t>(r.rbp_offset)} << 48;
}

// The rule table: key = pc << 1 | published, 0 = empty. A writer claims an empty slot by CAS
// (key = pc << 1), stores the value, then publishes (key |= 1, release).
constexpr std::size_t kSlots = std::size_t{1} << 15;
constexpr int kProbes = 16;
struct Slot {
  std::atomic<std::uint64_t> key;
  std::atomic<std::uint64_t> value;
};
constinit Slot g_rules[kSlots] = {};
constinit std::atomic<std::uint64_t> g_rules_computed{0};
constinit std::atomic<std::uint64_t> g_walks_given_up{0};
constinit std::atomic<std::uint64_t> g_shared_lookups{0};

// --- Reading .eh_frame ---------------------------------------------------------------------------

// A bounds-free reader over mapped unwind tables (they are the loader's, read-only, complete).
struct Cursor {
  const std::uint8_t* p;
  bool ok = true;

  template <typename T>
  T Fixed() {
    T v;
    memcpy(&v, p, sizeof(v));
    p += sizeof(v);
    return v;
  }
  std::uint64_t Uleb() {
    std::uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
      const std::uint8_t b = *p++;
      if (shift < 64) v |= std::uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return v;
    }
  }
  std::int64_t Sleb() {
    std::int64_t v = 0;
    unsigned shift = 0;
    std::uint8_t b;
    do {
      b = *p++;
      if (shift < 64) v |= static_cast<std::int64_t>(std::uint64_t{b & 0x7fu} << shift);
      shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40)) v |= -(std::int64_t{1} << shift);
    return v;
  }
  // A DW_EH_PE-encoded pointer; `data_base` for datarel. Indirect pointers are followed only
  // when `follow` (the personality routine's is skipped, never read).
  std::uintptr_t Encoded(std::uint8_t encoding, std::uintptr_t data_base = 0, bool follow = true) {
    if (encoding == 0xff) return 0;  // omitted
    const auto here = reinterpret_cast<std::uintptr_t>(p);
    std::uint64_t v = 0;
    switch (encoding & 0x0f) {
      case 0x00:
        v = Fixed<std::uint64_t>();
        break;
      case 0x01:
        v = Uleb();
        break;
      case 0x02:
        v = Fixed<std::uint16_t>();
        break;
      case 0x03:
        v = Fixed<std::uint32_t>();
        break;
      case 0x04:
        v = Fixed<std::uint64_t>();
        break;
      case 0x09:
        v = static_cast<std::uint64_t>(Sleb());
        break;
      case 0x0a:
        v = static_cast<std::uint64_t>(std::int64_t{Fixed<std::int16_t>()});
        break;
      case 0x0b:
        v = static_cast<std::uint64_t>(std::int64_t{Fixed<std::int32_t>()});
        break;
      case 0x0c:
        v = Fixed<std::uint64_t>();
        break;
      default:
        ok = false;
        return 0;
    }
    switch (encoding & 0x70) {
      case 0x00:
        break;
      case 0x10:
        v += here;
        break;  // pcrel
      case 0x30:
        v += data_base;
        break;  // datarel
      default:
        ok = false;
        return 0;
    }
    if ((encoding & 0x80) && follow && v != 0) memcpy(&v, reinterpret_cast<void*>(v), 8);
    return static_cast<std::uintptr_t>(v);
  }
};

// The parts of a CIE the walk needs.
struct Cie {
  std::uint64_t code_align = 1;
  std::int64_t data_align = -8;
  std::uint8_t fde_encoding = 0;
  const std::uint8_t* instructions = nullptr;
  const std::uint8_t* end = nullptr;
  bool ok = false;
};

// Length field of a CIE or FDE: sets `*end`, returns false for the 64-bit form's absurd sizes.
bool ReadLength(Cursor* c, const std::uint8_t** end) {
  std::uint64_t length = c->Fixed<std::uint32_t>();
  if (length == 0xffffffffu) length = c->Fixed<std::uint64_t>();
  if (length == 0 || length > (std::uint64_t{1} << 32)) return false;
  *end = c->p + length;
  return true;
}

Cie ParseCie(const std::uint8_t* at) {
  Cie cie;
  Cursor c{at};
  if (!ReadLength(&c, &cie.end) || c.Fixed<std::uint32_t>() != 0) return cie;
  const std::uint8_t version = c.Fixed<std::uint8_t>();
  const char* augmentation = reinterpret_cast<const char*>(c.p);
  c.p += strlen(augmentation) + 1;
  if (augmentation[0] != '\0' && augmentation[0] != 'z') return cie;  // "eh" and older forms
  cie.code_align = c.Uleb();
  cie.data_align = c.Sleb();
  const std::uint64_t ra = version == 1 ? c.Fixed<std::uint8_t>() : c.Uleb();
  if (ra != kRegRa) return cie;
  if (augmentation[0] == 'z') {
    const std::uint64_t length = c.Uleb();
    const std::uint8_t* data_end = c.p + length;
    for (const char* a = augmentation + 1; *a != '\0'; ++a) {
      if (*a == 'R') {
        cie.fde_encoding = c.Fixed<std::uint8_t>();
      } else if (*a == 'P') {
        const std::uint8_t encoding = c.Fixed<std::uint8_t>();
        c.Encoded(encoding, 0, /*follow=*/false);
      } else if (*a == 'L') {
        c.Fixed<std::uint8_t>();
      } else if (*a == 'S') {
        return cie;  // a signal frame: libgcc knows its special case
      } else {
        break;  // unknown letters: the length lets us skip the rest
      }
    }
    c.p = data_end;
  }
  cie.instructions = c.p;
  cie.ok = c.ok;
  return cie;
}

// The register state the CFA program builds.
struct State {
  unsigned cfa_reg = kRegRsp;
  std::int64_t cfa_offset = 8;
  enum How : std::uint8_t { kSame, kOffset, kUndefined, kOther };
  How rbp = kSame;
  std::int64_t rbp_offset = 0;
  How ra = kUndefined;
  std::int64_t ra_offset = 0;
  bool cfa_expression = false;
};

void SetRule(State* s, std::uint64_t reg, State::How how, std::int64_t offset) {
  if (reg == kRegRbp) {
    s->rbp = how;
    s->rbp_offset = offset;
  } else if (reg == kRegRa) {
    s->ra = how;
    s->ra_offset = offset;
  }
}

void RestoreRule(State* s, const State& initial, std::uint64_t reg) {
  if (reg == kRegRbp) SetRule(s, reg, initial.rbp, initial.rbp_offset);
  if (reg == kRegRa) SetRule(s, reg, initial.ra, initial.ra_offset);
}

// DW_CFA_advance_loc1/2/4: sets `*advance` to the operand; false for any other op.
bool AdvanceOp(Cursor* c, std::uint8_t op, std::uint64_t* advance) {
  switch (op) {
    case 0x02:
      *advance = c->Fixed<std::uint8_t>();
      return true;
    case 0x03:
      *advance = c->Fixed<std::uint16_t>();
      return true;
    case 0x04:
      *advance = c->Fixed<std::uint32_t>();
      return true;
    default:
      return false;
  }
}

// The ops that define the CFA (def_cfa and its variants); false for any other op, which is left
// unread.
bool CfaOp(Cursor* c, std::uint8_t op, const Cie& cie, State* s) {
  switch (op) {
    case 0x0c:
      s->cfa_reg = static_cast<unsigned>(c->Uleb());
      s->cfa_offset = static_cast<std::int64_t>(c->Uleb());
      s->cfa_expression = false;
      return true;
    case 0x0d:
      s->cfa_reg = static_cast<unsigned>(c->Uleb());
      return true;
    case 0x0e:
      s->cfa_offset = static_cast<std::int64_t>(c->Uleb());
      return true;
    case 0x0f:  // def_cfa_expression
      c->p += c->Uleb();
      s->cfa_expression = true;
      return true;
    case 0x12:
      s->cfa_reg = static_cast<unsigned>(c->Uleb());
      s->cfa_offset = c->Sleb() * cie.data_align;
      s->cfa_expression = false;
      return true;
    case 0x13:
      s->cfa_offset = c->Sleb() * cie.data_align;
      return true;
    default:
      return false;
  }
}

// The extended ops that set one register's rule; false for any other op, which is left unread.
bool RegisterOp(Cursor* c, std::uint8_t op, const Cie& cie, const State& initial, State* s) {
  switch (op) {
    case 0x05: {  // offset_extended
      const std::uint64_t reg = c->Uleb();
      SetRule(s, reg, State::kOffset, static_cast<std::int64_t>(c->Uleb()) * cie.data_align);
      return true;
    }
    case 0x06:
      RestoreRule(s, initial, c->Uleb());
      return true;
    case 0x07:
      SetRule(s, c->Uleb(), State::kUndefined, 0);
      return true;
    case 0x08:
      SetRule(s, c->Uleb(), State::kSame, 0);
      return true;
    case 0x09: {  // register
      const std::uint64_t reg = c->Uleb();
      c->Uleb();
      SetRule(s, reg, State::kOther, 0);
      return true;
    }
    case 0x10:    // expression
    case 0x16: {  // val_expression
      const std::uint64_t reg = c->Uleb();
      c->p += c->Uleb();
      SetRule(s, reg, State::kOther, 0);
      return true;
    }
    case 0x11: {  // offset_extended_sf
      const std::uint64_t reg = c->Uleb();
      SetRule(s, reg, State::kOffset, c->Sleb() * cie.data_align);
      return true;
    }
    case 0x14:    // val_offset
    case 0x15: {  // val_offset_sf
      const std::uint64_t reg = c->Uleb();
      if (op == 0x14)
        c->Uleb();
      else
        c->Sleb();
      SetRule(s, reg, State::kOther, 0);
      return true;
    }
    case 0x2f: {  // GNU_negative_offset_extended
      const std::uint64_t reg = c->Uleb();
      SetRule(s, reg, State::kOffset, -static_cast<std::int64_t>(c->Uleb()) * cie.data_align);
      return true;
    }
    default:
      return false;
  }
}

// Runs a CFA program from `loc` until the location passes `pc` (pc 0: the whole program, for a
// CIE's initial instructions). Returns false on an instruction it does not know.
bool RunProgram(Cursor c, const std::uint8_t* end, const Cie& cie, std::uintptr_t loc,
                std::uintptr_t pc, const State& initial, State* s) {
  State stack[8];
  int depth = 0;
  while (c.p < end && c.ok) {
    const std::uint8_t op = c.Fixed<std::uint8_t>();
    std::uint64_t advance = 0;
    switch (op >> 6) {
      case 1:
        advance = op & 0x3f;
        break;
      case 2:
        SetRule(s, op & 0x3f, State::kOffset, static_cast<std::int64_t>(c.Uleb()) * cie.data_align);
        continue;
      case 3:
        RestoreRule(s, initial, op & 0x3f);
        continue;
      default:
        break;
    }
    // An advance_loc of delta 0 reaches the ops below as an unknown one: the walk gives up.
    if (advance == 0 && !AdvanceOp(&c, op, &advance)) {
      if (op == 0x0a) {  // remember_state
        if (depth == 8) return false;
        stack[depth++] = *s;
      } else if (op == 0x0b) {  // restore_state
        if (depth == 0) return false;
        // The CFA rule comes back with the registers' rules, as libgcc restores it.
        *s = stack[--depth];
      } else if (op == 0x2e) {  // GNU_args_size
        c.Uleb();
      } else if (op != 0x00 && !CfaOp(&c, op, cie, s) && !RegisterOp(&c, op, cie, initial, s)) {
        return false;  // set_loc and anything newer (0x00 is nop)
      }
      continue;
    }
    loc += advance * cie.code_align;
    if (pc != 0 && loc > pc) break;
  }
  return c.ok;
}

Rule RuleFromState(const State& s) {
  Rule r;
  if (s.ra == State::kUndefined) {
    r.kind = kEnd;
    return r;
  }
  if (s.cfa_expression || (s.cfa_reg != kRegRsp && s.cfa_reg != kRegRbp) ||
      s.ra != State::kOffset || s.ra_offset != -8 || s.cfa_offset < 0 || s.cfa_offset > INT32_MAX ||
      s.rbp == State::kUndefined || s.rbp == State::kOther || s.rbp_offset < INT16_MIN ||
      s.rbp_offset > INT16_MAX) {
    return r;  // kGiveUp
  }
  r.kind = kFollow;
  r.cfa_is_rbp = s.cfa_reg == kRegRbp;
  r.cfa_offset = static_cast<std::int32_t>(s.cfa_offset);
  r.rbp_saved = s.rbp == State::kOffset;
  r.rbp_offset = static_cast<std::int16_t>(s.rbp_offset);
  return r;
}

// The FDE covering `pc` through .eh_frame_hdr's search table, or null.
const std::uint8_t* FindFde(const std::uint8_t* hdr, std::uintptr_t pc) {
  if (hdr[0] != 1 || hdr[3] != 0x3b) return nullptr;  // version 1; datarel sdata4 table
  Cursor c{hdr + 4};
  const auto base = reinterpret_cast<std::uintptr_t>(hdr);
  c.Encoded(hdr[1], base);
  const std::uintptr_t count = c.Encoded(hdr[2], base);
  if (!c.ok || count == 0) return nullptr;
  const auto* table = c.p;
  std::size_t lo = 0, hi = count;  // the last entry whose start is <= pc
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    std::int32_t start;
    memcpy(&start, table + mid * 8, 4);
    if (base + static_cast<std::intptr_t>(start) <= pc)
      lo = mid;
    else
      hi = mid;
  }
  std::int32_t start, fde;
  memcpy(&start, table + lo * 8, 4);
  memcpy(&fde, table + lo * 8 + 4, 4);
  if (base + static_cast<std::intptr_t>(start) > pc) return nullptr;
  return reinterpret_cast<const std::uint8_t*>(base + static_cast<std::intptr_t>(fde));
}

// x86-64 Linux's signal return trampoline: mov $15, %rax; syscall. libgcc unwinds through it
// without unwind tables; this walk does not.
bool IsSigreturn(std::uintptr_t pc) {
  static constexpr std::uint8_t kCode[] = {0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05};
  return memcmp(reinterpret_cast<const void*>(pc), kCode, sizeof(kCode)) == 0;
}

Rule ComputeRule(std::uintptr_t pc) {
  Rule end;
  end.kind = kEnd;
  dl_find_object object;
  if (_dl_find_object(reinterpret_cast<void*>(pc), &object) != 0) return end;
  if (object.dlfo_eh_frame == nullptr) return IsSigreturn(pc) ? Rule{} : end;
  const std::uint8_t* fde = FindFde(static_cast<const std::uint8_t*>(object.dlfo_eh_frame), pc);
  if (fde == nullptr) return IsSigreturn(pc) ? Rule{} : end;
  Cursor c{fde};
  const std::uint8_t* fde_end;
  if (!ReadLength(&c, &fde_end)) return Rule{};
  const std::uint8_t* id_at = c.p;
  const std::uint32_t cie_offset = c.Fixed<std::uint32_t>();
  const Cie cie = ParseCie(id_at - cie_offset);
  if (!cie.ok) return Rule{};
  const std::uintptr_t begin = c.Encoded(cie.fde_encoding);
  const std::uintptr_t range = c.Encoded(cie.fde_encoding & 0x0f);
  if (!c.ok || pc < begin || pc - begin >= range) return IsSigreturn(pc) ? Rule{} : end;
  c.p += c.Uleb();  // augmentation data ('z' is the only form ParseCie accepts)
  State initial;
  if (!RunProgram(Cursor{cie.instructions}, cie.end, cie, 0, 0, initial, &initial)) return Rule{};
  State state = initial;
  if (!RunProgram(c, fde_end, cie, begin, pc, initial, &state)) return Rule{};
  return RuleFromState(state);
}

// The packed rule of `pc` from the shared table, computing and inserting it when missing.
std::uint64_t Lookup(std::uintptr_t pc) {
  const std::uint64_t want = std::uint64_t{pc} << 1 | 1;
  std::size_t slot = (pc * 0x9E3779B97F4A7C15ull) >> 49;  // 15 bits
  for (int probe = 0; probe < kProbes; ++probe, slot = (slot + 1) & (kSlots - 1)) {
    std::uint64_t key = g_rules[slot].key.load(std::memory_order_acquire);
    if (key == want) return g_rules[slot].value.load(std::memory_order_relaxed);
    if (key != 0) continue;
    const std::uint64_t rule = Pack(ComputeRule(pc));
    g_rules_computed.fetch_add(1, std::memory_order_relaxed);
    if (g_rules[slot].key.compare_exchange_strong(key, want & ~std::uint64_t{1},
                                                  std::memory_order_acq_rel)) {
      g_rules[slot].value.store(rule, std::memory_order_relaxed);
      g_rules[slot].key.store(want, std::memory_order_release);
    }
    return rule;
  }
  g_rules_computed.fetch_add(1, std::memory_order_relaxed);
  return Pack(ComputeRule(pc));  // a crowded neighbourhood: not cached
}

// Each thread's previous walk: the code address looked up at each depth and its packed rule.
// Allocations repeat their call paths, so a walk mostly meets, depth by depth, the addresses of
// the walk before; the expected address and rule are then read from this small array in order
// (independent of the stack loads, so the processor fetches them ahead) instead of probing the
// shared table, whose slots lie a page apart. Addresses that differ from the previous walk's
// (another call site near the top of the stack) go to a small direct-mapped table of the
// thread's recent addresses next, and to the shared table last. A rule depends only on its
// address: an entry is right whatever walk wrote it. Zero-initialised: address 0 is never
// looked up. Not for signal handlers that allocate during an allocation (the pool's locks rule
// that out already): an interrupted entry update could pair an address with another's rule.
constexpr int kCachedDepth = 128;
constexpr int kRecentSlots = 256;
struct CacheEntry {
  std::uintptr_t pc;
  std::uint64_t rule;
};
struct WalkCache {
  CacheEntry depth[kCachedDepth];
  CacheEntry recent[kRecentSlots];
};

// The caches live in a fixed pool, a thread holding one from its first walk to its exit (a
// pthread key's destructor gives it back): thread-local storage holds only the pointer, because
// the shim's thread-local block must fit the loader's static TLS surplus when the driver dlopens
// it as an injection (CUDA_INJECTION64_PATH), and 6 KiB a thread does not. Entries need no reset
// when a cache changes hands (a rule is right whoever wrote it). Threads beyond the pool walk
// through the shared table alone.
constexpr int kCachePool = 512;
constinit WalkCache g_caches[kCachePool] = {};
constinit std::atomic<std::uint64_t> g_cache_used[kCachePool / 64] = {};
constinit std::atomic<int> g_cache_key_state{0};  // 0 none, 1 being made, 2 made, 3 failed
constinit pthread_key_t g_cache_key = 0;
__attribute__((tls_model("initial-exec"))) constinit thread_local WalkCache* t_walk = nullptr;

// On the exiting thread (or on a failed claim): a walk after this claims a cache again.
void ReleaseCache(void* cache) {
  t_walk = nullptr;
  const auto index = static_cast<WalkCache*>(cache) - g_caches;
  g_cache_used[index / 64].fetch_and(~(std::uint64_t{1} << (index % 64)),
                                     std::memory_order_release);
}

// The calling thread's cache, claimed on its first walk; null when the pool is empty (tried
// again on later walks) or no thread-exit hook could be made.
__attribute__((noinline)) WalkCache* ClaimCache() {
  int state = g_cache_key_state.load(std::memory_order_acquire);
  if (state == 0 && g_cache_key_state.compare_exchange_strong(state, 1)) {
    state = pthread_key_create(&g_cache_key, ReleaseCache) == 0 ? 2 : 3;
    g_cache_key_state.store(state, std::memory_order_release);
  }
  while (state == 1) state = g_cache_key_state.load(std::memory_order_acquire);
  if (state != 2) return nullptr;
  for (int word = 0; word < kCachePool / 64; ++word) {
    std::uint64_t used = g_cache_used[word].load(std::memory_order_relaxed);
    while (~used != 0) {
      const int bit = __builtin_ctzll(~used);
      if (g_cache_used[word].compare_exchange_weak(used, used | std::uint64_t{1} << bit,
                                                   std::memory_order_acquire)) {
        WalkCache* cache = &g_caches[word * 64 + bit];
        if (pthread_setspecific(g_cache_key, cache) != 0) {
          ReleaseCache(cache);
          return nullptr;
        }
        t_walk = cache;
        return cache;
      }
    }
  }
  return nullptr;
}

// The rule of `pc` when the walk before had another address at this depth: from the thread's
// recent addresses, else the shared table (and then kept among the recent ones). Out of line,
// so the walk's loop keeps its registers.
__attribute__((noinline)) std::uint64_t RecentOrShared(WalkCache* cache, std::uintptr_t pc) {
  CacheEntry& recent = cache->recent[(pc * 0x9E3779B97F4A7C15ull) >> 56];  // 8 bits
  if (recent.pc == pc) return recent.rule;
  g_shared_lookups.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t rule = Lookup(pc);
  recent.pc = pc;
  recent.rule = rule;
  return rule;
}

// Packed rule fields the walk tests (see Pack).
constexpr std::uint64_t kKindBits = std::uint64_t{3} << 34;  // kFollow is 0
constexpr std::uint64_t kCfaIsRbpBit = std::uint64_t{1} << 32;
constexpr std::uint64_t kRbpSavedBit = std::uint64_t{1} << 33;

// The walk from a frame whose code address, rsp and rbp are given; with the thread's cache, or
// (kCached false) a shared table lookup for every frame.
template <bool kCached>
__attribute__((always_inline)) inline int Walk(WalkCache* cache, std::uintptr_t pc,
                                               std::uintptr_t sp, std::uintptr_t bp,
                                               std::uintptr_t* frames, int max) {
  const int limit = max < kCachedDepth ? max : kCachedDepth;
  int count = 0;
  for (; count < limit; ++count) {
    std::uint64_t rule;
    if constexpr (kCached) {
      CacheEntry& entry = cache->depth[count];
      rule = entry.rule;
      if (__builtin_expect(entry.pc != pc, 0)) {
        rule = RecentOrShared(cache, pc);
        entry.pc = pc;
        entry.rule = rule;
      }
    } else {
      g_shared_lookups.fetch_add(1, std::memory_order_relaxed);
      rule = Lookup(pc);
    }
    // Fields tested in place: a Rule struct here went through the stack.
    if (__builtin_expect((rule & kKindBits) != 0, 0)) {
      if ((rule & kKindBits) == std::uint64_t{kEnd} << 34) return count;
      break;  // kGiveUp
    }
    const std::uintptr_t cfa = ((rule & kCfaIsRbpBit) != 0 ? bp : sp) +
                               static_cast<std::uintptr_t>(static_cast<std::int32_t>(rule));
    if (cfa - sp - 1 >= kMaxFrameBytes) break;  // the CFA must grow, by at most kMaxFrameBytes
    std::uintptr_t ra;
    memcpy(&ra, reinterpret_cast<const void*>(cfa - 8), sizeof(ra));
    if ((rule & kRbpSavedBit) != 0) {
      const auto rbp_offset = static_cast<std::int16_t>(static_cast<std::uint16_t>(rule >> 48));
      memcpy(&bp, reinterpret_cast<const void*>(cfa + rbp_offset), 8);
    }
    if (ra == 0) return count;
    frames[count] = ra;
    sp = cfa;
    pc = ra - 1;  // callers' code addresses are return address - 1
  }
  if (count == limit) return count;
  g_walks_given_up.fetch_add(1, std::memory_order_relaxed);
  return -1;
}

}  // namespace

__attribute__((noinline)) int FastBacktrace(std::uintptr_t* frames, int max) {
  std::uintptr_t ip, sp, bp;
  // rbp first (an output may be given rbp's register), rip last: `ip` is the address of the
  // instruction after the lea, where rsp and rbp still hold what was read.
  asm volatile(
      "mov %%rbp, %2\n\t"
      "mov %%rsp, %1\n\t"
      "lea 0(%%rip), %0"
      : "=r"(ip), "=r"(sp), "=r"(bp));
  WalkCache* cache = t_walk;
  if (__builtin_expect(cache == nullptr, 0)) cache = ClaimCache();
  return cache != nullptr ? Walk<true>(cache, ip, sp, bp, frames, max)
                          : Walk<false>(nullptr, ip, sp, bp, frames, max);
}

void UnwindForkChild() {
  // The other threads' caches are not theirs any more (those threads do not exist here).
  for (auto& word : g_cache_used) word.store(0, std::memory_order_relaxed);
  if (t_walk != nullptr) {
    const auto index = t_walk - g_caches;
    g_cache_used[index / 64].fetch_or(std::uint64_t{1} << (index % 64), std::memory_order_relaxed);
  }
}

UnwindCounters GetUnwindCounters() {
  return {g_rules_computed.load(std::memory_order_relaxed),
          g_walks_given_up.load(std::memory_order_relaxed),
          g_shared_lookups.load(std::memory_order_relaxed)};
}

}  // namespace vramscope::interposer
