// Calls to a running vramscope-collector (gRPC) shared by `vramscope report`, `history` and
// `check --baseline-from`: the stub and deadline, how a failed call reads, and the run history
// (ListRuns, GetRun).
//
// Errors: absl::Status whose message names the collector and says what to do. kUnavailable when
// the collector cannot be reached or does not answer as one (exit 3); kNotFound when the process
// or run asked for is not there; kFailedPrecondition when the collector keeps no run history
// (both exit 2). Thread-safe; each call opens its own channel.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/time/time.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "vramscope/net_security.h"
#include "vramscope/v1/collector.grpc.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

struct CollectorQuery {
  // HOST:PORT, or several comma-separated (an agent's `--collector a,b,c`): `vramscope report`
  // then merges what they hold (report/merge.h), skipping with a line on stderr a collector
  // that cannot be reached, unless none can.
  std::string address;
  absl::Duration timeout = absl::Seconds(10);  // per call
  net::ClientCredentials credentials;          // TLS and token; default plaintext, none
};

std::unique_ptr<v1::Collector::Stub> CollectorStub(const CollectorQuery& query);
void SetCallDeadline(grpc::ClientContext* context, const CollectorQuery& query);
// A failed call `call` as a status of the kinds above.
absl::Status FromCollectorCall(const grpc::Status& status, const CollectorQuery& query,
                               const char* call);

// The collector's run history, most recent first.
absl::StatusOr<v1::ListRunsResponse> ListCollectorRuns(const CollectorQuery& query,
                                                       const v1::ListRunsRequest& request);
absl::StatusOr<v1::Report> FetchCollectorRun(const CollectorQuery& query, std::int64_t run_id);

}  // namespace vramscope::cli
