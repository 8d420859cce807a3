#include "history/history_store.h"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include "history/postgres_store.h"
#include "history/run_summary.h"
#include "history/sqlite_store.h"

namespace vramscope::collector {

absl::Status HistoryStore::Insert(const v1::Report& report) {
  return InsertRow(SummarizeRun(report), report.SerializeAsString());
}

absl::StatusOr<std::unique_ptr<HistoryStore>> OpenHistoryStore(const std::string& database,
                                                               const std::string& data_dir) {
  if (database.empty()) return OpenSqliteStore(data_dir + "/history.sqlite");
  if (absl::StartsWith(database, "sqlite:")) return OpenSqliteStore(database.substr(7));
  if (absl::StartsWith(database, "postgresql://") || absl::StartsWith(database, "postgres://")) {
    return OpenPostgresStore(database);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--database '", database,
                   "': give postgresql://..., sqlite:PATH, or off (default: SQLite in the data "
                   "directory)"));
}

}  // namespace vramscope::collector
