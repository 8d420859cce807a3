// Security on vramscope's network edges, in one place: TLS (optionally mutual) and bearer tokens
// for every gRPC client (agent, `vramscope run --collector`, `top`, `report`, ...) and server
// (the collector, and any later listener), plus the flags that set them.
//
// Clients: parse flags into a ClientSecurity (the CLI11 definitions of vramscope/command_line.h,
// lib/cli), load it once at start
// (LoadClientCredentials: reads the files, refuses a token file others may read), then
// MakeChannel(target, credentials) for every channel. The token travels as
// `authorization: Bearer TOKEN` on every call.
//
// Servers: parse flags into a ServerSecurity (lib/cli as well), ServerGuard::Load it once with the
// table of which role may call which method, CheckListen the address, AddListeningPort and
// AddInterceptor on the builder, and call Authorize first thing in every handler. A method not in
// the table is refused, by Authorize and by the interceptor (for a handler that forgot to ask).
//
// Secrets: token files and private keys must be regular files that neither group nor others may
// read or write (`chmod 600`); a token never appears in a message or log line.
//
// Thread safety: ClientCredentials and ServerGuard are immutable after loading; every method is
// safe from any thread. Errors: absl::Status (INVALID_ARGUMENT for bad flags or files,
// PERMISSION_DENIED for an unsafe secret file) and grpc::Status from Authorize (UNAUTHENTICATED:
// no or unknown token; PERMISSION_DENIED: a valid token of the other role, or a method without a
// rule).
#ifndef VRAMSCOPE_NET_SECURITY_H_
#define VRAMSCOPE_NET_SECURITY_H_

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <grpcpp/grpcpp.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace vramscope::net {

// ---- Clients
// -------------------------------------------------------------------------------------

// File paths as given on the command line. TLS is on when ca_file or cert_file is set.
struct ClientSecurity {
  std::string ca_file;      // --tls-ca: PEM certificates that verify the server
  std::string cert_file;    // --tls-cert: client certificate for mutual TLS (with key_file)
  std::string key_file;     // --tls-key
  std::string server_name;  // --tls-server-name: name to expect in the server's certificate
  std::string token_file;   // --token-file: bearer token sent on every call
  bool tls() const { return !ca_file.empty() || !cert_file.empty(); }
};

// A ClientSecurity with its files read: what MakeChannel needs. Default: plaintext, no token.
struct ClientCredentials {
  bool tls = false;
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string server_name;
  std::string token;  // empty: none sent
};

absl::StatusOr<ClientCredentials> LoadClientCredentials(const ClientSecurity& security);

// A channel to `target` with the credentials: TLS or plaintext, and the token on every call.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ClientCredentials& credentials,
                                           grpc::ChannelArguments args = {});

// A hint to append to "cannot reach the collector" messages: what to check given how this client
// connects (plaintext to a TLS server, a CA that does not match, a missing token).
std::string ConnectHint(const ClientCredentials& credentials);

// ---- Servers
// -------------------------------------------------------------------------------------

// File paths as given on the command line. TLS is on when cert_file and key_file are set.
struct ServerSecurity {
  std::string cert_file;          // --tls-cert: server certificate chain (PEM)
  std::string key_file;           // --tls-key: its private key (mode 0600 or stricter)
  std::string client_ca_file;     // --tls-client-ca: require client certificates signed by it
  std::string writer_token_file;  // --writer-token-file: tokens that may write (Ingest)
  std::string reader_token_file;  // --reader-token-file: tokens that may read
  bool insecure = false;          // --insecure: allow a non-loopback listener without them
};

enum class Role { kWriter, kReader };
const char* RoleName(Role role);

// Which role may call which method, by full name ("/vramscope.v1.Collector/Ingest").
using MethodRoles = absl::flat_hash_map<std::string, Role>;

// Who called. `identity` names the token ("writer token NAME" / "reader token line N"), else the
// client certificate's common name ("client certificate CN"), else "anonymous"; never the token.
struct Peer {
  Role role = Role::kReader;
  std::string identity;
};

// True for 127.0.0.0/8, ::1, localhost and unix: sockets.
bool IsLoopbackAddress(absl::string_view listen);

class ServerGuard {
 public:
  // Reads and checks every file of `security`. A token file: one token per line, `TOKEN` or
  // `NAME TOKEN`, blank lines and `#` comments ignored, at least 16 bytes per token.
  static absl::StatusOr<std::unique_ptr<ServerGuard>> Load(const ServerSecurity& security,
                                                           MethodRoles roles);
  // No TLS, no tokens: every method in `roles` open to anyone (loopback, tests).
  static std::unique_ptr<ServerGuard> Open(MethodRoles roles);

  bool tls() const { return !key_pem_.empty(); }
  bool mutual_tls() const { return !client_ca_pem_.empty(); }
  bool tokens() const { return !writer_tokens_.empty() || !reader_tokens_.empty(); }
  // One line for the start-up log: "TLS (mutual), tokens for writers and readers".
  std::string Describe() const;

  // OK for loopback, or TLS and tokens, or --insecure; else FAILED_PRECONDITION saying why.
  // `warning`, when given, gets a line to log for a listener --insecure let through ("" if none).
  absl::Status CheckListen(absl::string_view listen, std::string* warning = nullptr) const;
  std::shared_ptr<grpc::ServerCredentials> Credentials() const;
  // Adds the listening port with these credentials and the default-deny interceptor.
  void AddTo(grpc::ServerBuilder* builder, const std::string& listen, int* port) const;

  // Call first in every handler: OK with `peer` filled, or the status to return.
  grpc::Status Authorize(const grpc::ServerContextBase& context, absl::string_view method,
                         Peer* peer) const;
  // The same for another protocol (an HTTP listener): the Authorization header's value ("" if
  // none) and the role the request needs.
  absl::StatusOr<Peer> AuthorizeBearer(absl::string_view authorization, Role role) const;

 private:
  struct Token {
    std::array<uint8_t, 32> digest;  // SHA-256 of the token: compared in constant time
    std::string identity;
  };
  explicit ServerGuard(MethodRoles roles) : roles_(std::move(roles)) {}
  absl::StatusOr<Peer> Check(absl::string_view authorization, Role role) const;
  const Token* Find(const std::vector<Token>& tokens, absl::string_view token) const;

  MethodRoles roles_;
  std::string cert_pem_;
  std::string key_pem_;
  std::string client_ca_pem_;
  std::vector<Token> writer_tokens_;
  std::vector<Token> reader_tokens_;
  bool insecure_ = false;
};

// Reads a secret: a regular file (not a link) that neither group nor others may read or write.
// `what` names it in messages ("--token-file").
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what);

}  // namespace vramscope::net

#endif  // VRAMSCOPE_NET_SECURITY_H_
