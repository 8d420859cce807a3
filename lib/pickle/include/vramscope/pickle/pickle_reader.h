// ReadPickle: a reader for the subset of Python's pickle format that plain data uses (protocols
// 2 to 5): dicts, lists, tuples, str, int (up to 64 bits), float, bool and None, with the memo
// (BINPUT/MEMOIZE/BINGET) and protocol 4 framing. It is a data parser, not an unpickler: it never
// imports, calls or builds anything. Every other opcode (GLOBAL, STACK_GLOBAL, REDUCE, BUILD,
// INST, OBJ, NEWOBJ, PERSID, bytes, sets, ...) is refused with an error naming it and its
// offset, as are truncated input, stack underflow, a memo index never stored, an integer wider
// than 64 bits, an unhashable dict key and a document over the value limit.
//
// The document is a graph of values (the memo can share one value from several places, and a
// hostile pickle can make a list contain itself), so readers walk it along a known schema, never
// recursively without a depth bound.
//
// Strings point into the input: the bytes given to ReadPickle must outlive the PickleDocument.
// Thread safety: a PickleDocument is immutable after ReadPickle returns; share it freely.
// Errors: absl::Status, INVALID_ARGUMENT with `offset N: message`.
#pragma once

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace vramscope::pickle {

enum class Kind : std::uint8_t { kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict };

using ValueId = std::uint32_t;

struct Value {
  Kind kind = Kind::kNone;
  std::int64_t integer = 0;  // kInt; kBool: 0 or 1
  double real = 0;           // kFloat
  std::string_view text;     // kString (valid UTF-8 is not checked: Python's is)
  // kList, kTuple: the items; kDict: key, value, key, value, ... in the order they were set (a
  // key set twice is there twice; Find returns the last value, as Python keeps).
  std::vector<ValueId> items;
};

// At most this many values (containers, numbers, strings; memo references are free): 64 Mi.
inline constexpr std::size_t kMaxPickleValues = std::size_t{64} << 20;

class PickleDocument {
 public:
  const Value& root() const { return values_[root_]; }
  const Value& at(ValueId id) const { return values_[id]; }
  std::size_t size() const { return values_.size(); }

  // The value of `key` (a string key) in `dict`, or null when `dict` is not a dict or has no
  // such key.
  const Value* Find(const Value& dict, std::string_view key) const;

 private:
  friend class PickleParser;
  std::vector<Value> values_;
  ValueId root_ = 0;
};

absl::StatusOr<PickleDocument> ReadPickle(std::string_view bytes);

}  // namespace vramscope::pickle
