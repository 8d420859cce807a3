// The run history in PostgreSQL through libpqxx (Debian libpqxx-dev 6.4), so that many
// collectors share one history. See history_store.h. The connection is made when first needed
// and made again after it breaks: a server that is down makes calls fail with UNAVAILABLE (the
// writer keeps its rows queued) and never stops the collector. Migrations run under an advisory
// lock, so collectors starting together migrate once.
// Thread safety: as HistoryStore. Errors: absl::Status; libpqxx's exceptions stop here.
#pragma once

#include <memory>
#include <string>

#include "history/history_store.h"

namespace vramscope::collector {

// `uri`: a libpq connection URI (postgresql://user@host:port/db?host=/socket/dir ...).
absl::StatusOr<std::unique_ptr<HistoryStore>> OpenPostgresStore(const std::string& uri);

}  // namespace vramscope::collector
