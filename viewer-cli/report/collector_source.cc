// Reports from a collector: see collector_source.h.
#include "report/collector_source.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <vector>

#include "common/process_end.h"
#include "common/size.h"
#include "report/merge.h"
#include "vramscope/process_key.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope::cli {
namespace {

std::vector<std::string> Addresses(const std::string& list) {
  std::vector<std::string> out = absl::StrSplit(list, ',', absl::SkipWhitespace());
  return out;
}

CollectorQuery One(const CollectorQuery& query, const std::string& address) {
  CollectorQuery one = query;
  one.address = address;
  return one;
}

absl::StatusOr<v1::ListProcessesResponse> ListOne(const CollectorQuery& query) {
  grpc::ClientContext context;
  SetCallDeadline(&context, query);
  v1::ListProcessesRequest request;
  request.set_include_finished(true);
  v1::ListProcessesResponse response;
  const grpc::Status status = CollectorStub(query)->ListProcesses(&context, request, &response);
  if (!status.ok()) return FromCollectorCall(status, query, "ListProcesses");
  return response;
}

absl::StatusOr<v1::Report> ReportOne(const CollectorQuery& query, const v1::ProcessKey& key,
                                     const SequenceSet& skip) {
  grpc::ClientContext context;
  SetCallDeadline(&context, query);
  v1::GetReportRequest request;
  *request.mutable_process() = key;
  request.mutable_skip()->Assign(skip.begin(), skip.end());
  v1::Report report;
  const grpc::Status status = CollectorStub(query)->GetReport(&context, request, &report);
  if (!status.ok()) return FromCollectorCall(status, query, "GetReport");
  return report;
}

// The report of `key` over every collector of `addresses` that holds it, each sequence counted
// once: a sequence held by several is counted at the first of them in the list.
absl::StatusOr<v1::Report> MergedReport(const CollectorQuery& query,
                                        const std::vector<std::string>& addresses,
                                        const v1::ProcessKey& key) {
  std::vector<v1::Report> parts;
  SequenceSet claimed;
  absl::Status last_error;
  for (const std::string& address : addresses) {
    absl::StatusOr<v1::Report> part = ReportOne(One(query, address), key, {});
    if (!part.ok()) {
      if (!absl::IsNotFound(part.status())) last_error = part.status();
      continue;
    }
    SequenceSet held = Normalize({part->held().begin(), part->held().end()});
    SequenceSet twice = Intersect(held, claimed);
    if (!twice.empty()) {
      // Stored here and at a collector before it in the list: asked again without those.
      part = ReportOne(One(query, address), key, twice);
      if (!part.ok()) return part.status();
    }
    claimed = Union(claimed, held);
    parts.push_back(std::move(*part));
  }
  if (parts.empty()) {
    if (!last_error.ok()) return last_error;
    return absl::NotFoundError(absl::StrFormat("no collector of %s holds process %s", query.address,
                                               ProcessKeyString(key)));
  }
  return MergeReports(parts);
}

}  // namespace

absl::StatusOr<v1::ListProcessesResponse> ListCollectorProcesses(const CollectorQuery& query) {
  const std::vector<std::string> addresses = Addresses(query.address);
  if (addresses.size() <= 1) return ListOne(query);
  std::vector<v1::ListProcessesResponse> lists;
  absl::Status last_error;
  for (const std::string& address : addresses) {
    absl::StatusOr<v1::ListProcessesResponse> list = ListOne(One(query, address));
    if (!list.ok()) {
      // A collector of the fleet may be down (its agents failed over): the others still answer.
      std::fprintf(stderr, "vramscope: skipping %s\n",
                   std::string(list.status().message()).c_str());
      last_error = list.status();
      continue;
    }
    lists.push_back(std::move(*list));
  }
  if (lists.empty()) return last_error;
  return MergeListings(lists);
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
  const std::vector<std::string> addresses = Addresses(query.address);
  if (addresses.size() > 1) return MergedReport(query, addresses, chosen->process());
  return ReportOne(query, chosen->process(), {});
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
