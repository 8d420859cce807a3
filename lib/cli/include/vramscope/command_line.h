// The command line of every vramscope program, one grammar (CLI11): long flags, `--flag value`
// and `--flag=value` alike, `-h/--help` generated from the definitions, `--version`, and exit 2
// with one line saying what was wrong. Sizes take the one grammar of vramscope/size_parse.h; the
// TLS and token flags are defined here once for every client and server.
//
// From the same definitions: a man page and bash and zsh completions (ManPage, BashCompletion,
// ZshCompletion), printed by the hidden `--generate-doc=man|bash|zsh` that Parse handles, which
// the build runs to make the installed files.
//
//   CLI::App app = ...; MakeApp(app, "vramscope-agent", "[FLAGS]");
//   AddSize(app, "--max-spool-bytes", &bytes, "spool bound");
//   if (std::optional<int> exit_code = Parse(app, argc, argv)) return *exit_code;
//
// Errors: Parse prints them and returns the exit code (0 after --help/--version, 2 for bad
// usage); it never throws. Not thread-safe (command lines are parsed once, at start).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "vramscope/net_security.h"

#include <CLI/CLI.hpp>

namespace vramscope::cmdline {

// The usage line after "usage: NAME " (e.g. "[FLAGS]", "TRACE [FLAGS]"), and the house style:
// -h/--help, --version ("NAME VERSION") on a top-level app, a sorted help layout.
void MakeApp(CLI::App& app, std::string_view usage, bool version = true);

// A size option (vramscope/size_parse.h) within [min, max]; a refused value is a usage error
// naming the flag and why.
CLI::Option* AddSize(CLI::App& app, const std::string& name, std::uint64_t* out,
                     const std::string& description, std::uint64_t min = 0,
                     std::uint64_t max = ~std::uint64_t{0});
CLI::Option* AddSize(CLI::App& app, const std::string& name, std::optional<std::uint64_t>* out,
                     const std::string& description);

// The client flags of every program that calls the collector: --tls-ca, --tls-cert, --tls-key,
// --tls-server-name, --token-file.
void AddClientSecurityFlags(CLI::App& app, net::ClientSecurity* security);
// The server flags: --tls-cert, --tls-key, --tls-client-ca, --writer-token-file,
// --reader-token-file, --insecure.
void AddServerSecurityFlags(CLI::App& app, net::ServerSecurity* security);

// Parses argv (argv[0] is the program or subcommand name). nullopt: go on; else the exit code,
// after printing help, the version, a generated document, or the usage error.
std::optional<int> Parse(CLI::App& app, int argc, const char* const* argv);

// A usage error found after parsing (flags that do not go together): prints it as Parse prints
// its own and returns 2.
int UsageError(const CLI::App& app, const std::string& message);

// Documents generated from the definitions (subcommands included, hidden options left out).
std::string ManPage(const CLI::App& app);
std::string BashCompletion(const CLI::App& app);
std::string ZshCompletion(const CLI::App& app);

}  // namespace vramscope::cmdline
