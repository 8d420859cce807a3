// `vramscope run --live`: the view run feeds while CMD runs. Declared here, between the two verbs:
// viewer-cli/top implements it (MakeRunLiveView), viewer-cli/run calls it, and the `vramscope`
// executable connects them (SetRunLiveViewFactory), so neither verb folder includes the other.
// Thread safety: a view is called on the one thread that supervises CMD.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "vramscope/v1/report.pb.h"

namespace vramscope::cli {

class RunLiveView {
 public:
  virtual ~RunLiveView() = default;
  // True when the view draws on the terminal: CMD then reads /dev/null and its output is held
  // back in a file and printed after the view closes.
  virtual bool TakesTerminal() const = 0;
  // About every 10 ms while CMD runs. `reports` builds the current reports (costly: the view
  // calls it at its own pace).
  virtual void Tick(const std::function<std::vector<v1::Report>()>& reports) = 0;
  // CMD has exited and every ring is drained: the final state; the terminal is given back.
  virtual void Close(const std::vector<v1::Report>& reports) = 0;
};
using RunLiveViewFactory = std::unique_ptr<RunLiveView> (*)();

}  // namespace vramscope::cli
