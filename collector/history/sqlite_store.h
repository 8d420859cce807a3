// The run history in SQLite (the Debian libsqlite3): one file, by default
// <data-dir>/history.sqlite, created mode 0600 (it holds command lines). See history_store.h.
// Thread safety: as HistoryStore (one connection behind a mutex). Errors: absl::Status.
#pragma once

#include <memory>
#include <string>

#include "history/history_store.h"

namespace vramscope::collector {

absl::StatusOr<std::unique_ptr<HistoryStore>> OpenSqliteStore(const std::string& path);

}  // namespace vramscope::collector
