// Checks a `vramscope report --format html` page (as written, or as Chromium's --dump-dom
// serialises it after the script ran) against the reports it was made from: every element with
// data-path (report_html.h) must name a field of the report whose value is its data-value (text
// elements: whose string is its text), and every field the page promises to show must have one.
#ifndef VRAMSCOPE_TESTS_REPORT_DOM_CHECK_H_
#define VRAMSCOPE_TESTS_REPORT_DOM_CHECK_H_

#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "vramscope/v1/report.pb.h"

namespace vramscope::testing {

struct DomCell {
  std::string tag;
  std::string path;
  std::string field;
  std::string unit;
  std::string value;  // data-value, decoded
  bool has_value = false;
  std::string text;  // content, entities decoded (cells hold text only)
};

// &amp; &lt; &gt; &quot; &#39; &#x27; &nbsp; (what our writer and Chromium's serialiser emit).
inline std::string HtmlDecode(const std::string& in) {
  static const std::map<std::string, std::string> kEntities = {
      {"&amp;", "&"}, {"&lt;", "<"},   {"&gt;", ">"},         {"&quot;", "\""},
      {"&#39;", "'"}, {"&#x27;", "'"}, {"&nbsp;", "\xc2\xa0"}};
  std::string out;
  for (std::size_t i = 0; i < in.size();) {
    bool replaced = false;
    if (in[i] == '&') {
      for (const auto& [entity, text] : kEntities) {
        if (in.compare(i, entity.size(), entity) == 0) {
          out += text;
          i += entity.size();
          replaced = true;
          break;
        }
      }
    }
    if (!replaced) out += in[i++];
  }
  return out;
}

inline std::string Attribute(const std::string& tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const std::size_t at = tag.find(key);
  if (at == std::string::npos) return "";
  const std::size_t start = at + key.size();
  return HtmlDecode(tag.substr(start, tag.find('"', start) - start));
}

// Every element with a data-path attribute, in document order.
inline std::vector<DomCell> FindCells(const std::string& html) {
  std::vector<DomCell> cells;
  std::size_t pos = 0;
  while ((pos = html.find(" data-path=\"", pos)) != std::string::npos) {
    const std::size_t open = html.rfind('<', pos);
    const std::size_t close = html.find('>', pos);
    if (open == std::string::npos || close == std::string::npos) break;
    const std::string tag = html.substr(open, close - open);
    DomCell cell;
    cell.tag = tag.substr(1, tag.find(' ') - 1);
    cell.path = Attribute(tag, "data-path");
    cell.field = Attribute(tag, "data-field");
    cell.unit = Attribute(tag, "data-unit");
    cell.has_value = tag.find(" data-value=\"") != std::string::npos;
    cell.value = Attribute(tag, "data-value");
    const std::size_t end = html.find("</" + cell.tag + ">", close);
    cell.text = HtmlDecode(html.substr(close + 1, end - close - 1));
    cells.push_back(cell);
    pos = close;
  }
  return cells;
}

// Checks one cell against the reports; an error says which path and what differs.
inline absl::Status CheckCell(const std::vector<v1::Report>& reports, const DomCell& cell) {
  namespace pb = google::protobuf;
  const std::vector<std::string> parts = absl::StrSplit(cell.path, '.');
  std::size_t r = 0;
  if (parts.empty() || !absl::SimpleAtoi(parts[0], &r) || r >= reports.size()) {
    return absl::NotFoundError(absl::StrCat(cell.path, ": no such report"));
  }
  if (std::find(parts.begin(), parts.end(), cell.field) == parts.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(cell.path, ": data-field '", cell.field, "' is not on the path"));
  }
  const pb::Message* message = &reports[r];
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const pb::Descriptor* type = message->GetDescriptor();
    const pb::Reflection* reflection = message->GetReflection();
    const pb::FieldDescriptor* field = type->FindFieldByName(parts[i]);
    if (field == nullptr) {
      return absl::NotFoundError(absl::StrCat(cell.path, ": ", type->name(), " has no ", parts[i]));
    }
    int index = -1;
    if (field->is_map()) {
      if (i + 1 >= parts.size()) return absl::NotFoundError(absl::StrCat(cell.path, ": no key"));
      // A map value ends the path, so the key is the rest of it (library keys hold dots).
      const std::string key =
          absl::StrJoin(parts.begin() + static_cast<std::ptrdiff_t>(i) + 1, parts.end(), ".");
      i = parts.size() - 1;
      for (int k = 0; k < reflection->FieldSize(*message, field); ++k) {
        const pb::Message& entry = reflection->GetRepeatedMessage(*message, field, k);
        const pb::FieldDescriptor* key_field = entry.GetDescriptor()->map_key();
        if (entry.GetReflection()->GetString(entry, key_field) == key) {
          const pb::FieldDescriptor* value_field = entry.GetDescriptor()->map_value();
          const std::string want =
              absl::StrCat(entry.GetReflection()->GetUInt64(entry, value_field));
          if (i + 1 != parts.size() || cell.value != want) {
            return absl::InvalidArgumentError(
                absl::StrCat(cell.path, ": data-value ", cell.value, ", report ", want));
          }
          return absl::OkStatus();
        }
      }
      return absl::NotFoundError(absl::StrCat(cell.path, ": no key ", key));
    }
    if (field->is_repeated()) {
      if (i + 1 >= parts.size() || !absl::SimpleAtoi(parts[i + 1], &index) || index < 0 ||
          index >= reflection->FieldSize(*message, field)) {
        return absl::NotFoundError(absl::StrCat(cell.path, ": bad index"));
      }
      ++i;
    }
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      message = index >= 0 ? &reflection->GetRepeatedMessage(*message, field, index)
                           : &reflection->GetMessage(*message, field);
      continue;
    }
    if (i + 1 != parts.size()) {
      return absl::NotFoundError(absl::StrCat(cell.path, ": path goes on past a value"));
    }
    std::string want;
    const bool repeated = index >= 0;
    switch (field->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_UINT64:
        want = absl::StrCat(repeated ? reflection->GetRepeatedUInt64(*message, field, index)
                                     : reflection->GetUInt64(*message, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT32:
        want = absl::StrCat(reflection->GetUInt32(*message, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        want = absl::StrCat(reflection->GetInt64(*message, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT32:
        want = absl::StrCat(reflection->GetInt32(*message, field));
        break;
      case pb::FieldDescriptor::CPPTYPE_BOOL:
        want = reflection->GetBool(*message, field) ? "true" : "false";
        break;
      case pb::FieldDescriptor::CPPTYPE_ENUM:
        want = reflection->GetEnum(*message, field)->name();
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
        double shown = 0;
        const double value = reflection->GetDouble(*message, field);
        if (!absl::SimpleAtod(cell.value, &shown) || shown != value) {
          return absl::InvalidArgumentError(
              absl::StrCat(cell.path, ": data-value ", cell.value, ", report ", value));
        }
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_STRING: {
        want = repeated ? reflection->GetRepeatedString(*message, field, index)
                        : reflection->GetString(*message, field);
        if (cell.unit != "text" || cell.text != want) {
          return absl::InvalidArgumentError(
              absl::StrCat(cell.path, ": text '", cell.text, "', report '", want, "'"));
        }
        return absl::OkStatus();
      }
      default:
        return absl::InternalError(absl::StrCat(cell.path, ": unexpected type"));
    }
    if (!cell.has_value || cell.value != want) {
      return absl::InvalidArgumentError(
          absl::StrCat(cell.path, ": data-value '", cell.value, "', report ", want));
    }
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat(cell.path, ": names a message, not a value"));
}

// The paths the page must show: every value in the report except the plotted series (timeline,
// nvtx_instances, allocation_sites; of the allocations only those live at the peak, in its
// table, without their NVTX domain and thread), what the headings carry (device ordinal), the
// process key's start time (the report's own start time is shown), exit_code of a process still
// running, and the CUPTI view of a device that has none.
inline void AddExpectedPaths(const google::protobuf::Message& message, const std::string& prefix,
                             bool finished, std::set<std::string>* paths) {
  namespace pb = google::protobuf;
  const pb::Descriptor* type = message.GetDescriptor();
  const pb::Reflection* reflection = message.GetReflection();
  for (int f = 0; f < type->field_count(); ++f) {
    const pb::FieldDescriptor* field = type->field(f);
    const std::string path = prefix + field->name();
    const std::string& name = type->name();
    if (name == "DeviceReport" &&
        (field->name() == "timeline" || field->name() == "nvtx_instances" ||
         field->name() == "allocation_sites" ||
         (field->name() == "cupti" && !reflection->HasField(message, field)))) {
      continue;
    }
    if (name == "DeviceReport" && field->name() == "allocations") {
      // The peak table's rows: those live at the peak (fewer than 100 in the samples).
      for (int k = 0; k < reflection->FieldSize(message, field); ++k) {
        const auto& a = static_cast<const v1::AllocationRecord&>(
            reflection->GetRepeatedMessage(message, field, k));
        if (!a.live_at_peak()) continue;
        for (const char* shown : {"address", "requested_bytes", "allocated_bytes", "kind", "site",
                                  "nvtx_name", "alloc_time_ns", "free_time_ns"}) {
          paths->insert(absl::StrCat(path, ".", k, ".", shown));
        }
      }
      continue;
    }
    if (name == "DeviceInfo" && field->name() == "ordinal") continue;
    if (name == "ProcessKey" && field->name() == "start_time_ns") continue;
    if (name == "Report" && !finished &&
        (field->name() == "exit_code" || field->name() == "killed" || field->name() == "signal" ||
         field->name() == "vanished")) {
      continue;  // still running: how it ended is not shown
    }
    if (field->is_map()) {
      for (int k = 0; k < reflection->FieldSize(message, field); ++k) {
        const pb::Message& entry = reflection->GetRepeatedMessage(message, field, k);
        paths->insert(absl::StrCat(
            path, ".", entry.GetReflection()->GetString(entry, entry.GetDescriptor()->map_key())));
      }
    } else if (field->is_repeated()) {
      for (int k = 0; k < reflection->FieldSize(message, field); ++k) {
        if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
          AddExpectedPaths(reflection->GetRepeatedMessage(message, field, k),
                           absl::StrCat(path, ".", k, "."), finished, paths);
        } else {
          paths->insert(absl::StrCat(path, ".", k));
        }
      }
    } else if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      AddExpectedPaths(reflection->GetMessage(message, field), path + ".", finished, paths);
    } else {
      paths->insert(path);
    }
  }
}

inline std::set<std::string> ExpectedPaths(const std::vector<v1::Report>& reports) {
  std::set<std::string> paths;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    AddExpectedPaths(reports[r], absl::StrCat(r, "."), reports[r].finished(), &paths);
  }
  return paths;
}

}  // namespace vramscope::testing

#endif  // VRAMSCOPE_TESTS_REPORT_DOM_CHECK_H_
