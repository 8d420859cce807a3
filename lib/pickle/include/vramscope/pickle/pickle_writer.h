// PickleWriter: writes Python pickles (protocol 2) of plain data: dicts, lists, tuples, strings,
// integers, floats, booleans and None, the types a PyTorch memory snapshot holds
// (`torch.cuda.memory._dump_snapshot`). Python's `pickle.load` and PyTorch's memory_viz read
// them; nothing in them builds objects (no GLOBAL, REDUCE or BUILD opcodes).
//
// Values are written in order, as a document is read: containers open with Begin*() and close
// with End*(); inside a dict, keys and values alternate. Repeated strings (keys, file names) are
// written once and referenced through the pickle memo afterwards.
//
// Thread safety: none. Errors: none at run time; misuse (unbalanced Begin/End) is a programming
// error, checked with assert.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vramscope::pickle {

class PickleWriter {
 public:
  PickleWriter();

  void BeginDict();
  void EndDict();
  void BeginList();
  void EndList();
  void BeginTuple();
  void EndTuple();

  // Text that is not valid UTF-8 is written with vramscope's reversible escape (utf8.h).
  void String(std::string_view text);
  void Int(std::int64_t value);
  void UInt(std::uint64_t value);
  void Float(double value);
  void Bool(bool value);
  void None();

  // Closes the pickle (STOP) and returns it; the writer is spent afterwards.
  std::string Finish();

 private:
  enum class Open : std::uint8_t { kDict, kList, kTuple };
  void Memo(std::string key);

  std::string out_;
  std::vector<Open> open_;
  absl::flat_hash_map<std::string, std::uint32_t> strings_;  // text -> memo index
  std::uint32_t memo_size_ = 0;
};

}  // namespace vramscope::pickle
