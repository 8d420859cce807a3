#include "client/collector_call.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <chrono>

namespace vramscope::cli {

std::unique_ptr<v1::Collector::Stub> CollectorStub(const CollectorQuery& query) {
  return v1::Collector::NewStub(net::MakeChannel(query.address, query.credentials));
}

void SetCallDeadline(grpc::ClientContext* context, const CollectorQuery& query) {
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(query.timeout));
}

absl::Status FromCollectorCall(const grpc::Status& status, const CollectorQuery& query,
                               const char* call) {
  // NOT_FOUND and FAILED_PRECONDITION are about what was asked; anything else means there is
  // no usable collector at that address.
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    return absl::NotFoundError(
        absl::StrCat("the collector at ", query.address, ": ", status.error_message()));
  }
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    return absl::FailedPreconditionError(
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

absl::StatusOr<v1::ListRunsResponse> ListCollectorRuns(const CollectorQuery& query,
                                                       const v1::ListRunsRequest& request) {
  grpc::ClientContext context;
  SetCallDeadline(&context, query);
  v1::ListRunsResponse response;
  const grpc::Status status = CollectorStub(query)->ListRuns(&context, request, &response);
  if (!status.ok()) return FromCollectorCall(status, query, "ListRuns");
  return response;
}

absl::StatusOr<v1::Report> FetchCollectorRun(const CollectorQuery& query, std::int64_t run_id) {
  grpc::ClientContext context;
  SetCallDeadline(&context, query);
  v1::GetRunRequest request;
  request.set_run_id(run_id);
  v1::Report response;
  const grpc::Status status = CollectorStub(query)->GetRun(&context, request, &response);
  if (!status.ok()) return FromCollectorCall(status, query, "GetRun");
  return response;
}

}  // namespace vramscope::cli
