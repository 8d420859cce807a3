#include "history/history_schema.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_replace.h>

namespace vramscope::collector {
namespace {

// ID and BLOB stand for the dialect's types.
const std::vector<std::vector<std::string>>& Migrations() {
  static const auto* migrations = new std::vector<std::vector<std::string>>{
      // 0 -> 1
      {
          "CREATE TABLE schema_version (version INTEGER NOT NULL)",
          "INSERT INTO schema_version (version) VALUES (0)",
          "CREATE TABLE runs ("
          " id ID,"
          " host TEXT NOT NULL, pid BIGINT NOT NULL, start_time_ns BIGINT NOT NULL,"
          " end_time_ns BIGINT NOT NULL, exit_code INTEGER NOT NULL, killed INTEGER NOT NULL,"
          " signal INTEGER NOT NULL, vanished INTEGER NOT NULL, command_line TEXT NOT NULL,"
          " summary BLOB NOT NULL, report BLOB NOT NULL,"
          " UNIQUE (host, pid, start_time_ns))",
          "CREATE INDEX runs_by_start ON runs (start_time_ns)",
          "CREATE TABLE run_devices ("
          " run_id BIGINT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,"
          " ordinal INTEGER NOT NULL, peak_requested_bytes BIGINT NOT NULL,"
          " peak_allocated_bytes BIGINT NOT NULL, peak_reserved_bytes BIGINT NOT NULL,"
          " fragmentation_at_peak DOUBLE PRECISION NOT NULL, alloc_count BIGINT NOT NULL,"
          " oom_count BIGINT NOT NULL, cupti_peak_bytes BIGINT NOT NULL,"
          " PRIMARY KEY (run_id, ordinal))",
          "CREATE TABLE run_labels ("
          " run_id BIGINT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,"
          " key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (run_id, key))",
          "CREATE INDEX run_labels_by_label ON run_labels (key, value)",
          "UPDATE schema_version SET version = 1",
      },
      // 1 -> 2
      {
          "ALTER TABLE runs ADD COLUMN passed INTEGER NOT NULL DEFAULT 0",
          "UPDATE runs SET passed = CASE WHEN exit_code = 0 AND killed = 0 THEN 1 ELSE 0 END",
          "CREATE INDEX runs_passed_by_start ON runs (passed, start_time_ns)",
          "UPDATE schema_version SET version = 2",
      },
  };
  return *migrations;
}

}  // namespace

std::vector<std::string> MigrationStatements(int from, SqlDialect dialect) {
  std::vector<std::string> out;
  if (from < 0 || from >= static_cast<int>(Migrations().size())) return out;
  for (const std::string& statement : Migrations()[from]) {
    out.push_back(absl::StrReplaceAll(
        statement, {{" ID,", dialect == SqlDialect::kSqlite ? " INTEGER PRIMARY KEY AUTOINCREMENT,"
                                                            : " BIGSERIAL PRIMARY KEY,"},
                    {" BLOB ", dialect == SqlDialect::kSqlite ? " BLOB " : " BYTEA "}}));
  }
  return out;
}

std::string ListRunsQuery(std::size_t labels, bool passing_only, SqlDialect dialect) {
  int n = 0;
  // Placeholders only; the statement's shape depends on how many labels are asked for.
  auto param = [&] {
    return dialect == SqlDialect::kSqlite ? std::string("?") : absl::StrCat("$", ++n);
  };
  std::string query = absl::StrCat("SELECT id, summary FROM runs WHERE start_time_ns >= ", param());
  if (passing_only) query += " AND passed = 1";
  for (std::size_t i = 0; i < labels; ++i) {
    const std::string key = param();
    const std::string value = param();
    absl::StrAppend(&query,
                    " AND EXISTS (SELECT 1 FROM run_labels l WHERE l.run_id = runs.id AND l.key = ",
                    key, " AND l.value = ", value, ")");
  }
  absl::StrAppend(&query, " ORDER BY start_time_ns DESC, id DESC LIMIT ", param());
  return query;
}

}  // namespace vramscope::collector
