// Reading report files: see report_file.h.
#include "common/report_file.h"

#include <absl/strings/str_cat.h>
#include <errno.h>
#include <fcntl.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/util/json_util.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <set>
#include <utility>

#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/struct.pb.h>

#include "vramscope/json/json_bounds.h"

namespace vramscope::cli {
namespace {

namespace pb = google::protobuf;

// The parser's first line: later ones draw a caret under the input, which is not shown here.
std::string FirstLine(const pb::util::Status& status) {
  std::string message = status.message().ToString();
  message.resize(std::min(message.size(), message.find('\n')));
  return message;
}

// `{"reports": [Report, ...]}` has no message of its own in proto/, so one is built at run time
// over the generated Report: the JSON parser then reads 64-bit figures exactly (going through
// google.protobuf.Struct would turn them into doubles).
class ReportListType {
 public:
  ReportListType() : pool_(pb::DescriptorPool::generated_pool()), factory_(&pool_) {
    factory_.SetDelegateToGeneratedFactory(true);
    pb::FileDescriptorProto file;
    file.set_name("vramscope/check/report_list.proto");
    file.set_package("vramscope.check");
    file.set_syntax("proto3");
    file.add_dependency(v1::Report::descriptor()->file()->name());
    pb::DescriptorProto* message = file.add_message_type();
    message->set_name("ReportList");
    pb::FieldDescriptorProto* field = message->add_field();
    field->set_name("reports");
    field->set_number(1);
    field->set_label(pb::FieldDescriptorProto::LABEL_REPEATED);
    field->set_type(pb::FieldDescriptorProto::TYPE_MESSAGE);
    field->set_type_name(".vramscope.v1.Report");
    const pb::FileDescriptor* built = pool_.BuildFile(file);
    // Impossible unless the generated Report is missing: a build error, not an input error.
    if (built == nullptr) std::abort();
    descriptor_ = built->message_type(0);
  }

  std::unique_ptr<pb::Message> New() {
    return std::unique_ptr<pb::Message>(factory_.GetPrototype(descriptor_)->New());
  }

 private:
  pb::DescriptorPool pool_;
  pb::DynamicMessageFactory factory_;
  const pb::Descriptor* descriptor_ = nullptr;
};

pb::util::JsonParseOptions ParseOptions() {
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;  // a misspelt or foreign file is an error, not zeros
  return options;
}

}  // namespace

absl::StatusOr<std::vector<v1::Report>> ParseReportsJson(std::string_view json_view,
                                                         std::string_view what_view) {
  // This Abseil's string_view is not std::string_view.
  const std::string json(json_view);
  const std::string what(what_view);
  // Depth and size first, in one linear pass: the parser's time grows with the square of the
  // nesting (json_bounds.h).
  if (absl::Status s = json::CheckJsonBounds(json, what); !s.ok()) return s;
  if (json.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is empty (expected the JSON of `vramscope run --json`)"));
  }
  // Syntax first, in a generic form, to tell the two shapes apart.
  pb::Struct object;
  if (auto s = pb::util::JsonStringToMessage(json, &object); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is not a JSON object as `vramscope run --json` writes: ", FirstLine(s)));
  }
  std::vector<v1::Report> reports;
  if (object.fields().contains("reports")) {
    static ReportListType* const list_type = new ReportListType();
    std::unique_ptr<pb::Message> list = list_type->New();
    if (auto s = pb::util::JsonStringToMessage(json, list.get(), ParseOptions()); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is not a {\"reports\": [Report, ...]} list: ", FirstLine(s)));
    }
    const pb::FieldDescriptor* field = list->GetDescriptor()->field(0);
    const pb::Reflection* reflection = list->GetReflection();
    const int n = reflection->FieldSize(*list, field);
    for (int i = 0; i < n; ++i) {
      // Same descriptor as v1::Report, possibly a dynamic instance: copy through the wire form.
      std::string wire;
      reflection->GetRepeatedMessage(*list, field, i).SerializeToString(&wire);
      if (!reports.emplace_back().ParseFromString(wire)) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": report ", i, " is damaged"));
      }
    }
  } else {
    if (auto s = pb::util::JsonStringToMessage(json, &reports.emplace_back(), ParseOptions());
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is not a vramscope.v1.Report: ", FirstLine(s)));
    }
  }
  // Figures are matched by device ordinal and by range domain and name: each must be unique.
  for (std::size_t i = 0; i < reports.size(); ++i) {
    std::set<std::uint32_t> ordinals;
    for (const v1::DeviceReport& device : reports[i].devices()) {
      if (!ordinals.insert(device.device().ordinal()).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": report ", i, " lists cuda:", device.device().ordinal(), " twice"));
      }
      std::set<std::pair<std::string, std::string>> ranges;
      for (const v1::NvtxRangeStats& range : device.nvtx_ranges()) {
        if (!ranges.emplace(range.domain(), range.name()).second) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": report ", i, " lists NVTX range '", range.domain(), ":",
                           range.name(), "' twice on cuda:", device.device().ordinal()));
        }
      }
    }
  }
  return reports;
}

absl::StatusOr<std::vector<v1::Report>> ReadReportsFile(const std::string& path,
                                                        std::string* text) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read ", path, ": ", strerror(errno)));
  }
  std::string content;
  struct stat st {};
  if (fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("cannot read ", path, ": not a file"));
  }
  // A file over the size limit is refused before it is read into memory.
  if (absl::Status s = json::CheckJsonSize(static_cast<std::size_t>(st.st_size), path); !s.ok()) {
    close(fd);
    return s;
  }
  char buffer[65536];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot read ", path, ": ", strerror(error)));
    }
    content.append(buffer, static_cast<std::size_t>(n));
    // Grown since fstat: stop at the limit rather than read on.
    if (absl::Status s = json::CheckJsonSize(content.size(), path); !s.ok()) {
      close(fd);
      return s;
    }
  }
  close(fd);
  absl::StatusOr<std::vector<v1::Report>> reports = ParseReportsJson(content, path);
  if (reports.ok() && text != nullptr) *text = std::move(content);
  return reports;
}

std::string WhyReportsEmpty(const std::vector<v1::Report>& reports) {
  if (reports.empty()) return "holds no process";
  bool any_event = false, any_device = false;
  for (const v1::Report& report : reports) {
    any_event |= report.events() > 0;
    any_device |= !report.devices().empty();
  }
  if (!any_event) {
    return reports.size() == 1 ? "holds a process with no event" : "holds processes with no event";
  }
  if (!any_device) return "holds no device";
  return "";
}

}  // namespace vramscope::cli
