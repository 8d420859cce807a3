// Run labels: the text form of VRAMSCOPE_LABELS ("k=v,k=v") and the rules a label obeys, shared
// by the shim (which reads the variable at start and writes it into the ring), the agent's drain
// (which reads it back from a ring anybody may have written) and `vramscope run --label`.
//
// A label: key matching [A-Za-z_][A-Za-z0-9_]*, at most kMaxLabelKeyBytes; value valid UTF-8
// (anything, newlines and quotes included), at most kMaxLabelValueBytes. In the text form labels
// are separated by ',', and a value writes ',' as "\," and '\' as "\\" (no other escapes). At most
// kMaxLabels labels and kMaxLabelsTextBytes bytes in all. A key given twice: the last one counts.
//
// Thread safety: pure functions. Error convention: bool, with the reason written into a caller's
// buffer; no heap, no exceptions, no locks (callable from the shim's start-up).
#pragma once

#include <cstddef>
#include <string_view>

namespace vramscope::interposer {

inline constexpr std::size_t kMaxLabelKeyBytes = 64;
inline constexpr std::size_t kMaxLabelValueBytes = 256;
inline constexpr std::size_t kMaxLabels = 32;
inline constexpr std::size_t kMaxLabelsTextBytes = 1024;

// Called once per label, in order, with the value unescaped. Neither view outlives the call.
using LabelVisitor = void (*)(void* context, std::string_view key, std::string_view value);

// True when `key` and `value` (unescaped) make a label; else false with the reason in `why`.
bool CheckLabel(std::string_view key, std::string_view value, char* why, std::size_t why_size);

// Parses the text form. Every label is checked before the first is visited, so on false
// (`why` says which label and what is wrong) `visit` has not been called. `visit` may be null
// (check only). An empty text holds no labels.
bool ParseLabels(std::string_view text, LabelVisitor visit, void* context, char* why,
                 std::size_t why_size);

}  // namespace vramscope::interposer
