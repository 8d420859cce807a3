// SQLite through its C API. Every value goes in as a bound parameter (sqlite3_bind_*).
#include "history/sqlite_store.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>
#include <fcntl.h>
#include <unistd.h>

#include "history/history_schema.h"
#include "history/run_summary.h"

#include <sqlite3.h>

namespace vramscope::collector {
namespace {

using Statement = std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)>;

class SqliteStore : public HistoryStore {
 public:
  explicit SqliteStore(sqlite3* db) : db_(db) {}
  ~SqliteStore() override { sqlite3_close(db_); }

  absl::Status Migrate();
  absl::Status InsertRow(const v1::RunSummary& run, absl::string_view report) override;
  absl::StatusOr<v1::ListRunsResponse> List(const v1::ListRunsRequest& request) override;
  absl::StatusOr<v1::Report> Get(int64_t run_id) override;
  absl::StatusOr<int> SchemaVersion() override;

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InternalError(absl::StrCat("history database: ", what, ": ", sqlite3_errmsg(db_)));
  }
  absl::StatusOr<Statement> Prepare(const std::string& sql) {
    sqlite3_stmt* statement = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &statement, nullptr) != SQLITE_OK) {
      return Error(absl::StrCat("preparing ", sql.substr(0, 60)));
    }
    return Statement(statement, &sqlite3_finalize);
  }
  absl::Status Exec(const std::string& sql) {
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) {
      return Error(sql.substr(0, 60));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<int> VersionLocked();
  absl::Status InsertLocked(const v1::RunSummary& run, absl::string_view report);

  absl::Mutex mu_;
  sqlite3* db_;
};

void BindText(sqlite3_stmt* s, int i, const std::string& text) {
  sqlite3_bind_text(s, i, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
}
void BindBlob(sqlite3_stmt* s, int i, absl::string_view bytes) {
  sqlite3_bind_blob(s, i, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
}
void BindU64(sqlite3_stmt* s, int i, uint64_t value) {
  sqlite3_bind_int64(s, i, static_cast<sqlite3_int64>(value));
}

absl::StatusOr<int> SqliteStore::VersionLocked() {
  absl::StatusOr<Statement> exists =
      Prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'");
  if (!exists.ok()) return exists.status();
  if (sqlite3_step(exists->get()) != SQLITE_ROW) return 0;
  absl::StatusOr<Statement> query = Prepare("SELECT version FROM schema_version");
  if (!query.ok()) return query.status();
  if (sqlite3_step(query->get()) != SQLITE_ROW) return Error("schema_version is empty");
  return sqlite3_column_int(query->get(), 0);
}

absl::StatusOr<int> SqliteStore::SchemaVersion() {
  absl::MutexLock lock(&mu_);
  return VersionLocked();
}

absl::Status SqliteStore::Migrate() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int> version = VersionLocked();
  if (!version.ok()) return version.status();
  if (*version > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("history database: schema version ", *version, " is newer than this ",
                     "collector's (", kSchemaVersion, "): use a newer vramscope-collector"));
  }
  for (int from = *version; from < kSchemaVersion; ++from) {
    // One transaction per step: a crash mid-migration leaves the previous version whole.
    if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
    for (const std::string& statement : MigrationStatements(from, SqlDialect::kSqlite)) {
      if (absl::Status s = Exec(statement); !s.ok()) {
        (void)Exec("ROLLBACK");
        return s;
      }
    }
    if (absl::Status s = Exec("COMMIT"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::InsertRow(const v1::RunSummary& run, absl::string_view report) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status s = InsertLocked(run, report);
  if (!s.ok()) {
    (void)Exec("ROLLBACK");
    return s;
  }
  return Exec("COMMIT");
}

absl::Status SqliteStore::InsertLocked(const v1::RunSummary& run, absl::string_view report) {
  absl::StatusOr<Statement> insert = Prepare(
      "INSERT INTO runs (host, pid, start_time_ns, end_time_ns, exit_code, killed, signal, "
      "vanished, command_line, summary, report, passed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
      "?) "
      "ON CONFLICT DO NOTHING");
  if (!insert.ok()) return insert.status();
  sqlite3_stmt* s = insert->get();
  BindText(s, 1, run.process().host());
  BindU64(s, 2, run.process().pid());
  BindU64(s, 3, run.process().start_time_ns());
  BindU64(s, 4, run.end_time_ns());
  sqlite3_bind_int(s, 5, run.exit_code());
  sqlite3_bind_int(s, 6, run.killed());
  sqlite3_bind_int(s, 7, run.signal());
  sqlite3_bind_int(s, 8, run.vanished());
  BindText(s, 9, absl::StrJoin(run.command_line(), " "));
  BindBlob(s, 10, run.SerializeAsString());
  BindBlob(s, 11, report);
  sqlite3_bind_int(s, 12, RunPassed(run));
  if (sqlite3_step(s) != SQLITE_DONE) return Error("inserting a run");
  if (sqlite3_changes(db_) == 0) return absl::OkStatus();  // stored before
  const sqlite3_int64 id = sqlite3_last_insert_rowid(db_);
  absl::StatusOr<Statement> device = Prepare(
      "INSERT INTO run_devices (run_id, ordinal, peak_requested_bytes, peak_allocated_bytes, "
      "peak_reserved_bytes, fragmentation_at_peak, alloc_count, oom_count, cupti_peak_bytes) "
      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING");
  if (!device.ok()) return device.status();
  for (const v1::RunDevicePeaks& d : run.devices()) {
    sqlite3_stmt* ds = device->get();
    sqlite3_reset(ds);
    sqlite3_bind_int64(ds, 1, id);
    sqlite3_bind_int(ds, 2, static_cast<int>(d.ordinal()));
    BindU64(ds, 3, d.peak_requested_bytes());
    BindU64(ds, 4, d.peak_allocated_bytes());
    BindU64(ds, 5, d.peak_reserved_bytes());
    sqlite3_bind_double(ds, 6, d.fragmentation_at_peak());
    BindU64(ds, 7, d.alloc_count());
    BindU64(ds, 8, d.oom_count());
    BindU64(ds, 9, d.cupti_peak_bytes());
    if (sqlite3_step(ds) != SQLITE_DONE) return Error("inserting a run's device");
  }
  absl::StatusOr<Statement> label =
      Prepare("INSERT INTO run_labels (run_id, key, value) VALUES (?, ?, ?)");
  if (!label.ok()) return label.status();
  for (const auto& [key, value] : run.labels()) {
    sqlite3_stmt* ls = label->get();
    sqlite3_reset(ls);
    sqlite3_bind_int64(ls, 1, id);
    BindText(ls, 2, key);
    BindText(ls, 3, value);
    if (sqlite3_step(ls) != SQLITE_DONE) return Error("inserting a run's label");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ListRunsResponse> SqliteStore::List(const v1::ListRunsRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Statement> query =
      Prepare(ListRunsQuery(request.labels().size(), request.passing_only(), SqlDialect::kSqlite));
  if (!query.ok()) return query.status();
  sqlite3_stmt* s = query->get();
  int i = 1;
  BindU64(s, i++, std::min<uint64_t>(request.since_time_ns(), INT64_MAX));
  for (const auto& [key, value] : request.labels()) {
    BindText(s, i++, key);
    BindText(s, i++, value);
  }
  sqlite3_bind_int64(s, i, request.limit() == 0 ? 1000 : request.limit());
  v1::ListRunsResponse response;
  int step;
  while ((step = sqlite3_step(s)) == SQLITE_ROW) {
    v1::RunSummary* run = response.add_runs();
    const void* blob = sqlite3_column_blob(s, 1);
    if (!run->ParseFromArray(blob, sqlite3_column_bytes(s, 1))) return Error("a corrupt summary");
    run->set_run_id(sqlite3_column_int64(s, 0));
  }
  if (step != SQLITE_DONE) return Error("listing runs");
  return response;
}

absl::StatusOr<v1::Report> SqliteStore::Get(int64_t run_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Statement> query = Prepare("SELECT report FROM runs WHERE id = ?");
  if (!query.ok()) return query.status();
  sqlite3_bind_int64(query->get(), 1, run_id);
  if (sqlite3_step(query->get()) != SQLITE_ROW) {
    return absl::NotFoundError(absl::StrCat("no run ", run_id, " in the history"));
  }
  v1::Report report;
  if (!report.ParseFromArray(sqlite3_column_blob(query->get(), 0),
                             sqlite3_column_bytes(query->get(), 0))) {
    return Error(absl::StrCat("run ", run_id, " has a corrupt report"));
  }
  return report;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HistoryStore>> OpenSqliteStore(const std::string& path) {
  // Created 0600 before SQLite opens it: it holds command lines.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, nullptr) !=
      SQLITE_OK) {
    const std::string why = db != nullptr ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::InternalError(absl::StrCat("history database ", path, ": ", why));
  }
  sqlite3_busy_timeout(db, 5000);
  auto store = std::make_unique<SqliteStore>(db);
  sqlite3_exec(db, "PRAGMA foreign_keys = ON; PRAGMA journal_mode = WAL", nullptr, nullptr,
               nullptr);
  if (absl::Status s = store->Migrate(); !s.ok()) return s;
  return store;
}

}  // namespace vramscope::collector
