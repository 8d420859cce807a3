// The run history's schema and its migrations, for SQLite and PostgreSQL alike (the two
// dialects differ only in the id column and the blob type, substituted below).
//
// Version 1: runs (one row per finished process, columns of RunSummary, the Report as a blob),
//            run_devices, run_labels, schema_version.
// Version 2: runs.passed (exit code 0 and not killed), filled in for the rows already there,
//            with an index for `check --baseline-from`'s query.
//
// Thread safety: constants only.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vramscope::collector {

inline constexpr int kSchemaVersion = 2;

enum class SqlDialect { kSqlite, kPostgres };

// The statements that take a database from version `from` to `from + 1` (from 0: create it).
std::vector<std::string> MigrationStatements(int from, SqlDialect dialect);

// ListRuns' query: parameters since_time_ns, then key and value of each of `labels` labels,
// then the limit. Returns id and the serialized RunSummary, most recent first.
std::string ListRunsQuery(std::size_t labels, bool passing_only, SqlDialect dialect);

}  // namespace vramscope::collector
