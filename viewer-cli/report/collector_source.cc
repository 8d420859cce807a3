// Reports from a collector: see collector_source.h.
#include "report/collector_source.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <set>

#include "run/process_end.h"
#include "run/size.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope::cli {

absl::StatusOr<v1::ListProcessesResponse> ListCollectorProcesses(const CollectorQuery& query) {
  grpc::ClientContext context;
  SetCallDeadline(&context, query);
  v1::ListProcessesRequest request;
  request.set_include_finished(true);
  v1::ListProcessesResponse response;
  const grpc::Status status = CollectorStub(query)->ListProcesses(&context, request, &response);
  if (!status.ok()) return FromCollectorCall(status, query, "ListProcesses");
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
  SetCallDeadline(&context, query);
  v1::GetReportRequest request;
  *request.mutable_process() = chosen->process();
  v1::Report report;
  const grpc::Status status = CollectorStub(query)->GetReport(&context, request, &report);
  if (!status.ok()) return FromCollectorCall(status, query, "GetReport");
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
