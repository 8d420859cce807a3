// The run history's database: one row per finished process (a RunSummary in columns, its
// devices in run_devices, its labels in run_labels, and the serialized Report), behind one
// interface for SQLite (sqlite_store.h, the default, in the data directory) and PostgreSQL
// (postgres_store.h, --database postgresql://...).
//
// Schema: versioned (schema_version table, one row); Open applies every migration from the
// version found to kSchemaVersion in one transaction each (history_schema.h). A row is keyed by
// (host, pid, start_time_ns): inserting the same run again is a no-op, so the writer may retry a
// row whose acknowledgement it lost.
//
// Thread safety: every method may be called from any thread (an internal mutex serialises the
// connection). Error convention: absl::Status; UNAVAILABLE when the database cannot be reached
// (the writer keeps the row queued and retries), NOT_FOUND for an unknown run, INTERNAL else.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <cstdint>
#include <memory>
#include <string>

#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::collector {

class HistoryStore {
 public:
  virtual ~HistoryStore() = default;
  // Stores the finished run `run` (SummarizeRun of its report) with `report`, its serialized
  // Report (stored as it is); OK also when it is there already.
  virtual absl::Status InsertRow(const v1::RunSummary& run, absl::string_view report) = 0;
  // InsertRow of `report`'s summary and bytes.
  absl::Status Insert(const v1::Report& report);
  virtual absl::StatusOr<v1::ListRunsResponse> List(const v1::ListRunsRequest& request) = 0;
  virtual absl::StatusOr<v1::Report> Get(int64_t run_id) = 0;
  // The schema version the database is at (after Open: kSchemaVersion).
  virtual absl::StatusOr<int> SchemaVersion() = 0;
};

// `database`: "" = SQLite at <data_dir>/history.sqlite; "sqlite:PATH" = SQLite at PATH;
// "postgresql://..." or "postgres://..." = PostgreSQL (libpq connection URI). A PostgreSQL server
// that is down is not an error here: the store connects when it is first used.
absl::StatusOr<std::unique_ptr<HistoryStore>> OpenHistoryStore(const std::string& database,
                                                               const std::string& data_dir);

}  // namespace vramscope::collector
