// Every value goes in as a parameter (exec_params, $1..$n); blobs as bytea (binarystring).
#include "history/postgres_store.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/synchronization/mutex.h>

#include <functional>

#include "history/history_schema.h"
#include "history/run_summary.h"

#include <pqxx/pqxx>

namespace vramscope::collector {
namespace {

// Any number; the same in every collector: serialises migrations.
constexpr int64_t kMigrationLock = 0x7672616d73636f70;  // "vramscop"

int64_t I64(uint64_t value) { return static_cast<int64_t>(std::min<uint64_t>(value, INT64_MAX)); }

class PostgresStore : public HistoryStore {
 public:
  explicit PostgresStore(std::string uri) : uri_(std::move(uri)) {}

  absl::Status InsertRow(const v1::RunSummary& run, absl::string_view report) override;
  absl::StatusOr<v1::ListRunsResponse> List(const v1::ListRunsRequest& request) override;
  absl::StatusOr<v1::Report> Get(int64_t run_id) override;
  absl::StatusOr<int> SchemaVersion() override;

 private:
  // Runs `body` in a transaction on a (re)connected, migrated database; exceptions become a
  // status and drop the connection.
  absl::Status Transact(const std::function<absl::Status(pqxx::work&)>& body);
  absl::Status ConnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Migrate(pqxx::connection& connection);

  const std::string uri_;
  absl::Mutex mu_;
  std::unique_ptr<pqxx::connection> connection_ ABSL_GUARDED_BY(mu_);
};

int VersionIn(pqxx::work& work) {
  const pqxx::row exists = work.exec1("SELECT to_regclass('schema_version') IS NOT NULL");
  if (!exists[0].as<bool>()) return 0;
  return work.exec1("SELECT version FROM schema_version")[0].as<int>();
}

absl::Status PostgresStore::Migrate(pqxx::connection& connection) {
  pqxx::work work(connection);
  work.exec_params("SELECT pg_advisory_xact_lock($1)", kMigrationLock);
  const int version = VersionIn(work);
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("history database: schema version ", version, " is newer than this ",
                     "collector's (", kSchemaVersion, "): use a newer vramscope-collector"));
  }
  // All steps in one transaction: PostgreSQL's DDL is transactional.
  for (int from = version; from < kSchemaVersion; ++from) {
    for (const std::string& statement : MigrationStatements(from, SqlDialect::kPostgres)) {
      work.exec(statement);
    }
  }
  work.commit();
  return absl::OkStatus();
}

absl::Status PostgresStore::ConnectLocked() {
  if (connection_ != nullptr && connection_->is_open()) return absl::OkStatus();
  connection_.reset();
  auto connection = std::make_unique<pqxx::connection>(uri_);
  if (absl::Status s = Migrate(*connection); !s.ok()) return s;
  connection_ = std::move(connection);
  return absl::OkStatus();
}

absl::Status PostgresStore::Transact(const std::function<absl::Status(pqxx::work&)>& body) {
  absl::MutexLock lock(&mu_);
  try {
    if (absl::Status s = ConnectLocked(); !s.ok()) return s;
    pqxx::work work(*connection_);
    if (absl::Status s = body(work); !s.ok()) return s;
    work.commit();
    return absl::OkStatus();
  } catch (const pqxx::broken_connection& e) {
    connection_.reset();
    return absl::UnavailableError(absl::StrCat("history database (PostgreSQL): ", e.what()));
  } catch (const std::exception& e) {
    connection_.reset();
    return absl::UnavailableError(absl::StrCat("history database (PostgreSQL): ", e.what()));
  }
}

absl::Status InsertRun(pqxx::work& work, const v1::RunSummary& run, absl::string_view whole) {
  const std::string summary = run.SerializeAsString();
  const pqxx::result inserted = work.exec_params(
      "INSERT INTO runs (host, pid, start_time_ns, end_time_ns, exit_code, killed, signal, "
      "vanished, command_line, summary, report, passed) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, "
      "$9, $10, $11, $12) ON CONFLICT DO NOTHING RETURNING id",
      run.process().host(), I64(run.process().pid()), I64(run.process().start_time_ns()),
      I64(run.end_time_ns()), run.exit_code(), static_cast<int>(run.killed()), run.signal(),
      static_cast<int>(run.vanished()), absl::StrJoin(run.command_line(), " "),
      pqxx::binarystring(summary.data(), summary.size()),
      pqxx::binarystring(whole.data(), whole.size()), static_cast<int>(RunPassed(run)));
  if (inserted.empty()) return absl::OkStatus();  // stored before
  const int64_t id = inserted[0][0].as<int64_t>();
  for (const v1::RunDevicePeaks& d : run.devices()) {
    work.exec_params(
        "INSERT INTO run_devices (run_id, ordinal, peak_requested_bytes, peak_allocated_bytes, "
        "peak_reserved_bytes, fragmentation_at_peak, alloc_count, oom_count, cupti_peak_bytes) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
        id, static_cast<int>(d.ordinal()), I64(d.peak_requested_bytes()),
        I64(d.peak_allocated_bytes()), I64(d.peak_reserved_bytes()), d.fragmentation_at_peak(),
        I64(d.alloc_count()), I64(d.oom_count()), I64(d.cupti_peak_bytes()));
  }
  for (const auto& [key, value] : run.labels()) {
    work.exec_params("INSERT INTO run_labels (run_id, key, value) VALUES ($1, $2, $3)", id, key,
                     value);
  }
  return absl::OkStatus();
}

absl::Status PostgresStore::InsertRow(const v1::RunSummary& run, absl::string_view report) {
  return Transact([&](pqxx::work& work) { return InsertRun(work, run, report); });
}

absl::StatusOr<v1::ListRunsResponse> PostgresStore::List(const v1::ListRunsRequest& request) {
  // As many parameters as the query has placeholders (ListRunsQuery), sent as text: the server
  // takes their types from where they stand.
  std::vector<std::string> params = {std::to_string(I64(request.since_time_ns()))};
  for (const auto& [key, value] : request.labels()) {
    params.push_back(key);
    params.push_back(value);
  }
  params.push_back(std::to_string(request.limit() == 0 ? 1000 : request.limit()));
  const std::string query =
      ListRunsQuery(request.labels().size(), request.passing_only(), SqlDialect::kPostgres);
  v1::ListRunsResponse response;
  absl::Status status = Transact([&](pqxx::work& work) -> absl::Status {
    const pqxx::result rows = work.exec_params(query, pqxx::prepare::make_dynamic_params(params));
    for (const pqxx::row& row : rows) {
      v1::RunSummary* run = response.add_runs();
      const pqxx::binarystring bytes(row[1]);
      if (!run->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        return absl::InternalError("history database: a corrupt run summary");
      }
      run->set_run_id(row[0].as<int64_t>());
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::Report> PostgresStore::Get(int64_t run_id) {
  v1::Report report;
  bool found = false;
  absl::Status status = Transact([&](pqxx::work& work) -> absl::Status {
    const pqxx::result rows = work.exec_params("SELECT report FROM runs WHERE id = $1", run_id);
    if (rows.empty()) return absl::OkStatus();
    const pqxx::binarystring bytes(rows[0][0]);
    found = report.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
    if (!found) return absl::InternalError(absl::StrCat("run ", run_id, " has a corrupt report"));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  if (!found) return absl::NotFoundError(absl::StrCat("no run ", run_id, " in the history"));
  return report;
}

absl::StatusOr<int> PostgresStore::SchemaVersion() {
  int version = 0;
  absl::Status status = Transact([&](pqxx::work& work) {
    version = VersionIn(work);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return version;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HistoryStore>> OpenPostgresStore(const std::string& uri) {
  return std::make_unique<PostgresStore>(uri);
}

}  // namespace vramscope::collector
