#include "vramscope/pickle/pickle_reader.h"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_format.h>

#include <cstring>
#include <utility>

namespace vramscope::pickle {

// One pass over the opcodes with the pickle machine's stack, mark stack and memo; values go into
// the document's arena and the stack holds their ids.
class PickleParser {
 public:
  explicit PickleParser(std::string_view bytes) : in_(bytes) {}
  absl::StatusOr<PickleDocument> Run();

 private:
  absl::Status Step(std::uint8_t op, bool* stop);
  absl::Status Scalar(std::uint8_t op, bool* handled);
  absl::Status Container(std::uint8_t op, bool* handled);
  absl::StatusOr<std::int64_t> Long1();
  absl::Status MemoOp(std::uint8_t op, bool* handled);
  absl::Status Fail(std::string_view message) const {
    return absl::InvalidArgumentError(absl::StrFormat("offset %d: %s", op_at_, message));
  }
  absl::StatusOr<std::uint64_t> Le(int bytes);
  absl::StatusOr<std::string_view> Take(std::uint64_t bytes);
  absl::StatusOr<ValueId> Push(Value value);
  absl::StatusOr<ValueId> Pop();
  // The stack items above the innermost mark; the mark is removed.
  absl::StatusOr<std::vector<ValueId>> PopMark();
  absl::Status AddItems(ValueId target, const std::vector<ValueId>& items, bool dict);

  std::string_view in_;
  std::size_t pos_ = 0;
  std::size_t op_at_ = 0;
  PickleDocument doc_;
  std::vector<ValueId> stack_;
  std::vector<std::size_t> marks_;
  absl::flat_hash_map<std::uint64_t, ValueId> memo_;
};

namespace {

// Names for the opcodes refused most often, so the error says what the file tried to do.
const char* RefusedName(std::uint8_t op) {
  switch (op) {
    case 'c':
      return "GLOBAL (imports a Python object)";
    case 0x93:
      return "STACK_GLOBAL (imports a Python object)";
    case 'R':
      return "REDUCE (calls a Python object)";
    case 'b':
      return "BUILD (sets an object's state)";
    case 'i':
      return "INST (builds an object)";
    case 'o':
      return "OBJ (builds an object)";
    case 0x81:
      return "NEWOBJ (builds an object)";
    case 0x92:
      return "NEWOBJ_EX (builds an object)";
    case 'P':
      return "PERSID (persistent id)";
    case 'Q':
      return "BINPERSID (persistent id)";
    case 0x82:
    case 0x83:
    case 0x84:
      return "EXT (extension registry)";
    case 'B':
    case 'C':
    case 0x8e:
    case 0x96:
      return "bytes";
    case 0x8f:
    case 0x90:
    case 0x91:
      return "set";
    case 0x97:
    case 0x98:
      return "out-of-band buffer";
    default:
      return nullptr;
  }
}

}  // namespace

absl::StatusOr<std::uint64_t> PickleParser::Le(int bytes) {
  if (in_.size() - pos_ < static_cast<std::size_t>(bytes)) return Fail("truncated pickle");
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= std::uint64_t{static_cast<std::uint8_t>(in_[pos_ + i])} << (8 * i);
  }
  pos_ += bytes;
  return value;
}

absl::StatusOr<std::string_view> PickleParser::Take(std::uint64_t bytes) {
  if (in_.size() - pos_ < bytes) return Fail("truncated pickle (a length runs past the end)");
  std::string_view out = in_.substr(pos_, bytes);
  pos_ += bytes;
  return out;
}

absl::StatusOr<ValueId> PickleParser::Push(Value value) {
  if (doc_.values_.size() >= kMaxPickleValues) {
    return Fail(absl::StrFormat("more than %d values: refused", kMaxPickleValues));
  }
  doc_.values_.push_back(std::move(value));
  const ValueId id = static_cast<ValueId>(doc_.values_.size() - 1);
  stack_.push_back(id);
  return id;
}

absl::StatusOr<ValueId> PickleParser::Pop() {
  const std::size_t floor = marks_.empty() ? 0 : marks_.back();
  if (stack_.size() <= floor) return Fail("stack underflow");
  const ValueId id = stack_.back();
  stack_.pop_back();
  return id;
}

absl::StatusOr<std::vector<ValueId>> PickleParser::PopMark() {
  if (marks_.empty()) return Fail("no mark on the stack");
  const std::size_t mark = marks_.back();
  marks_.pop_back();
  std::vector<ValueId> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
  stack_.resize(mark);
  return items;
}

absl::Status PickleParser::AddItems(ValueId target, const std::vector<ValueId>& items, bool dict) {
  Value& container = doc_.values_[target];
  if (dict) {
    if (container.kind != Kind::kDict) return Fail("SETITEM(S) on something not a dict");
    if (items.size() % 2 != 0) return Fail("SETITEMS with an odd number of items");
    for (std::size_t i = 0; i < items.size(); i += 2) {
      const Kind key = doc_.values_[items[i]].kind;
      if (key == Kind::kList || key == Kind::kDict) return Fail("unhashable dict key");
      container.items.push_back(items[i]);
      container.items.push_back(items[i + 1]);
    }
    return absl::OkStatus();
  }
  if (container.kind != Kind::kList) return Fail("APPEND(S) on something not a list");
  container.items.insert(container.items.end(), items.begin(), items.end());
  return absl::OkStatus();
}

absl::StatusOr<PickleDocument> PickleParser::Run() {
  bool stop = false;
  while (!stop) {
    if (pos_ >= in_.size()) return Fail("truncated pickle (no STOP opcode)");
    op_at_ = pos_;
    const std::uint8_t op = static_cast<std::uint8_t>(in_[pos_++]);
    if (absl::Status s = Step(op, &stop); !s.ok()) return s;
  }
  if (stack_.size() != 1 || !marks_.empty()) return Fail("STOP with not exactly one value left");
  doc_.root_ = stack_.back();
  return std::move(doc_);
}

absl::Status PickleParser::Step(std::uint8_t op, bool* stop) {
  bool handled = false;
  if (absl::Status s = Scalar(op, &handled); !s.ok() || handled) return s;
  if (absl::Status s = Container(op, &handled); !s.ok() || handled) return s;
  if (absl::Status s = MemoOp(op, &handled); !s.ok() || handled) return s;
  switch (op) {
    case 0x80: {  // PROTO
      absl::StatusOr<std::uint64_t> version = Le(1);
      if (!version.ok()) return version.status();
      if (*version < 2 || *version > 5) return Fail("pickle protocol not 2 to 5");
      return absl::OkStatus();
    }
    case 0x95: {  // FRAME: a length hint only
      absl::StatusOr<std::uint64_t> length = Le(8);
      if (!length.ok()) return length.status();
      if (*length > in_.size() - pos_) return Fail("truncated pickle (a frame runs past the end)");
      return absl::OkStatus();
    }
    case '.':  // STOP
      *stop = true;
      return absl::OkStatus();
    case '(':  // MARK
      marks_.push_back(stack_.size());
      return absl::OkStatus();
    default:
      break;
  }
  if (const char* name = RefusedName(op)) {
    return Fail(
        absl::StrFormat("opcode 0x%02x %s refused: only plain data (dict, list, tuple, "
                        "str, int, float, bool, None) is read, nothing is executed",
                        op, name));
  }
  return Fail(absl::StrFormat("opcode 0x%02x is not supported (not a plain-data pickle)", op));
}

absl::Status PickleParser::Scalar(std::uint8_t op, bool* handled) {
  *handled = true;
  Value v;
  switch (op) {
    case 'N':
      v.kind = Kind::kNone;
      break;
    case 0x88:
    case 0x89:
      v.kind = Kind::kBool;
      v.integer = op == 0x88;
      break;
    case 'K':
    case 'M':
    case 'J': {  // BININT1, BININT2, BININT (signed 32)
      const int bytes = op == 'K' ? 1 : op == 'M' ? 2 : 4;
      absl::StatusOr<std::uint64_t> raw = Le(bytes);
      if (!raw.ok()) return raw.status();
      v.kind = Kind::kInt;
      v.integer = op == 'J' ? static_cast<std::int32_t>(*raw) : static_cast<std::int64_t>(*raw);
      break;
    }
    case 0x8a: {  // LONG1: n bytes of little-endian two's complement
      absl::StatusOr<std::int64_t> value = Long1();
      if (!value.ok()) return value.status();
      v.kind = Kind::kInt;
      v.integer = *value;
      break;
    }
    case 'G': {  // BINFLOAT, big-endian
      absl::StatusOr<std::string_view> raw = Take(8);
      if (!raw.ok()) return raw.status();
      std::uint64_t bits = 0;
      for (char c : *raw) bits = (bits << 8) | static_cast<std::uint8_t>(c);
      v.kind = Kind::kFloat;
      std::memcpy(&v.real, &bits, sizeof bits);
      break;
    }
    case 'X':
    case 0x8c:
    case 0x8d: {  // BINUNICODE (u32), SHORT_BINUNICODE (u8), BINUNICODE8
      absl::StatusOr<std::uint64_t> n = Le(op == 'X' ? 4 : op == 0x8c ? 1 : 8);
      if (!n.ok()) return n.status();
      absl::StatusOr<std::string_view> raw = Take(*n);
      if (!raw.ok()) return raw.status();
      v.kind = Kind::kString;
      v.text = *raw;
      break;
    }
    default:
      *handled = false;
      return absl::OkStatus();
  }
  return Push(std::move(v)).status();
}

absl::StatusOr<std::int64_t> PickleParser::Long1() {
  absl::StatusOr<std::uint64_t> n = Le(1);
  if (!n.ok()) return n.status();
  absl::StatusOr<std::string_view> raw = Take(*n);
  if (!raw.ok()) return raw.status();
  std::string_view b = *raw;
  // Bytes past the eighth are allowed only as the sign extension of the eighth.
  while (b.size() > 8) {
    const std::uint8_t top = static_cast<std::uint8_t>(b.back());
    const std::uint8_t next = static_cast<std::uint8_t>(b[b.size() - 2]);
    if (!((top == 0 && next < 0x80) || (top == 0xff && next >= 0x80))) {
      return Fail("integer wider than 64 bits");
    }
    b.remove_suffix(1);
  }
  std::uint64_t bits = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    bits |= std::uint64_t{static_cast<std::uint8_t>(b[i])} << (8 * i);
  }
  if (!b.empty() && b.size() < 8 && (static_cast<std::uint8_t>(b.back()) & 0x80)) {
    bits |= ~std::uint64_t{0} << (8 * b.size());  // sign-extend
  }
  return static_cast<std::int64_t>(bits);
}

absl::Status PickleParser::Container(std::uint8_t op, bool* handled) {
  *handled = true;
  switch (op) {
    case ']':
    case '}':
    case ')': {  // EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE
      Value v;
      v.kind = op == ']' ? Kind::kList : op == '}' ? Kind::kDict : Kind::kTuple;
      return Push(std::move(v)).status();
    }
    case 't':
    case 'l':
    case 'd': {  // TUPLE, LIST, DICT from the mark
      absl::StatusOr<std::vector<ValueId>> items = PopMark();
      if (!items.ok()) return items.status();
      Value v;
      v.kind = op == 't' ? Kind::kTuple : op == 'l' ? Kind::kList : Kind::kDict;
      if (op != 'd') v.items = std::move(*items);
      absl::StatusOr<ValueId> id = Push(std::move(v));
      if (!id.ok() || op != 'd') return id.status();
      return AddItems(*id, *items, /*dict=*/true);
    }
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
      Value v;
      v.kind = Kind::kTuple;
      v.items.resize(op - 0x84);
      for (auto it = v.items.rbegin(); it != v.items.rend(); ++it) {
        absl::StatusOr<ValueId> item = Pop();
        if (!item.ok()) return item.status();
        *it = *item;
      }
      return Push(std::move(v)).status();
    }
    case 'a':
    case 's': {  // APPEND, SETITEM
      std::vector<ValueId> items(op == 'a' ? 1 : 2);
      for (auto it = items.rbegin(); it != items.rend(); ++it) {
        absl::StatusOr<ValueId> item = Pop();
        if (!item.ok()) return item.status();
        *it = *item;
      }
      if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Fail("stack underflow");
      return AddItems(stack_.back(), items, op == 's');
    }
    case 'e':
    case 'u': {  // APPENDS, SETITEMS
      absl::StatusOr<std::vector<ValueId>> items = PopMark();
      if (!items.ok()) return items.status();
      if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Fail("stack underflow");
      return AddItems(stack_.back(), *items, op == 'u');
    }
    default:
      *handled = false;
      return absl::OkStatus();
  }
}

absl::Status PickleParser::MemoOp(std::uint8_t op, bool* handled) {
  *handled = true;
  switch (op) {
    case 'q':
    case 'r':
    case 0x94: {  // BINPUT, LONG_BINPUT, MEMOIZE
      std::uint64_t index = memo_.size();
      if (op != 0x94) {
        absl::StatusOr<std::uint64_t> raw = Le(op == 'q' ? 1 : 4);
        if (!raw.ok()) return raw.status();
        index = *raw;
      }
      if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Fail("stack underflow");
      memo_[index] = stack_.back();
      return absl::OkStatus();
    }
    case 'h':
    case 'j': {  // BINGET, LONG_BINGET
      absl::StatusOr<std::uint64_t> index = Le(op == 'h' ? 1 : 4);
      if (!index.ok()) return index.status();
      auto it = memo_.find(*index);
      if (it == memo_.end()) return Fail(absl::StrFormat("memo index %d was never stored", *index));
      stack_.push_back(it->second);
      return absl::OkStatus();
    }
    default:
      *handled = false;
      return absl::OkStatus();
  }
}

const Value* PickleDocument::Find(const Value& dict, std::string_view key) const {
  if (dict.kind != Kind::kDict) return nullptr;
  // A key set twice is kept twice; the last one wins, as in Python.
  const Value* found = nullptr;
  for (std::size_t i = 0; i + 1 < dict.items.size(); i += 2) {
    const Value& k = values_[dict.items[i]];
    if (k.kind == Kind::kString && k.text == key) found = &values_[dict.items[i + 1]];
  }
  return found;
}

absl::StatusOr<PickleDocument> ReadPickle(std::string_view bytes) {
  return PickleParser(bytes).Run();
}

}  // namespace vramscope::pickle
