// A subcommand's options, one at a time: "--flag value" and "--flag=value" alike, with the usage
// message for a flag whose value is missing. Shared by `vramscope check`, `report` and `top`.
//
//   ArgReader args("check", argc, argv);  // argv[0] is the subcommand's name
//   while (args.Next()) {
//     if (args.Is("--baseline")) { if (!args.Value(&path)) return usage error; }
//     else if (args.Is("-h") || args.Is("--help")) ...
//     else unknown: args.arg() is the whole argument
//   }
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace vramscope::cli {

class ArgReader {
 public:
  ArgReader(std::string_view command, int argc, char** argv)
      : command_(command), argc_(argc), argv_(argv) {}

  // Moves to the next argument; false after the last one.
  bool Next() {
    if (++index_ >= argc_) return false;
    arg_ = argv_[index_];
    flag_ = std::string(arg_);
    inline_value_.clear();
    has_inline_value_ = false;
    if (const std::size_t eq = arg_.find('='); arg_.substr(0, 2) == "--" && eq != arg_.npos) {
      flag_ = std::string(arg_.substr(0, eq));
      inline_value_ = std::string(arg_.substr(eq + 1));
      has_inline_value_ = true;
    }
    return true;
  }

  // The whole argument, as given.
  std::string_view arg() const { return arg_; }
  // The flag: the argument up to '=' for "--flag=value", else the whole argument.
  const std::string& flag() const { return flag_; }
  bool Is(std::string_view name) const { return flag_ == name; }
  // "--flag=value" was given (a flag that takes no value is then an unknown argument).
  bool HasInlineValue() const { return has_inline_value_; }

  // The flag's value: after '=', else the next argument (consumed). Prints
  // "vramscope COMMAND: FLAG needs a value" and returns false when there is none.
  bool Value(std::string* out) {
    if (has_inline_value_) {
      *out = inline_value_;
      return true;
    }
    if (index_ + 1 >= argc_) {
      std::fprintf(stderr, "vramscope %.*s: %s needs a value\n", static_cast<int>(command_.size()),
                   command_.data(), flag_.c_str());
      return false;
    }
    *out = argv_[++index_];
    return true;
  }

 private:
  std::string_view command_;
  int argc_;
  char** argv_;
  int index_ = 0;
  std::string_view arg_;
  std::string flag_;
  std::string inline_value_;
  bool has_inline_value_ = false;
};

}  // namespace vramscope::cli
