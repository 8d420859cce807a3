// Reports from a collector: see collector_source.h.
#include "report/collector_source.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <set>

#include "run/process_end.h"
#include "run/size.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope::cli {
namespace {

std::unique_ptr<v1::Collector::Stub> Stub(const CollectorQuery& query) {
  return v1::Collector::NewStub(net::MakeChannel(query.address, query.credentials));
}

void SetDeadline(grpc::ClientContext* context, const CollectorQuery& query) {
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(query.timeout));
}

// A failed call: NOT_FOUND is about the process asked for; anything else means there is no
// usable collector at that address.
absl::Status FromGrpc(const grpc::Status& status, const CollectorQuery& query, const char* call) {
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    return absl::NotFoundError(
        absl::StrCat("the collector at ", query.address, ": ", status.error_message()));
  }
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
      status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    return absl::UnavailableError(absl::StrFormat("the collector at %s refused %s: %s",
                                                  query.address, call, status.error_message()));
  }
  return absl::UnavailableError(absl::StrFormat(
      "cannot reach the collector at %s (%s: %s); is vramscope-collector running there? "
      "(its --listen address, HOST:PORT; %s)",
      query.address, call, status.error_message(), net::ConnectHint(query.credentials)));
}

}  // namespace

absl::StatusOr<v1::ListProcessesResponse> ListCollectorProcesses(const CollectorQuery& query) {
  grpc::ClientContext context;
  SetDeadline(&context, query);
  v1::ListProcessesRequest request;
  request.set_include_finished(true);
  v1::ListProcessesResponse response;
  const grpc::Status status = Stub(query)->ListProcesses(&context, request, &response);
  if (!status.ok()) return FromGrpc(status, query, "ListProcesses");
  return response;
}

absl::StatusOr<v1::Report> FetchCollectorReport(const CollectorQuery& query, std::uint32_t pid,
                                                const std::string& host) {
  absl::StatusOr<v1::ListProcessesResponse> list = ListCollectorProcesses(query);
  if (!list.ok()) return list.status();
  const v1::ProcessSummary* chosen = nullptr;
  std::set<std::string> hosts;
  for (const v1::ProcessSummary& process : list->processes()) {
    if (process.process().pid() != pid) continue;
    if (!host.empty() && process.process().host() != host) continue;
    hosts.insert(process.process().host());
    if (chosen == nullptr ||
        process.process().start_time_ns() > chosen->process().start_time_ns()) {
      chosen = &process;
    }
  }
  if (chosen == nullptr) {
    return absl::NotFoundError(absl::StrFormat(
        "the collector at %s has no process with pid %d%s; `vramscope report --collector %s` "
        "lists the %d it has",
        query.address, pid, host.empty() ? "" : absl::StrCat(" on host '", host, "'"),
        query.address, list->processes_size()));
  }
  if (hosts.size() > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pid %d is known on %d hosts at the collector at %s (%s): pick one with --host HOST", pid,
        hosts.size(), query.address, absl::StrJoin(hosts, ", ")));
  }
  grpc::ClientContext context;
  SetDeadline(&context, query);
  v1::GetReportRequest request;
  *request.mutable_process() = chosen->process();
  v1::Report report;
  const grpc::Status status = Stub(query)->GetReport(&context, request, &report);
  if (!status.ok()) return FromGrpc(status, query, "GetReport");
  return report;
}

std::string FormatProcessList(const v1::ListProcessesResponse& list) {
  std::string out = absl::StrFormat("%-20s %8s %-15s %10s %12s  %s\n", "HOST", "PID", "STATUS",
                                    "EVENTS", "PEAK RESERVED", "COMMAND");
  for (const v1::ProcessSummary& process : list.processes()) {
    const std::string status =
        process.finished() ? ProcessEndTag(true, process.killed(), process.signal()) : "running";
    absl::StrAppendFormat(
        &out, "%-20s %8d %-15s %10d %13s  %s\n", process.process().host(), process.process().pid(),
        status, process.events(), FormatBytes(process.peak_reserved_bytes()),
        process.command_line().empty() ? std::string("?")
                                       : absl::StrJoin(process.command_line(), " "));
  }
  return out;
}

}  // namespace vramscope::cli
