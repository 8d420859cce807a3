// SiteAssembler (lib/drain): SITE chunks gathered by id in any order and interleaved with
// other sites, frames named PATH+0xOFFSET through the MODULE map (load bias subtracted), and
// records no writer produces refused without disturbing what was gathered.
#include "drain/site_assembler.h"

#include <gtest/gtest.h>
#include <string.h>

#include <string>

namespace vramscope::agent {
namespace {

vramscope_ring_record SiteChunk(std::uint64_t site, std::uint32_t frames, std::uint32_t index,
                                std::uint64_t first_address) {
  vramscope_ring_record r;
  memset(&r, 0, sizeof(r));
  r.kind = VRAMSCOPE_RING_KIND_SITE;
  r.aux = frames;
  r.sub = static_cast<std::uint8_t>(index);
  r.flags = static_cast<std::uint8_t>((frames + 3) / 4);
  r.tid = 42;
  r.time_ns = 1000 + index;
  r.payload.site.site = site;
  for (std::uint32_t j = 0; j < 4; ++j) {
    if (index * 4 + j < frames) r.payload.site.frames[j] = first_address + j;
  }
  return r;
}

// MODULE chunks of `path` (id, bias, [start, end)).
std::vector<vramscope_ring_record> ModuleChunks(std::uint32_t id, const std::string& path,
                                                std::uint64_t bias, std::uint64_t start,
                                                std::uint64_t end) {
  const std::size_t rest = path.size() > 16 ? path.size() - 16 : 0;
  const std::size_t chunks = 1 + (rest + 39) / 40;
  std::vector<vramscope_ring_record> out;
  for (std::size_t k = 0; k < chunks; ++k) {
    vramscope_ring_record r;
    memset(&r, 0, sizeof(r));
    r.kind = VRAMSCOPE_RING_KIND_MODULE;
    r.aux = id;
    r.sub = static_cast<std::uint8_t>(k);
    r.flags = static_cast<std::uint8_t>(chunks);
    if (k == 0) {
      r.payload.module.load_bias = bias;
      r.payload.module.start = start;
      r.payload.module.end = end;
      memcpy(r.payload.module.path, path.data(), std::min<std::size_t>(16, path.size()));
    } else {
      const std::size_t at = 16 + (k - 1) * 40;
      memcpy(r.payload.text, path.data() + at, std::min<std::size_t>(40, path.size() - at));
    }
    out.push_back(r);
  }
  return out;
}

TEST(SiteAssemblerTest, ChunksInAnyOrderMakeOneDefinition) {
  SiteAssembler sites;
  const std::string path = "/opt/some/rather/long/directory/name/libexample_module.so.1";
  auto chunks = ModuleChunks(1, path, 0x7f0000000000, 0x7f0000001000, 0x7f0000100000);
  ASSERT_GT(chunks.size(), 2u);
  // Chunks of a module may arrive in any order too.
  for (auto it = chunks.rbegin(); it != chunks.rend(); ++it) ASSERT_TRUE(sites.AddModule(*it).ok());

  v1::Event event;
  // Site 7 (6 frames, 2 chunks) with site 9 (1 frame) completing between its chunks.
  auto done = sites.AddSite(SiteChunk(7, 6, 1, 0x7f0000002004), &event);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  done = sites.AddSite(SiteChunk(9, 1, 0, 0x401000), &event);
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(*done);
  ASSERT_TRUE(event.has_site_definition());
  EXPECT_EQ(event.site_definition().site(), 9u);
  ASSERT_EQ(event.site_definition().frames_size(), 1);
  EXPECT_EQ(event.site_definition().frames(0), "0x401000");  // in no module

  event.Clear();
  done = sites.AddSite(SiteChunk(7, 6, 0, 0x7f0000002000), &event);
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(*done);
  const v1::SiteDefinition& site = event.site_definition();
  EXPECT_EQ(site.site(), 7u);
  EXPECT_EQ(event.thread_id(), 42u);
  ASSERT_EQ(site.frames_size(), 6);
  EXPECT_EQ(site.frames(0), path + "+0x2000");
  EXPECT_EQ(site.frames(3), path + "+0x2003");
  EXPECT_EQ(site.frames(4), path + "+0x2004");
  EXPECT_EQ(site.frames(5), path + "+0x2005");
}

TEST(SiteAssemblerTest, RecordsNoWriterProducesAreRefused) {
  SiteAssembler sites;
  v1::Event event;
  auto bad = SiteChunk(5, 6, 0, 0x1000);
  bad.flags = 3;  // 6 frames are 2 chunks
  EXPECT_FALSE(sites.AddSite(bad, &event).ok());
  bad = SiteChunk(5, 65, 0, 0x1000);  // more than VRAMSCOPE_RING_MAX_SITE_FRAMES
  EXPECT_FALSE(sites.AddSite(bad, &event).ok());
  bad = SiteChunk(0, 1, 0, 0x1000);  // site id 0 means "none"
  EXPECT_FALSE(sites.AddSite(bad, &event).ok());
  // A chunk sent twice drops the half-gathered site; a fresh start then completes.
  ASSERT_TRUE(sites.AddSite(SiteChunk(5, 6, 0, 0x1000), &event).ok());
  EXPECT_FALSE(sites.AddSite(SiteChunk(5, 6, 0, 0x1000), &event).ok());
  ASSERT_TRUE(sites.AddSite(SiteChunk(5, 6, 0, 0x1000), &event).ok());
  auto done = sites.AddSite(SiteChunk(5, 6, 1, 0x1004), &event);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);

  auto module = ModuleChunks(3, "/lib/x.so", 0, 0x1000, 0x2000);
  module[0].sub = 1;  // index beyond the chunk count
  EXPECT_FALSE(sites.AddModule(module[0]).ok());
  module[0].sub = 0;
  module[0].aux = 0;  // module id 0 is not a module
  EXPECT_FALSE(sites.AddModule(module[0]).ok());
  module[0].aux = 3;
  // A path with bytes a proto string cannot hold is escaped (vramscope/utf8.h), not flattened.
  module[0].payload.module.path[1] = static_cast<char>(0xff);
  ASSERT_TRUE(sites.AddModule(module[0]).ok());
  EXPECT_EQ(sites.FrameName(0x1010), "/\\xFFib/x.so+0x1010");
}

}  // namespace
}  // namespace vramscope::agent
