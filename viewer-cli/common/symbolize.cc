#include "common/symbolize.h"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <map>
#include <string_view>
#include <utility>

#include "vramscope/utf8.h"

namespace vramscope::cli {
namespace {

struct Frame {
  std::string path;
  std::uint64_t offset = 0;
};

// "PATH+0xOFFSET" -> path, offset.
bool ParseFrame(std::string_view frame, Frame* out) {
  const std::size_t plus = frame.rfind("+0x");
  if (plus == std::string_view::npos || plus == 0) return false;
  const std::string_view hex = frame.substr(plus + 3);
  if (hex.empty() || hex.size() > 16) return false;
  std::uint64_t offset = 0;
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
    offset =
        offset * 16 +
        static_cast<std::uint64_t>(
            c <= '9' ? c - '0' : (absl::ascii_tolower(static_cast<unsigned char>(c)) - 'a' + 10));
  }
  out->path = std::string(frame.substr(0, plus));
  out->offset = offset;
  return true;
}

std::string Demangle(const char* name) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (demangled == nullptr) return name;
  std::string out(demangled);
  free(demangled);
  return out;
}

// A function's name from its DWARF entry (following abstract_origin and specification): the
// demangled linkage name, else the plain name; empty when it has neither.
std::string DieFunctionName(Dwarf_Die* die) {
  Dwarf_Attribute attr;
  for (int name : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
    if (dwarf_attr_integrate(die, name, &attr) != nullptr) {
      if (const char* text = dwarf_formstring(&attr)) return Demangle(text);
    }
  }
  if (dwarf_attr_integrate(die, DW_AT_name, &attr) != nullptr) {
    if (const char* text = dwarf_formstring(&attr)) return text;
  }
  return "";
}

// "FILE:LINE" of an inlined call (DW_AT_call_file/line of the inlined scope), or "".
std::string CallSite(Dwarf_Die* cu, Dwarf_Die* inlined) {
  Dwarf_Attribute attr;
  Dwarf_Word file = 0, line = 0;
  if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_file, &attr), &file) != 0) return "";
  if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_line, &attr), &line) != 0) line = 0;
  Dwarf_Files* files = nullptr;
  std::size_t count = 0;
  if (dwarf_getsrcfiles(cu, &files, &count) != 0 || file >= count) return "";
  const char* name = dwarf_filesrc(files, file, nullptr, nullptr);
  return name == nullptr ? "" : absl::StrCat(name, ":", line);
}

std::string Located(const std::string& function, const std::string& location) {
  return location.empty() ? function : absl::StrCat(function, " (", location, ")");
}

// One module opened with libdw at its link-time addresses (load bias 0), so a drain offset is
// an address in it. Owns the Dwfl session (and through it the file descriptor).
class ModuleSymbols {
 public:
  explicit ModuleSymbols(const std::string& path) {
    static const Dwfl_Callbacks kCallbacks = {nullptr, dwfl_standard_find_debuginfo,
                                              dwfl_offline_section_address, nullptr};
    dwfl_ = dwfl_begin(&kCallbacks);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (dwfl_ == nullptr || fd < 0) {
      if (fd >= 0) close(fd);
      return;
    }
    module_ = dwfl_report_elf(dwfl_, path.c_str(), path.c_str(), fd, 0, true);
    if (module_ == nullptr) close(fd);  // otherwise libdw closes it with the module
    dwfl_report_end(dwfl_, nullptr, nullptr);
  }
  ~ModuleSymbols() {
    if (dwfl_ != nullptr) dwfl_end(dwfl_);
  }
  ModuleSymbols(const ModuleSymbols&) = delete;
  ModuleSymbols& operator=(const ModuleSymbols&) = delete;

  bool ok() const { return module_ != nullptr; }

  // The frames of the code at `address`, innermost first (an inlined call is a frame of its
  // own); empty when neither debug information nor a symbol covers it. A symbol covers an
  // address only within its size: the nearest symbol before a gap is not taken for it.
  std::vector<std::string> Frames(GElf_Addr address) {
    const std::string symbol = SymbolName(address);
    std::vector<std::string> out = InlineChain(address, symbol);
    if (out.empty() && !symbol.empty()) out.push_back(Located(symbol, SourceLine(address)));
    return out;
  }

 private:
  // The demangled name of the ELF symbol whose extent holds `address`, or "".
  std::string SymbolName(GElf_Addr address) {
    GElf_Off offset = 0;
    GElf_Sym sym;
    const char* name =
        dwfl_module_addrinfo(module_, address, &offset, &sym, nullptr, nullptr, nullptr);
    return name == nullptr ? "" : Demangle(name);
  }

  std::string SourceLine(GElf_Addr address) {
    Dwfl_Line* line = dwfl_module_getsrc(module_, address);
    int number = 0;
    const char* file = line == nullptr
                           ? nullptr
                           : dwfl_lineinfo(line, nullptr, &number, nullptr, nullptr, nullptr);
    return file == nullptr ? "" : absl::StrCat(file, ":", number);
  }

  // From DWARF scopes: the innermost function gets the line table's location, each caller the
  // call site recorded on the inlined scope inside it; ends at the enclosing subprogram, named
  // by its ELF symbol when there is one (with its parameter types, as addr2line names it; DWARF
  // gives a static function only its bare name).
  std::vector<std::string> InlineChain(GElf_Addr address, const std::string& symbol) {
    std::vector<std::string> out;
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = dwfl_module_addrdie(module_, address, &bias);
    if (cu == nullptr) return out;
    Dwarf_Die* scopes = nullptr;
    const int count = dwarf_getscopes(cu, address - bias, &scopes);
    std::string location = SourceLine(address);
    for (int i = 0; i < count; ++i) {
      const int tag = dwarf_tag(&scopes[i]);
      if (tag != DW_TAG_inlined_subroutine && tag != DW_TAG_subprogram) continue;
      std::string name = DieFunctionName(&scopes[i]);
      if (tag == DW_TAG_subprogram && !symbol.empty()) name = symbol;
      out.push_back(Located(name.empty() ? "??" : name, location));
      if (tag == DW_TAG_subprogram) break;
      location = CallSite(cu, &scopes[i]);
    }
    free(scopes);
    return out;
  }

  Dwfl* dwfl_ = nullptr;
  Dwfl_Module* module_ = nullptr;
};

std::string Basename(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

bool IsCudaFrame(std::string_view frame) {
  if (frame.substr(0, 4) == "cuda" || frame.substr(0, 6) == "__cuda") return true;
  if (frame.size() > 2 && frame.substr(0, 2) == "cu" && absl::ascii_isupper(frame[2])) return true;
  Frame parsed;
  if (ParseFrame(frame, &parsed)) {
    const std::string base = Basename(parsed.path);
    return base.rfind("libcuda", 0) == 0;  // libcuda.so*, libcudart.so*
  }
  return false;
}

}  // namespace

std::string SiteLabel(const v1::SiteStats& site) {
  if (site.frames().empty()) return absl::StrFormat("site %#x", site.site());
  for (const std::string& frame : site.frames()) {
    if (!IsCudaFrame(frame)) return frame;
  }
  return site.frames(0);
}

namespace {

using Frames = google::protobuf::RepeatedPtrField<std::string>;

// Calls `visit` with the frames of every site a report names: its top sites and the sites of
// its allocation list (DeviceReport.allocation_sites, what the HTML report shows).
template <typename Visit>
void ForEachSiteFrames(std::vector<v1::Report>* reports, Visit visit) {
  for (v1::Report& report : *reports) {
    for (v1::DeviceReport& device : *report.mutable_devices()) {
      for (v1::SiteStats& site : *device.mutable_top_sites()) visit(site.mutable_frames());
      for (v1::AllocationSite& site : *device.mutable_allocation_sites()) {
        visit(site.mutable_frames());
      }
    }
  }
}

}  // namespace

SymbolizeResult SymbolizeReports(std::vector<v1::Report>* reports) {
  SymbolizeResult result;
  // Distinct frames, grouped by module.
  std::map<std::string, std::vector<std::uint64_t>> by_module;
  absl::flat_hash_map<std::string, std::vector<std::string>> resolved;
  ForEachSiteFrames(reports, [&](Frames* frames) {
    for (const std::string& text : *frames) {
      Frame frame;
      if (!ParseFrame(text, &frame) || resolved.contains(text)) continue;
      resolved[text];
      by_module[frame.path].push_back(frame.offset);
    }
  });
  result.frames = resolved.size();
  for (const auto& [path, offsets] : by_module) {
    if (access(path.c_str(), R_OK) != 0) continue;
    ModuleSymbols module(path);
    if (!module.ok()) {
      ++result.unreadable_modules;
      continue;
    }
    for (std::uint64_t offset : offsets) {
      // Return addresses point after the call: look up the call instruction itself.
      std::vector<std::string> names = module.Frames(offset > 0 ? offset - 1 : 0);
      if (names.empty()) continue;
      // Debug info names files as the compiler saw them, in any encoding: the frame goes into
      // a proto string (the JSON report), so bytes that are not UTF-8 are escaped.
      for (std::string& name : names) name = ToValidUtf8(name);
      resolved[absl::StrFormat("%s+0x%x", path, offset)] = std::move(names);
      ++result.resolved;
    }
  }
  ForEachSiteFrames(reports, [&](Frames* frames) {
    Frames named;
    for (const std::string& text : *frames) {
      auto it = resolved.find(text);
      if (it == resolved.end() || it->second.empty()) {
        *named.Add() = text;
      } else {
        for (const std::string& name : it->second) *named.Add() = name;
      }
    }
    frames->Swap(&named);
  });
  return result;
}

std::string FoldedStacks(const std::vector<v1::Report>& reports) {
  std::map<std::string, std::uint64_t> stacks;
  for (const v1::Report& report : reports) {
    for (const v1::DeviceReport& device : report.devices()) {
      for (const v1::SiteStats& site : device.top_sites()) {
        std::vector<std::string> names;
        for (auto it = site.frames().rbegin(); it != site.frames().rend(); ++it) {
          std::string name = *it;
          Frame frame;
          if (ParseFrame(name, &frame)) {
            name = absl::StrFormat("%s+0x%x", Basename(frame.path), frame.offset);
          } else if (const std::size_t paren = name.rfind(" ("); paren != std::string::npos) {
            name.resize(paren);
          }
          for (char& c : name) {
            if (c == ';') c = ',';
            if (c == '\n') c = ' ';
          }
          names.push_back(std::move(name));
        }
        if (names.empty()) names.push_back(absl::StrFormat("site 0x%x", site.site()));
        stacks[absl::StrJoin(names, ";")] += site.total_bytes();
      }
    }
  }
  std::string out;
  for (const auto& [stack, bytes] : stacks) absl::StrAppend(&out, stack, " ", bytes, "\n");
  return out;
}

SymbolizeResult SymbolizeSites(RecordedEvents* events) {
  // The site definitions as one report's sites: the same batching and frame rules as the report.
  std::vector<v1::Report> sites(1);
  v1::DeviceReport* device = sites[0].add_devices();
  std::vector<v1::SiteDefinition*> definitions;
  for (ProcessEvents& process : events->mutable_processes()) {
    for (v1::Event& event : process.events) {
      if (!event.has_site_definition()) continue;
      definitions.push_back(event.mutable_site_definition());
      *device->add_top_sites()->mutable_frames() = event.site_definition().frames();
    }
  }
  if (definitions.empty()) return SymbolizeResult{};
  SymbolizeResult result = SymbolizeReports(&sites);
  for (std::size_t i = 0; i < definitions.size(); ++i) {
    *definitions[i]->mutable_frames() = std::move(*device->mutable_top_sites(i)->mutable_frames());
  }
  return result;
}

}  // namespace vramscope::cli
