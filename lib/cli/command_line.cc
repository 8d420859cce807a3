// The house style over CLI11 (command_line.h). CLI11 reports problems by exception; they end here,
// in Parse, as one line and exit 2, so no caller sees one.
#include "vramscope/command_line.h"

#include <cstdio>
#include <memory>

#include "vramscope/size_parse.h"

namespace vramscope::cmdline {
namespace {

constexpr std::size_t kWidth = 100;  // columns of --help
constexpr std::size_t kColumn = 32;  // where option descriptions start

// `text` broken at spaces into lines of at most `width` columns (a longer word stands alone).
std::string Wrap(const std::string& text, std::size_t width) {
  std::string out;
  std::size_t line = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (line > 0 && line + 1 + word.size() > width) {
      out += '\n';
      line = 0;
    } else if (line > 0) {
      out += ' ';
      ++line;
    }
    out += word;
    line += word.size();
    start = end + 1;
  }
  return out;
}

// "usage: vramscope run [FLAGS] [--] CMD [ARGS...]" in place of CLI11's own usage line.
class HouseFormatter : public CLI::Formatter {
 public:
  explicit HouseFormatter(std::string usage) : usage_(std::move(usage)) {
    column_width(kColumn);
    label("REQUIRED", "(required)");
  }
  // The usage line first, then the description (CLI11 puts the description first).
  std::string make_usage(const CLI::App* app, std::string name) const override {
    if (app->get_parent() != nullptr) name = app->get_parent()->get_name() + " " + app->get_name();
    return "usage: " + name + (usage_.empty() ? "" : " " + usage_) + "\n\n" +
           app->get_description() + "\n";
  }
  std::string make_description(const CLI::App*) const override { return ""; }
  // "-o, --output" (CLI11 writes "-o,--output").
  std::string make_option_name(const CLI::Option* option, bool positional) const override {
    std::string name;
    for (char c : CLI::Formatter::make_option_name(option, positional)) {
      name += c;
      if (c == ',') name += ' ';
    }
    return name;
  }
  // Descriptions wrapped to the terminal's customary 100 columns (CLI11 indents after '\n').
  std::string make_option_desc(const CLI::Option* option) const override {
    return Wrap(option->get_description(), kWidth - kColumn);
  }
  std::string make_footer(const CLI::App* app) const override {
    const std::string footer = app->get_footer();
    if (footer.empty()) return "";
    std::string out;
    std::size_t start = 0;
    while (start <= footer.size()) {  // paragraph by paragraph
      std::size_t end = footer.find('\n', start);
      if (end == std::string::npos) end = footer.size();
      out += Wrap(footer.substr(start, end - start), kWidth) + "\n";
      start = end + 1;
    }
    return out;
  }

 private:
  std::string usage_;
};

// The full name for messages: "vramscope run", "vramscope-agent".
std::string FullName(const CLI::App& app) {
  if (app.get_parent() != nullptr) return FullName(*app.get_parent()) + " " + app.get_name();
  return app.get_name();
}

// One line for a parse error, in the words of the old hand-written parsers where they differ.
std::string Describe(CLI::App& app, const CLI::ParseError& error) {
  if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
    std::vector<std::string> rest = app.remaining(true);
    if (!rest.empty() && !rest.front().empty() && rest.front()[0] == '-') {
      const std::string flag = rest.front().substr(0, rest.front().find('='));
      return "unknown flag " + flag;
    }
    if (!rest.empty()) return "unexpected argument '" + rest.front() + "'";
  }
  std::string what = error.what();
  // "--json: 1 required TEXT missing" and the like: a flag given without its value.
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&error) != nullptr &&
      what.find(" missing") != std::string::npos && what.find(':') != std::string::npos) {
    return what.substr(0, what.find(':')) + " needs a value";
  }
  return what;
}

bool WriteDoc(const CLI::App& app, std::string_view kind) {
  std::string text;
  if (kind == "man") {
    text = ManPage(app);
  } else if (kind == "bash") {
    text = BashCompletion(app);
  } else if (kind == "zsh") {
    text = ZshCompletion(app);
  } else {
    return false;
  }
  std::fputs(text.c_str(), stdout);
  return true;
}

void ParseSizeInto(const std::string& flag, const std::string& value, std::uint64_t min,
                   std::uint64_t max, std::uint64_t* out) {
  const SizeParse parsed = ParseSizeText(value);
  if (!parsed.ok()) {
    throw CLI::ValidationError(flag + " '" + value + "' is not a size (" +
                               SizeErrorText(parsed.error) + "; " + kSizeGrammarHelp + ")");
  }
  if (parsed.bytes < min || parsed.bytes > max) {
    throw CLI::ValidationError(flag + " '" + value + "': want " + FormatBytes(min) + " .. " +
                               FormatBytes(max));
  }
  *out = parsed.bytes;
}

}  // namespace

void MakeApp(CLI::App& app, std::string_view usage, bool version) {
  app.formatter(std::make_shared<HouseFormatter>(std::string(usage)));
  app.set_help_flag("-h,--help", "this text, then exit");
  if (version) {
    app.set_version_flag("--version", app.get_name() + " " + VRAMSCOPE_VERSION,
                         "the version, then exit");
  }
  app.option_defaults()->always_capture_default();
}

CLI::Option* AddSize(CLI::App& app, const std::string& name, std::uint64_t* out,
                     const std::string& description, std::uint64_t min, std::uint64_t max) {
  return app
      .add_option_function<std::string>(
          name,
          [name, out, min, max](const std::string& value) {
            ParseSizeInto(name, value, min, max, out);
          },
          description)
      ->type_name("SIZE");
}

CLI::Option* AddSize(CLI::App& app, const std::string& name, std::optional<std::uint64_t>* out,
                     const std::string& description) {
  return app
      .add_option_function<std::string>(
          name,
          [name, out](const std::string& value) {
            std::uint64_t bytes = 0;
            ParseSizeInto(name, value, 0, ~std::uint64_t{0}, &bytes);
            *out = bytes;
          },
          description)
      ->type_name("SIZE");
}

void AddClientSecurityFlags(CLI::App& app, net::ClientSecurity* security) {
  const std::string group = "TLS and tokens (to reach the collector)";
  app.add_option("--tls-ca", security->ca_file,
                 "connect with TLS, trusting the collector's certificate if signed by a "
                 "certificate in FILE (PEM)")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--tls-cert", security->cert_file,
                 "client certificate for mutual TLS (PEM; with --tls-key)")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--tls-key", security->key_file, "its private key (mode 0600 or stricter)")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--tls-server-name", security->server_name,
                 "name to expect in the collector's certificate (default: the host of the address)")
      ->type_name("NAME")
      ->group(group);
  app.add_option("--token-file", security->token_file,
                 "send the bearer token in FILE (mode 0600 or stricter) on every call")
      ->type_name("FILE")
      ->group(group);
}

void AddServerSecurityFlags(CLI::App& app, net::ServerSecurity* security) {
  const std::string group = "TLS and tokens";
  app.add_option("--tls-cert", security->cert_file,
                 "serve TLS with this certificate chain (PEM; with --tls-key)")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--tls-key", security->key_file, "its private key (mode 0600 or stricter)")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--tls-client-ca", security->client_ca_file,
                 "mutual TLS: require client certificates signed by FILE (PEM)")
      ->type_name("FILE")
      ->group(group);
  app.add_option(
         "--writer-token-file", security->writer_token_file,
         "bearer tokens that may write (Ingest), one per line, `TOKEN` or `NAME TOKEN`; mode 0600 "
         "or stricter. With token files, a role whose file is not given is refused to everyone")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--reader-token-file", security->reader_token_file,
                 "bearer tokens that may read (Watch, GetReport, ListProcesses, ...)")
      ->type_name("FILE")
      ->group(group);
  app.add_flag("--insecure", security->insecure,
               "allow listening beyond loopback without TLS and tokens")
      ->group(group);
}

int UsageError(const CLI::App& app, const std::string& message) {
  const std::string name = FullName(app);
  std::fprintf(stderr, "%s: %s\n(`%s --help` lists the flags)\n", name.c_str(), message.c_str(),
               name.c_str());
  return 2;
}

std::optional<int> Parse(CLI::App& app, int argc, const char* const* argv) {
  constexpr std::string_view kGenerate = "--generate-doc=";
  if (argc == 2 && std::string_view(argv[1]).substr(0, kGenerate.size()) == kGenerate) {
    if (WriteDoc(app, std::string_view(argv[1]).substr(kGenerate.size()))) return 0;
    std::fprintf(stderr, "%s: --generate-doc wants man, bash or zsh\n", FullName(app).c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);  // --help, --version
    return UsageError(app, Describe(app, error));
  }
  return std::nullopt;
}

}  // namespace vramscope::cmdline
