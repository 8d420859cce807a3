// Man pages and shell completions from the CLI11 definitions (command_line.h): what --help says,
// the man page and the completions come from one list of flags, so none can drift from another.
#include <cctype>
#include <string>
#include <vector>

#include "vramscope/command_line.h"

namespace vramscope::cmdline {
namespace {

// The options a user sees: named (not positional), not hidden (group ""), help and version last.
std::vector<const CLI::Option*> VisibleOptions(const CLI::App& app) {
  return app.get_options([](const CLI::Option* option) {
    return !option->get_group().empty() && !option->get_lnames().empty();
  });
}

std::vector<const CLI::App*> Verbs(const CLI::App& app) {
  return app.get_subcommands([](const CLI::App* sub) { return !sub->get_group().empty(); });
}

bool TakesValue(const CLI::Option* option) { return option->get_expected_max() > 0; }

std::string LongName(const CLI::Option* option) { return "--" + option->get_lnames().front(); }

// roff: a backslash is \e, a hyphen \-, a line may not start with a control character.
std::string Roff(const std::string& text) {
  std::string out;
  bool line_start = true;
  for (char c : text) {
    if (line_start && (c == '.' || c == '\'')) out += "\\&";
    if (c == '\\') {
      out += "\\e";
    } else if (c == '-') {
      out += "\\-";
    } else {
      out += c;
    }
    line_start = c == '\n';
  }
  return out;
}

std::string Upper(std::string text) {
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return text;
}

void ManOptions(const CLI::App& app, std::string* out) {
  for (const CLI::Option* option : VisibleOptions(app)) {
    *out += ".TP\n.B ";
    for (const std::string& s : option->get_snames()) *out += Roff("-" + s) + ", ";
    *out += Roff(LongName(option));
    if (TakesValue(option)) *out += " \\fI" + Roff(option->get_type_name()) + "\\fR";
    *out += "\n" + Roff(option->get_description()) + "\n";
  }
}

// The name of the function a completion defines: _vramscope_agent for vramscope-agent.
std::string FunctionName(const CLI::App& app) {
  std::string name = "_" + app.get_name();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

std::string Flags(const CLI::App& app) {
  std::string flags;
  for (const CLI::Option* option : VisibleOptions(app)) {
    flags += (flags.empty() ? "" : " ") + LongName(option);
    for (const std::string& s : option->get_snames()) flags += " -" + s;
  }
  return flags;
}

// zsh _arguments: ':', '[' and ']' in a description are escaped, quotes closed and reopened.
std::string ZshText(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '[' || c == ']' || c == ':' || c == '\\') out += '\\';
    if (c == '\'') {
      out += "'\\''";
    } else if (c == '\n') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string ZshSpecs(const CLI::App& app, const std::string& indent) {
  std::string specs;
  for (const CLI::Option* option : VisibleOptions(app)) {
    const std::string type = option->get_type_name();
    const bool files = type.find("FILE") != std::string::npos ||
                       type.find("DIR") != std::string::npos ||
                       type.find("PATH") != std::string::npos;
    specs += indent + "'" + LongName(option) + (TakesValue(option) ? "=" : "") + "[" +
             ZshText(option->get_description()) + "]";
    if (TakesValue(option)) specs += ":" + ZshText(type) + ":" + (files ? "_files" : " ");
    specs += "' \\\n";
  }
  return specs;
}

}  // namespace

std::string ManPage(const CLI::App& app) {
  const std::string name = app.get_name();
  std::string out = ".TH " + Roff(Upper(name)) +
                    " 1 \"\" \"vramscope " VRAMSCOPE_VERSION "\" \"User Commands\"\n";
  out += ".SH NAME\n" + Roff(name) + " \\- " + Roff(app.get_description()) + "\n";
  out += ".SH SYNOPSIS\n.B " + Roff(name) + "\n";
  out +=
      Verbs(app).empty() ? "[\\fIFLAGS\\fR]\n" : "\\fICOMMAND\\fR [\\fIFLAGS\\fR] [\\fIARGS\\fR]\n";
  out += ".SH OPTIONS\n";
  ManOptions(app, &out);
  if (!Verbs(app).empty()) out += ".SH COMMANDS\n";
  for (const CLI::App* verb : Verbs(app)) {
    out += ".SS \"" + Roff(name + " " + verb->get_name()) + "\"\n" + Roff(verb->get_description()) +
           "\n";
    if (!verb->get_footer().empty()) out += ".PP\n" + Roff(verb->get_footer()) + "\n";
    ManOptions(*verb, &out);
  }
  if (!app.get_footer().empty()) out += ".SH NOTES\n" + Roff(app.get_footer()) + "\n";
  out += ".SH SEE ALSO\n";
  const char* const kAll[] = {"vramscope", "vramscope-agent", "vramscope-collector"};
  std::string see;
  for (const char* other : kAll) {
    if (name != other)
      see += (see.empty() ? "" : ",\n") + std::string(".BR ") + Roff(other) + " (1)";
  }
  return out + see + "\n";
}

std::string BashCompletion(const CLI::App& app) {
  const std::string function = FunctionName(app);
  std::string out = "# bash completion for " + app.get_name() + " (generated from its flags)\n";
  out += function + "() {\n  local cur=\"${COMP_WORDS[COMP_CWORD]}\" verb=\"\" i\n";
  out +=
      "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
      "    case \"${COMP_WORDS[i]}\" in -*) ;; *) verb=\"${COMP_WORDS[i]}\"; break ;; esac\n"
      "  done\n";
  std::string verbs;
  for (const CLI::App* verb : Verbs(app)) verbs += (verbs.empty() ? "" : " ") + verb->get_name();
  // Flags where the word starts with '-'; else a verb where one is due; else files (-o default).
  out += "  local words=\"" + Flags(app) + "\"\n";
  if (!verbs.empty()) {
    out += "  case \"$verb\" in\n";
    for (const CLI::App* verb : Verbs(app)) {
      out += "    " + verb->get_name() + ") words=\"" + Flags(*verb) + "\" ;;\n";
    }
    out += "    *) [[ \"$cur\" == -* ]] || words=\"" + verbs + "\" ;;\n  esac\n";
    out += "  if [[ \"$cur\" == -* || -z \"$verb\" ]]; then\n";
  } else {
    out += "  if [[ \"$cur\" == -* ]]; then\n";
  }
  out += "    COMPREPLY=($(compgen -W \"$words\" -- \"$cur\"))\n  fi\n}\n";
  out += "complete -o default -o bashdefault -F " + function + " " + app.get_name() + "\n";
  return out;
}

std::string ZshCompletion(const CLI::App& app) {
  const std::string function = FunctionName(app);
  std::string out = "#compdef " + app.get_name() + "\n# zsh completion for " + app.get_name() +
                    " (generated from its flags)\n";
  if (Verbs(app).empty()) {
    return out + "_arguments -s \\\n" + ZshSpecs(app, "  ") + "  '*:file:_files'\n";
  }
  out += function + "() {\n  local state line\n  _arguments -C \\\n" + ZshSpecs(app, "    ") +
         "    '1:command:->verb' '*::arg:->args'\n  case $state in\n    verb)\n"
         "      _values 'command' \\\n";
  for (const CLI::App* verb : Verbs(app)) {
    out += "        '" + verb->get_name() + "[" + ZshText(verb->get_description()) + "]' \\\n";
  }
  out += "      ;;\n    args)\n      case $line[1] in\n";
  for (const CLI::App* verb : Verbs(app)) {
    out += "        " + verb->get_name() + ")\n          _arguments -s \\\n" +
           ZshSpecs(*verb, "            ") + "            '*:file:_files' ;;\n";
  }
  out += "      esac ;;\n  esac\n}\n" + function + " \"$@\"\n";
  return out;
}

}  // namespace vramscope::cmdline
