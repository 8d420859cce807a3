#include "vramscope/pickle/pickle_writer.h"

#include <cassert>
#include <cstring>

#include "vramscope/utf8.h"

namespace vramscope::pickle {
namespace {

void PutLe(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// Strings longer than this are written each time: memoizing them saves little and costs a copy.
constexpr std::size_t kMaxMemoizedString = 256;

}  // namespace

PickleWriter::PickleWriter() { out_ = "\x80\x02"; }  // PROTO 2

void PickleWriter::BeginDict() {
  out_ += "}(";  // EMPTY_DICT MARK: the items follow, SETITEMS adds them all
  open_.push_back(Open::kDict);
}

void PickleWriter::EndDict() {
  assert(!open_.empty() && open_.back() == Open::kDict);
  open_.pop_back();
  out_ += 'u';  // SETITEMS
}

void PickleWriter::BeginList() {
  out_ += "](";  // EMPTY_LIST MARK
  open_.push_back(Open::kList);
}

void PickleWriter::EndList() {
  assert(!open_.empty() && open_.back() == Open::kList);
  open_.pop_back();
  out_ += 'e';  // APPENDS
}

void PickleWriter::BeginTuple() {
  out_ += '(';  // MARK
  open_.push_back(Open::kTuple);
}

void PickleWriter::EndTuple() {
  assert(!open_.empty() && open_.back() == Open::kTuple);
  open_.pop_back();
  out_ += 't';  // TUPLE
}

void PickleWriter::String(std::string_view text) {
  std::string valid = ToValidUtf8(text);
  if (auto it = strings_.find(valid); it != strings_.end()) {
    if (it->second < 256) {
      out_ += 'h';  // BINGET
      PutLe(out_, it->second, 1);
    } else {
      out_ += 'j';  // LONG_BINGET
      PutLe(out_, it->second, 4);
    }
    return;
  }
  out_ += 'X';  // BINUNICODE: u32 length, UTF-8 bytes
  PutLe(out_, valid.size(), 4);
  out_ += valid;
  if (valid.size() <= kMaxMemoizedString) Memo(std::move(valid));
}

void PickleWriter::Memo(std::string key) {
  const std::uint32_t index = memo_size_++;
  if (index < 256) {
    out_ += 'q';  // BINPUT
    PutLe(out_, index, 1);
  } else {
    out_ += 'r';  // LONG_BINPUT
    PutLe(out_, index, 4);
  }
  strings_.emplace(std::move(key), index);
}

void PickleWriter::Int(std::int64_t value) {
  if (value >= 0 && value < 256) {
    out_ += 'K';  // BININT1
    PutLe(out_, static_cast<std::uint64_t>(value), 1);
  } else if (value >= 0 && value < 65536) {
    out_ += 'M';  // BININT2
    PutLe(out_, static_cast<std::uint64_t>(value), 2);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    out_ += 'J';  // BININT: signed 32-bit
    PutLe(out_, static_cast<std::uint64_t>(value), 4);
  } else {
    out_ += "\x8a\x08";  // LONG1, 8 bytes of two's complement
    PutLe(out_, static_cast<std::uint64_t>(value), 8);
  }
}

void PickleWriter::UInt(std::uint64_t value) {
  if (value <= static_cast<std::uint64_t>(INT64_MAX)) {
    Int(static_cast<std::int64_t>(value));
    return;
  }
  // LONG1 with a ninth, zero byte: two's complement of a positive number above 2^63.
  out_ += "\x8a\x09";
  PutLe(out_, value, 8);
  out_ += '\0';
}

void PickleWriter::Float(double value) {
  out_ += 'G';  // BINFLOAT: IEEE 754 double, big-endian
  std::uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void PickleWriter::Bool(bool value) { out_ += value ? '\x88' : '\x89'; }  // NEWTRUE / NEWFALSE

void PickleWriter::None() { out_ += 'N'; }

std::string PickleWriter::Finish() {
  assert(open_.empty());
  out_ += '.';  // STOP
  return std::move(out_);
}

}  // namespace vramscope::pickle
