// The house style over CLI11 (command_line.h). CLI11 reports problems by exception; they end here,
// in Parse, as one line and exit 2, so no caller sees one.
#include "vramscope/command_line.h"

#include <cstdio>
#include <memory>

#include "vramscope/size_parse.h"

namespace vramscope::cmdline {
namespace {

// "usage: vramscope run [FLAGS] [--] CMD [ARGS...]" in place of CLI11's own usage line.
class HouseFormatter : public CLI::Formatter {
 public:
  explicit HouseFormatter(std::string usage) : usage_(std::move(usage)) {
    column_width(32);
    label("REQUIRED", "(required)");
  }
  std::string make_usage(const CLI::App* app, std::string name) const override {
    if (app->get_parent() != nullptr) name = app->get_parent()->get_name() + " " + app->get_name();
    return "usage: " + name + (usage_.empty() ? "" : " " + usage_) + "\n";
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
    throw CLI::ValidationError(flag, "'" + value + "' is not a size (" +
                                         SizeErrorText(parsed.error) + "; " + kSizeGrammarHelp +
                                         ")");
  }
  if (parsed.bytes < min || parsed.bytes > max) {
    throw CLI::ValidationError(flag, "'" + value + "': want " + FormatBytes(min) + " .. " +
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
                 "TLS: PEM certificates that verify the collector (turns TLS on)")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--tls-cert", security->cert_file,
                 "TLS: client certificate for mutual TLS (with --tls-key)")
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
                 "bearer token sent on every call (a file of mode 0600 or stricter)")
      ->type_name("FILE")
      ->group(group);
}

void AddServerSecurityFlags(CLI::App& app, net::ServerSecurity* security) {
  const std::string group = "TLS and tokens";
  app.add_option("--tls-cert", security->cert_file, "TLS: server certificate chain (PEM)")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--tls-key", security->key_file, "its private key (mode 0600 or stricter)")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--tls-client-ca", security->client_ca_file,
                 "require client certificates signed by these CAs (mutual TLS)")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--writer-token-file", security->writer_token_file,
                 "tokens that may write (Ingest): one per line, TOKEN or NAME TOKEN")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--reader-token-file", security->reader_token_file,
                 "tokens that may read (reports, Watch, history)")
      ->type_name("FILE")
      ->group(group);
  app.add_flag("--insecure", security->insecure,
               "serve beyond loopback without TLS and tokens (logged as a warning)")
      ->group(group);
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
    const std::string name = FullName(app);
    std::fprintf(stderr, "%s: %s\n(`%s --help` lists the flags)\n", name.c_str(),
                 Describe(app, error).c_str(), name.c_str());
    return 2;
  }
  return std::nullopt;
}

}  // namespace vramscope::cmdline
