// Allocation sites, resolved outside the application: the drain names each return address
// "PATH+0xOFFSET" (agent/drain/site_assembler.h); this turns those into "function (file:line)"
// with binutils' addr2line, run once per module in batches (`addr2line -a -f -C -i -e PATH`).
// An inlined call expands into several frames, innermost first, as the site's frames are.
// A frame addr2line cannot name keeps its "PATH+0xOFFSET" form (stripped binaries, a module
// deleted since, no addr2line on PATH); FoldedStacks then shows "basename+0xOFFSET".
//
// Thread safety: none needed (pure functions; they run child processes).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "export/recorded_events.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

struct SymbolizeResult {
  std::size_t frames = 0;    // distinct "PATH+0xOFFSET" frames seen
  std::size_t resolved = 0;  // of those, named by addr2line
  std::string warning;       // non-empty when addr2line could not be run at all
};

// Rewrites the frames of every device's top_sites in `reports`. `addr2line` is the program to
// run (a name looked up on PATH, or a path).
SymbolizeResult SymbolizeReports(std::vector<v1::Report>* reports,
                                 const std::string& addr2line = "addr2line");

// Rewrites the frames of every site definition in `events` the same way (one addr2line batch per
// module for all of them), so exports show function (file:line) for every allocation.
SymbolizeResult SymbolizeSites(RecordedEvents* events, const std::string& addr2line = "addr2line");

// The frame that names a site in one line: the innermost frame outside the CUDA runtime and
// driver (functions cuda*, __cuda*, cu[A-Z]*; modules libcudart*, libcuda*), which is where the
// program asked for memory; frames(0) if every frame is CUDA's; "site 0x..." without frames.
std::string SiteLabel(const v1::SiteStats& site);

// Folded stacks for flamegraph.pl and speedscope: one line per distinct stack,
// "outermost;...;innermost BYTES", where BYTES is the TOTAL requested bytes allocated from that
// stack over the run (SiteStats.total_bytes, summed over processes and devices). Frames are the
// function names (file and line dropped, so one function is one box); ';' in a name becomes ','.
std::string FoldedStacks(const std::vector<v1::Report>& reports);

}  // namespace vramscope::cli
