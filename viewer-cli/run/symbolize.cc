#include "run/symbolize.h"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <string_view>
#include <utility>

#include "vramscope/utf8.h"

namespace vramscope::cli {
namespace {

constexpr std::size_t kBatch = 256;  // addresses per addr2line command line

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

std::string ShellQuote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  out += "'";
  return out;
}

bool IsAddressLine(std::string_view line) {
  if (line.size() < 3 || line.substr(0, 2) != "0x") return false;
  for (char c : line.substr(2)) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// One addr2line run over `offsets` of `path`; fills `names[i]` with the frames of offsets[i]
// (empty when unresolved). False when addr2line could not be run.
bool RunAddr2line(const std::string& addr2line, const std::string& path,
                  const std::vector<std::uint64_t>& offsets,
                  std::vector<std::vector<std::string>>* names) {
  std::string command = absl::StrCat(ShellQuote(addr2line), " -a -f -C -i -e ", ShellQuote(path));
  for (std::uint64_t offset : offsets) {
    // Return addresses point after the call: look up the call instruction itself.
    absl::StrAppend(&command, absl::StrFormat(" 0x%x", offset > 0 ? offset - 1 : 0));
  }
  command += " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return false;
  std::string output;
  char buffer[8192];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) == 127) return false;
  names->assign(offsets.size(), {});
  int index = -1;
  std::string function;
  bool have_function = false;
  std::size_t start = 0;
  while (start < output.size()) {
    std::size_t end = output.find('\n', start);
    if (end == std::string::npos) end = output.size();
    const std::string_view line(output.data() + start, end - start);
    start = end + 1;
    if (IsAddressLine(line)) {
      ++index;
      have_function = false;
      continue;
    }
    if (index < 0 || index >= static_cast<int>(offsets.size())) continue;
    if (!have_function) {
      function = std::string(line);
      have_function = true;
      continue;
    }
    have_function = false;
    // `line` is FILE:LINE (possibly "??:0" or "??:?", and " (discriminator N)" after it).
    std::string location(line);
    if (const std::size_t d = location.find(" (discriminator"); d != std::string::npos) {
      location.resize(d);
    }
    if (function == "??" && location.rfind("??", 0) == 0) continue;
    std::string name = function;
    if (location.rfind("??", 0) != 0) absl::StrAppend(&name, " (", location, ")");
    // Debug info names files as the compiler saw them, in any encoding: the frame goes into a
    // proto string (the JSON report), so bytes that are not UTF-8 are escaped.
    (*names)[static_cast<std::size_t>(index)].push_back(ToValidUtf8(name));
  }
  return true;
}

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

SymbolizeResult SymbolizeReports(std::vector<v1::Report>* reports, const std::string& addr2line) {
  SymbolizeResult result;
  // Distinct frames, grouped by module.
  std::map<std::string, std::vector<std::uint64_t>> by_module;
  absl::flat_hash_map<std::string, std::vector<std::string>> resolved;
  for (const v1::Report& report : *reports) {
    for (const v1::DeviceReport& device : report.devices()) {
      for (const v1::SiteStats& site : device.top_sites()) {
        for (const std::string& text : site.frames()) {
          Frame frame;
          if (!ParseFrame(text, &frame) || resolved.contains(text)) continue;
          resolved[text];
          by_module[frame.path].push_back(frame.offset);
        }
      }
    }
  }
  result.frames = resolved.size();
  for (const auto& [path, offsets] : by_module) {
    if (access(path.c_str(), R_OK) != 0) continue;
    for (std::size_t begin = 0; begin < offsets.size(); begin += kBatch) {
      const std::vector<std::uint64_t> batch(
          offsets.begin() + static_cast<std::ptrdiff_t>(begin),
          offsets.begin() + static_cast<std::ptrdiff_t>(std::min(offsets.size(), begin + kBatch)));
      std::vector<std::vector<std::string>> names;
      if (!RunAddr2line(addr2line, path, batch, &names)) {
        result.warning = absl::StrCat("cannot run ", addr2line,
                                      " (binutils) to resolve allocation sites; frames are shown "
                                      "as MODULE+0xOFFSET");
        break;
      }
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (names[i].empty()) continue;
        resolved[absl::StrFormat("%s+0x%x", path, batch[i])] = std::move(names[i]);
        ++result.resolved;
      }
    }
    if (!result.warning.empty()) break;
  }
  for (v1::Report& report : *reports) {
    for (v1::DeviceReport& device : *report.mutable_devices()) {
      for (v1::SiteStats& site : *device.mutable_top_sites()) {
        google::protobuf::RepeatedPtrField<std::string> frames;
        for (const std::string& text : site.frames()) {
          auto it = resolved.find(text);
          if (it == resolved.end() || it->second.empty()) {
            *frames.Add() = text;
          } else {
            for (const std::string& name : it->second) *frames.Add() = name;
          }
        }
        site.mutable_frames()->Swap(&frames);
      }
    }
  }
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

SymbolizeResult SymbolizeSites(RecordedEvents* events, const std::string& addr2line) {
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
  SymbolizeResult result = SymbolizeReports(&sites, addr2line);
  for (std::size_t i = 0; i < definitions.size(); ++i) {
    *definitions[i]->mutable_frames() = std::move(*device->mutable_top_sites(i)->mutable_frames());
  }
  return result;
}

}  // namespace vramscope::cli
