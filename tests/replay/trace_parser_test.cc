// The trace parser, loader and file reader: syntax, pairing, gzip, errors with FILE:LINE.
#include "replay/trace_parser.h"

#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "replay/trace_file.h"
#include "replay/trace_loader.h"
#include "trace_test_util.h"

namespace vramscope::cli {
namespace {

using testing::Gzip;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::TempFile;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

const std::string kHeader = "action,addr,size,stream,time_us,site\n";

// Collects what the parser emits.
struct Collected {
  std::vector<TraceEvent> events;
  std::vector<std::string> sites;
  std::vector<std::uint64_t> lines;
};

absl::Status Collect(std::string_view input, Collected* out) {
  return ParseTrace("t.csv", input, [out](const TraceEvent& event, std::uint64_t line) {
    out->events.push_back(event);
    out->sites.emplace_back(event.site);
    out->lines.push_back(line);
    return absl::OkStatus();
  });
}

absl::Status ParseOnly(std::string_view input) {
  Collected ignored;
  return Collect(input, &ignored);
}

// --- ParseTraceLine
// -------------------------------------------------------------------------------

TEST(ParseTraceLine, ReadsEveryColumn) {
  auto event = ParseTraceLine("alloc,140341231484928,3072,7,1795949273683798,train.py:47:step");
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(event->action, TraceAction::kAlloc);
  EXPECT_EQ(event->addr, 140341231484928u);
  EXPECT_EQ(event->size, 3072u);
  EXPECT_EQ(event->stream, 7u);
  EXPECT_EQ(event->time_us, 1795949273683798u);
  EXPECT_EQ(event->site, "train.py:47:step");
}

TEST(ParseTraceLine, EveryActionName) {
  for (auto [name, action] : std::vector<std::pair<std::string, TraceAction>>{
           {"alloc", TraceAction::kAlloc},
           {"free_requested", TraceAction::kFreeRequested},
           {"free_completed", TraceAction::kFreeCompleted},
           {"segment_alloc", TraceAction::kSegmentAlloc},
           {"segment_free", TraceAction::kSegmentFree}}) {
    auto event = ParseTraceLine(name + ",1,512,0,0,");
    ASSERT_TRUE(event.ok()) << name << ": " << event.status();
    EXPECT_EQ(event->action, action);
    EXPECT_EQ(TraceActionName(action), name);
  }
}

TEST(ParseTraceLine, EmptySiteAndSiteWithCommas) {
  auto empty = ParseTraceLine("alloc,1,512,0,0,");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->site, "");
  auto commas = ParseTraceLine("alloc,1,512,0,0,f(a, b):3:g,h");
  ASSERT_TRUE(commas.ok());
  EXPECT_EQ(commas->site, "f(a, b):3:g,h");
}

TEST(ParseTraceLine, TrailingCarriageReturnIsNotPartOfTheSite) {
  auto event = ParseTraceLine("alloc,1,512,0,0,x.py:1:f\r");
  ASSERT_TRUE(event.ok());
  EXPECT_EQ(event->site, "x.py:1:f");
}

TEST(ParseTraceLine, UnknownActionIsQuoted) {
  auto event = ParseTraceLine("foo,1,512,0,0,");
  EXPECT_EQ(event.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(event.status()), StartsWith("unknown action 'foo'"));
  // Case matters; binary garbage is escaped, not printed raw.
  EXPECT_FALSE(ParseTraceLine("Alloc,1,512,0,0,").ok());
  EXPECT_THAT(Message(ParseTraceLine(std::string("a\x01\xff,1,512,0,0,")).status()),
              HasSubstr("'a\\x01\\xff'"));
}

TEST(ParseTraceLine, MalformedNumbers) {
  for (const char* line :
       {"alloc,,512,0,0,", "alloc,1,,0,0,", "alloc,1,512,,0,", "alloc,1,512,0,,",
        "alloc,-1,512,0,0,", "alloc,+1,512,0,0,", "alloc,0x10,512,0,0,", "alloc, 1,512,0,0,",
        "alloc,1 ,512,0,0,", "alloc,1,5e3,0,0,", "alloc,1,512.0,0,0,", "alloc,1,512,-0,0,"}) {
    auto event = ParseTraceLine(line);
    EXPECT_EQ(event.status().code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_THAT(Message(event.status()),
                ::testing::AnyOf(StartsWith("malformed "), StartsWith("empty ")))
        << line;
  }
}

TEST(ParseTraceLine, NumbersOutOfRange) {
  EXPECT_TRUE(ParseTraceLine("segment_alloc,18446744073709551615,1,0,0,").ok());
  auto event = ParseTraceLine("alloc,18446744073709551616,512,0,0,");
  EXPECT_THAT(Message(event.status()), HasSubstr("out of range"));
  EXPECT_FALSE(ParseTraceLine("alloc,1,512,0,99999999999999999999999999999999,").ok());
}

TEST(ParseTraceLine, AbsurdSizes) {
  EXPECT_THAT(Message(ParseTraceLine("alloc,1,0,0,0,").status()), HasSubstr("size 0"));
  EXPECT_THAT(Message(ParseTraceLine("free_requested,1,0,0,0,").status()), HasSubstr("size 0"));
  EXPECT_TRUE(ParseTraceLine("alloc,1,281474976710656,0,0,").ok());  // 2^48 exactly
  EXPECT_THAT(Message(ParseTraceLine("alloc,1,281474976710657,0,0,").status()),
              HasSubstr("larger than 2^48"));
  // Reference rows are not replayed: their sizes are only checked to be numbers.
  EXPECT_TRUE(ParseTraceLine("free_completed,1,0,0,0,").ok());
}

TEST(ParseTraceLine, TooFewColumns) {
  for (const char* line : {"", "alloc", "alloc,1,512,0,0", "alloc;1;512;0;0;"}) {
    auto event = ParseTraceLine(line);
    EXPECT_THAT(Message(event.status()), StartsWith("expected 6 comma-separated columns")) << line;
  }
}

// --- TraceParser
// ----------------------------------------------------------------------------------

TEST(TraceParser, HeaderAndLines) {
  Collected c;
  ASSERT_TRUE(
      Collect(absl::StrCat(kHeader, "alloc,1,512,0,10,a.py:1:f\n", "free_requested,1,512,0,11,\n"),
              &c)
          .ok());
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.lines, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(c.sites[0], "a.py:1:f");
  EXPECT_EQ(c.events[1].action, TraceAction::kFreeRequested);
}

TEST(TraceParser, CrlfLineEndings) {
  Collected c;
  ASSERT_TRUE(Collect("action,addr,size,stream,time_us,site\r\nalloc,1,512,0,0,s\r\n"
                      "free_requested,1,512,0,0,\r\n",
                      &c)
                  .ok());
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.sites[0], "s");
  EXPECT_EQ(c.sites[1], "");
}

TEST(TraceParser, NoFinalNewlineBlankLinesAndBom) {
  Collected c;
  ASSERT_TRUE(Collect("\xEF\xBB\xBF"
                      "action,addr,size,stream,time_us,site\n\nalloc,1,512,0,0,s\n\r\n"
                      "alloc,2,512,0,0,last",
                      &c)
                  .ok());
  ASSERT_EQ(c.events.size(), 2u);
  EXPECT_EQ(c.lines, (std::vector<std::uint64_t>{3, 5}));
  EXPECT_EQ(c.sites[1], "last");
}

TEST(TraceParser, HeaderOnlyIsAnEmptyTrace) {
  Collected c;
  EXPECT_TRUE(Collect(kHeader, &c).ok());
  EXPECT_TRUE(c.events.empty());
}

TEST(TraceParser, MissingOrWrongHeader) {
  EXPECT_EQ(Message(ParseOnly("")),
            "t.csv:1: empty trace: expected the header 'action,addr,size,stream,time_us,site'");
  EXPECT_THAT(Message(ParseOnly("alloc,1,512,0,0,\n")), StartsWith("t.csv:1: expected the header"));
  EXPECT_THAT(Message(ParseOnly("action,addr,size\n")), StartsWith("t.csv:1: expected the header"));
}

TEST(TraceParser, ErrorsNameFileAndLine) {
  std::string input = absl::StrCat(kHeader, "alloc,1,512,0,0,\nalloc,2,512,0,0,\nfoo,3,512,0,0,\n");
  EXPECT_THAT(Message(ParseOnly(input)), StartsWith("t.csv:4: unknown action 'foo'"));
  EXPECT_THAT(Message(ParseOnly(absl::StrCat(kHeader, "alloc,1,5x2,0,0,\n"))),
              StartsWith("t.csv:2: malformed size '5x2'"));
  // The error's code is kept.
  EXPECT_EQ(ParseOnly(input).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TraceParser, SinkErrorsGetTheLocation) {
  absl::Status status = ParseTrace(
      "s.csv", absl::StrCat(kHeader, "alloc,1,512,0,0,\n"),
      [](const TraceEvent&, std::uint64_t) { return absl::FailedPreconditionError("nope"); });
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Message(status), "s.csv:2: nope");
}

TEST(TraceParser, ChunkBoundariesDoNotMatter) {
  const std::string input = absl::StrCat(kHeader,
                                         "alloc,140341231484928,3072,0,1,a.py:1:f\r\n"
                                         "segment_alloc,5,2097152,0,2,\n"
                                         "free_requested,140341231484928,3072,0,3,\n"
                                         "alloc,7,512,3,4,b,c");
  Collected whole;
  ASSERT_TRUE(Collect(input, &whole).ok());
  for (std::size_t chunk = 1; chunk <= 7; ++chunk) {
    Collected pieces;
    TraceParser parser("t.csv");
    auto sink = [&pieces](const TraceEvent& event, std::uint64_t line) {
      pieces.events.push_back(event);
      pieces.sites.emplace_back(event.site);
      pieces.lines.push_back(line);
      return absl::OkStatus();
    };
    for (std::size_t i = 0; i < input.size(); i += chunk) {
      ASSERT_TRUE(parser.Feed(std::string_view(input).substr(i, chunk), sink).ok());
    }
    ASSERT_TRUE(parser.Finish(sink).ok());
    EXPECT_EQ(pieces.sites, whole.sites) << "chunk " << chunk;
    EXPECT_EQ(pieces.lines, whole.lines) << "chunk " << chunk;
    ASSERT_EQ(pieces.events.size(), whole.events.size());
    for (std::size_t i = 0; i < whole.events.size(); ++i) {
      EXPECT_EQ(pieces.events[i].addr, whole.events[i].addr);
      EXPECT_EQ(pieces.events[i].size, whole.events[i].size);
    }
  }
}

TEST(TraceParser, ErrorIsSticky) {
  TraceParser parser("t.csv");
  auto sink = [](const TraceEvent&, std::uint64_t) { return absl::OkStatus(); };
  ASSERT_FALSE(parser.Feed("bad header\n", sink).ok());
  EXPECT_THAT(Message(parser.Feed(kHeader, sink)), StartsWith("t.csv:1: expected the header"));
  EXPECT_THAT(Message(parser.Finish(sink)), StartsWith("t.csv:1: expected the header"));
}

TEST(TraceParser, OverlongLineIsRejectedWithBoundedMemory) {
  std::string junk(kMaxTraceLineBytes + 1, 'x');
  EXPECT_THAT(Message(ParseOnly(absl::StrCat(kHeader, "alloc,1,512,0,0,", junk, "\n"))),
              StartsWith("t.csv:2: line longer than"));
  // Fed in pieces with no newline at all.
  TraceParser parser("t.csv");
  auto sink = [](const TraceEvent&, std::uint64_t) { return absl::OkStatus(); };
  absl::Status status;
  for (int i = 0; i < 100 && status.ok(); ++i) status = parser.Feed(std::string(4096, 'y'), sink);
  EXPECT_THAT(Message(status), StartsWith("t.csv:1: line longer than"));
}

// --- TraceLoader
// ----------------------------------------------------------------------------------

TEST(TraceLoader, PairsFreesAndComputesPeakLive) {
  auto trace = LoadTraceBytes("t.csv", absl::StrCat(kHeader,
                                                    "segment_alloc,100,4096,0,0,\n"
                                                    "alloc,100,1000,0,0,\n"
                                                    "alloc,200,24,0,0,\n"
                                                    "free_requested,100,1000,0,0,\n"
                                                    "free_completed,100,1000,0,0,\n"
                                                    "alloc,100,512,0,0,\n"
                                                    "alloc,300,512,0,0,\n"
                                                    "free_requested,300,512,0,0,\n"));
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->alloc_events, 4u);
  EXPECT_EQ(trace->free_events, 2u);
  EXPECT_EQ(trace->skipped_events, 2u);
  EXPECT_EQ(trace->ops.size(), 6u);
  EXPECT_EQ(trace->peak_live_bytes, 1048u);  // 24 + 512 + 512 < 1000 + 24
  EXPECT_EQ(trace->live_at_end_count, 2u);
  EXPECT_EQ(trace->live_at_end_bytes, 536u);
  EXPECT_EQ(trace->lines, 9u);
  // Slots: allocs numbered in trace order; a free names its alloc's slot and size.
  struct Op {
    bool is_free;
    std::uint32_t slot;
    std::uint64_t size;
  };
  const std::vector<Op> expected = {{false, 0, 1000}, {false, 1, 24},  {true, 0, 1000},
                                    {false, 2, 512},  {false, 3, 512}, {true, 3, 512}};
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(trace->ops[i].is_free, expected[i].is_free) << i;
    EXPECT_EQ(trace->ops[i].slot, expected[i].slot) << i;
    EXPECT_EQ(trace->ops[i].size, expected[i].size) << i;
  }
}

TEST(TraceLoader, FreeOfUnknownAddress) {
  auto trace = LoadTraceBytes("t.csv", absl::StrCat(kHeader, "free_requested,100,512,0,0,\n"));
  EXPECT_THAT(Message(trace.status()),
              StartsWith("t.csv:2: free_requested of address 100, which is not live"));
  // Freed twice.
  trace = LoadTraceBytes("t.csv", absl::StrCat(kHeader,
                                               "alloc,100,512,0,0,\nfree_requested,100,512,0,0,\n"
                                               "free_requested,100,512,0,0,\n"));
  EXPECT_THAT(Message(trace.status()), StartsWith("t.csv:4: free_requested of address 100"));
}

TEST(TraceLoader, AllocOfLiveAddress) {
  auto trace = LoadTraceBytes(
      "t.csv", absl::StrCat(kHeader, "alloc,100,512,0,0,\nalloc,7,512,0,0,\nalloc,100,512,0,0,\n"));
  EXPECT_THAT(Message(trace.status()),
              StartsWith("t.csv:4: alloc of address 100, which is still live (allocated on line "
                         "2"));
}

TEST(TraceLoader, FreeWithAnotherSize) {
  auto trace = LoadTraceBytes(
      "t.csv", absl::StrCat(kHeader, "alloc,100,512,0,0,\nfree_requested,100,1024,0,0,\n"));
  EXPECT_THAT(Message(trace.status()), StartsWith("t.csv:3: free_requested of address 100 with "
                                                  "size 1024, but it was allocated with size 512"));
}

// --- TraceFile
// ------------------------------------------------------------------------------------

const std::string kSmallTrace = absl::StrCat(kHeader,
                                             "alloc,100,1000,0,0,x.py:1:f\n"
                                             "alloc,200,24,0,0,\n"
                                             "free_requested,100,1000,0,0,\n");

TEST(TraceFile, PlainAndGzipReadTheSame) {
  TempFile plain("plain.csv", kSmallTrace);
  TempFile gz("trace.csv.gz", Gzip(kSmallTrace));
  TempFile gz_no_suffix("gzip_without_suffix", Gzip(kSmallTrace));
  for (const TempFile* file : {&plain, &gz, &gz_no_suffix}) {
    auto trace = LoadTraceFile(file->path());
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_EQ(trace->name, file->path());
    EXPECT_EQ(trace->alloc_events, 2u);
    EXPECT_EQ(trace->peak_live_bytes, 1024u);
  }
  auto opened = TraceFile::Open(gz.path());
  ASSERT_TRUE(opened.ok());
  EXPECT_TRUE((*opened)->compressed());
}

TEST(TraceFile, GzipWithCrlf) {
  std::string crlf;
  for (char c : kSmallTrace) {
    if (c == '\n') crlf += '\r';
    crlf += c;
  }
  TempFile gz("crlf.csv.gz", Gzip(crlf));
  auto trace = LoadTraceFile(gz.path());
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->ops.size(), 3u);
}

TEST(TraceFile, ConcatenatedGzipMembers) {
  TempFile gz("cat.csv.gz", Gzip(kSmallTrace) + Gzip("free_requested,200,24,0,0,\n"));
  auto trace = LoadTraceFile(gz.path());
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->free_events, 2u);
  EXPECT_EQ(trace->live_at_end_count, 0u);
}

TEST(TraceFile, TruncatedGzip) {
  const std::string gz = Gzip(kSmallTrace);
  for (std::size_t keep : {gz.size() - 1, gz.size() - 8, gz.size() / 2, std::size_t{3}}) {
    TempFile file("truncated.csv.gz", gz.substr(0, keep));
    auto trace = LoadTraceFile(file.path());
    EXPECT_EQ(trace.status().code(), absl::StatusCode::kDataLoss) << keep;
    EXPECT_THAT(Message(trace.status()), StartsWith(file.path() + ": truncated gzip stream"))
        << keep;
  }
}

TEST(TraceFile, CorruptGzip) {
  std::string gz = Gzip(kSmallTrace);
  gz[gz.size() - 6] ^= 0x55;  // inside the CRC32 trailer
  TempFile crc("crc.csv.gz", gz);
  EXPECT_THAT(Message(LoadTraceFile(crc.path()).status()),
              StartsWith(crc.path() + ": corrupt gzip data"));
  TempFile garbage("garbage.csv.gz", Gzip(kSmallTrace) + "junk");
  EXPECT_THAT(Message(LoadTraceFile(garbage.path()).status()),
              StartsWith(garbage.path() + ": trailing garbage"));
}

TEST(TraceFile, MissingFileDirectoryAndEmptyFile) {
  auto missing = LoadTraceFile("/nonexistent/trace.csv.gz");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()), StartsWith("/nonexistent/trace.csv.gz: cannot open"));
  EXPECT_THAT(Message(LoadTraceFile(::testing::TempDir()).status()), HasSubstr("is a directory"));
  TempFile empty("empty.csv", "");
  EXPECT_THAT(Message(LoadTraceFile(empty.path()).status()),
              StartsWith(empty.path() + ":1: empty trace"));
}

TEST(TraceFile, ErrorLineNumbersInGzip) {
  TempFile gz("bad.csv.gz", Gzip(absl::StrCat(kSmallTrace, "alloc,9,512,0,zz,\n")));
  EXPECT_THAT(Message(LoadTraceFile(gz.path()).status()),
              StartsWith(gz.path() + ":5: malformed time_us 'zz'"));
}

// --- The bundled traces
// ---------------------------------------------------------------------------

TEST(BundledTraces, CountsMatchTheTracesReadme) {
  struct Expected {
    const char* name;
    std::uint64_t alloc_events;
    std::uint64_t peak_live_bytes;
  };
  for (const Expected& e :
       {Expected{"gpt2_train", 6179, 7701353160}, Expected{"resnet50_train", 3583, 3022207356},
        Expected{"mlp_dynamic_train", 2002, 805437576}}) {
    auto trace = LoadTraceFile(testing::TracesDir() + "/" + e.name + ".csv.gz");
    ASSERT_TRUE(trace.ok()) << trace.status();
    EXPECT_EQ(trace->alloc_events, e.alloc_events) << e.name;
    EXPECT_EQ(trace->peak_live_bytes, e.peak_live_bytes) << e.name;
  }
}

}  // namespace
}  // namespace vramscope::cli
