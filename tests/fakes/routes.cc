// Route helpers that need only libdl. See routes.h.
#include "routes.h"

#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#include <string>
#include <type_traits>
#include <vector>

namespace vramscope::fake {
namespace {

constexpr const char* kDriverSoname = "libcuda.so.1";

// Function pointer <-> void* without a cast ISO C++ leaves conditionally-supported.
void SetAt(DriverApi* api, size_t offset, void* fn) {
  memcpy(reinterpret_cast<char*>(api) + offset, &fn, sizeof(fn));
}

template <typename F>
F FromVoid(void* p) {
  static_assert(sizeof(F) == sizeof(void*));
  F f;
  memcpy(&f, &p, sizeof(f));
  return f;
}

template <typename F>
void* ToVoid(F f) {
  static_assert(sizeof(F) == sizeof(void*));
  void* p;
  memcpy(&p, &f, sizeof(p));
  return p;
}

struct Row {
  EntryPoint entry;
  size_t offset;
};

const std::vector<Row>& Rows() {
  static const std::vector<Row>* rows = new std::vector<Row>{
#define VRAMSCOPE_FAKE_ROW(member, direct, exported, symbol, version, per_thread, pfn) \
  Row{EntryPoint{#member, exported, symbol, version, per_thread != 0}, offsetof(DriverApi, member)},
      VRAMSCOPE_FAKE_DRIVER_API(VRAMSCOPE_FAKE_ROW)
#undef VRAMSCOPE_FAKE_ROW
  };
  return *rows;
}

void* OpenDriver(std::string* error) {
  void* h = dlopen(kDriverSoname, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr && error != nullptr) {
    const char* why = dlerror();
    *error = std::string("dlopen(libcuda.so.1) failed: ") + (why != nullptr ? why : "?");
  }
  return h;
}

std::string Describe(const char* what, const char* symbol, int version, cuuint64_t flags,
                     CUresult r, const void* p, CUdriverProcAddressQueryResult status) {
  return std::string(what) + "(\"" + symbol + "\", v=" + std::to_string(version) +
         ", flags=" + std::to_string(flags) + ") -> result " + std::to_string(r) + ", pfn " +
         (p == nullptr ? "NULL" : "set") + ", status " + std::to_string(status);
}

}  // namespace

const std::vector<EntryPoint>& EntryPoints() {
  static const std::vector<EntryPoint>* entries = [] {
    auto* v = new std::vector<EntryPoint>;
    for (const Row& r : Rows()) v->push_back(r.entry);
    return v;
  }();
  return *entries;
}

void* Get(const DriverApi& api, const EntryPoint& entry) {
  for (const Row& r : Rows()) {
    if (strcmp(r.entry.member, entry.member) == 0) {
      void* p;
      memcpy(&p, reinterpret_cast<const char*>(&api) + r.offset, sizeof(p));
      return p;
    }
  }
  return nullptr;
}

std::string ModuleOf(const void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

bool LoadByDlsym(DriverApi* api, std::string* error) {
  *api = DriverApi{};
  void* h = OpenDriver(error);
  if (h == nullptr) return false;
  for (const Row& r : Rows()) {
    void* p = dlsym(h, r.entry.exported);
    if (p == nullptr) {
      *error = std::string("dlsym(libcuda.so.1, \"") + r.entry.exported + "\") returned NULL";
      return false;
    }
    SetAt(api, r.offset, p);
  }
  return true;
}

bool LoadByProcAddress(DriverApi* api, std::string* error) {
  *api = DriverApi{};
  void* h = OpenDriver(error);
  if (h == nullptr) return false;
  // The runtime's only dlsym of a driver symbol.
  auto gpa = FromVoid<PFN_cuGetProcAddress_v12000>(dlsym(h, "cuGetProcAddress_v2"));
  if (gpa == nullptr) {
    *error = "dlsym(libcuda.so.1, \"cuGetProcAddress_v2\") returned NULL";
    return false;
  }
  // First call: a probe with an empty name and version 0.
  void* p = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CUresult r = gpa("", &p, 0, 0, &status);
  if (r != CUDA_SUCCESS || p != nullptr) {
    *error = Describe("probe cuGetProcAddress_v2", "", 0, 0, r, p, status);
    return false;
  }
  // Then cuGetProcAddress itself, in both ABIs; every later lookup goes through the _v2 it
  // returned (so a shim that substitutes its own cuGetProcAddress_v2 sees all of them).
  r = gpa("cuGetProcAddress", &p, 11030, 0, &status);
  if (r != CUDA_SUCCESS || p == nullptr || status != CU_GET_PROC_ADDRESS_SUCCESS) {
    *error = Describe("cuGetProcAddress_v2", "cuGetProcAddress", 11030, 0, r, p, status);
    return false;
  }
  api->cuGetProcAddress_v11030 = FromVoid<PFN_cuGetProcAddress_v11030>(p);
  r = gpa("cuGetProcAddress", &p, 12000, 0, &status);
  if (r != CUDA_SUCCESS || p == nullptr || status != CU_GET_PROC_ADDRESS_SUCCESS) {
    *error = Describe("cuGetProcAddress_v2", "cuGetProcAddress", 12000, 0, r, p, status);
    return false;
  }
  api->cuGetProcAddress_v2 = FromVoid<PFN_cuGetProcAddress_v12000>(p);
  gpa = api->cuGetProcAddress_v2;
  for (const Row& row : Rows()) {
    const EntryPoint& e = row.entry;
    if (strcmp(e.symbol, "cuGetProcAddress") == 0) continue;
    int version = e.version;
    cuuint64_t flags = e.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    p = nullptr;
    r = gpa(e.symbol, &p, version, flags, &status);
    if (r != CUDA_SUCCESS || p == nullptr || status != CU_GET_PROC_ADDRESS_SUCCESS) {
      *error = Describe("cuGetProcAddress_v2", e.symbol, version, flags, r, p, status);
      return false;
    }
    SetAt(api, row.offset, p);
  }
  return true;
}

bool LoadFakeControl(FakeControl* control, std::string* error) {
  *control = FakeControl{};
  void* h = OpenDriver(error);
  if (h == nullptr) return false;
  bool ok = true;
  auto load = [&](auto* slot, const char* name) {
    void* p = dlsym(h, name);
    if (p == nullptr && ok) {
      ok = false;
      *error = std::string("libcuda.so.1 is not the fake driver: no ") + name;
    }
    *slot = FromVoid<std::remove_pointer_t<decltype(slot)>>(p);
  };
  load(&control->reset, "vramscope_fake_reset");
  load(&control->set_capacity, "vramscope_fake_set_capacity");
  load(&control->set_device_count, "vramscope_fake_set_device_count");
  load(&control->set_manual_events, "vramscope_fake_set_manual_events");
  load(&control->set_blocking_sync, "vramscope_fake_set_blocking_sync");
  load(&control->complete_all_events, "vramscope_fake_complete_all_events");
  load(&control->complete_next_event, "vramscope_fake_complete_next_event");
  load(&control->pending_events, "vramscope_fake_pending_events");
  load(&control->call_count, "vramscope_fake_call_count");
  load(&control->total_calls, "vramscope_fake_total_calls");
  load(&control->lookup_count, "vramscope_fake_lookup_count");
  load(&control->live_bytes, "vramscope_fake_live_bytes");
  load(&control->live_allocations, "vramscope_fake_live_allocations");
  load(&control->live_host_allocations, "vramscope_fake_live_host_allocations");
  load(&control->pool_cached_bytes, "vramscope_fake_pool_cached_bytes");
  load(&control->live_reservations, "vramscope_fake_live_reservations");
  load(&control->live_mappings, "vramscope_fake_live_mappings");
  load(&control->active_captures, "vramscope_fake_active_captures");
  load(&control->invalidated_captures, "vramscope_fake_invalidated_captures");
  load(&control->forked_after_init, "vramscope_fake_forked_after_init");
  return ok;
}

}  // namespace vramscope::fake
