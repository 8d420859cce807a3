// Allocation sites, resolved outside the application: the drain names each return address
// "PATH+0xOFFSET" (lib/drain/site_assembler.h); this turns those into "function (file:line)"
// with elfutils' libdw, each module opened once at its link-time addresses: names from DWARF
// (inlined calls expand into several frames, innermost first, as the site's frames are), else
// from the ELF symbol whose extent holds the address (never the nearest symbol before a gap, so
// a stripped library's internal function is not named after its exported neighbour); separate
// debug files are found as libdw's standard search does (build-id, .gnu_debuglink,
// /usr/lib/debug). A frame it cannot name keeps its "PATH+0xOFFSET" form (stripped code, a
// module deleted since); FoldedStacks then shows "basename+0xOFFSET".
//
// Thread safety: none needed (pure functions).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/recorded_events.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

struct SymbolizeResult {
  std::size_t frames = 0;              // distinct "PATH+0xOFFSET" frames seen
  std::size_t resolved = 0;            // of those, named
  std::size_t unreadable_modules = 0;  // present but not an ELF file libdw could read
};

// Rewrites the frames of every device's top_sites in `reports`.
SymbolizeResult SymbolizeReports(std::vector<v1::Report>* reports);

// Rewrites the frames of every site definition in `events` the same way (each module opened
// once for all of them), so exports show function (file:line) for every allocation.
SymbolizeResult SymbolizeSites(RecordedEvents* events);

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
