// Reports from a running vramscope-collector (gRPC: ListProcesses, GetReport).
//
// Errors: absl::Status whose message names the collector and says what to do. kUnavailable when
// the collector cannot be reached or does not answer as one (`vramscope report` exits 3);
// kNotFound when no process matches; kInvalidArgument when a pid matches processes on several
// hosts and no host was given (both exit 2). Thread-safe; each call opens its own channel.
#pragma once

#include <absl/status/statusor.h>
#include <absl/time/time.h>

#include <cstdint>
#include <string>

#include "vramscope/net_security.h"
#include "vramscope/v1/collector.pb.h"
#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

struct CollectorQuery {
  std::string address;                         // HOST:PORT
  absl::Duration timeout = absl::Seconds(10);  // per call
  net::ClientCredentials credentials;          // TLS and token; default plaintext, none
};

// Every process the collector knows, running and finished, sorted by host, pid, start.
absl::StatusOr<v1::ListProcessesResponse> ListCollectorProcesses(const CollectorQuery& query);

// The report of process `pid` (on `host` when not empty). When one host has had several
// processes with this pid, the latest started is taken.
absl::StatusOr<v1::Report> FetchCollectorReport(const CollectorQuery& query, std::uint32_t pid,
                                                const std::string& host);

// The listing `vramscope report --collector ADDR` prints: one line per process.
std::string FormatProcessList(const v1::ListProcessesResponse& list);

}  // namespace vramscope::cli
