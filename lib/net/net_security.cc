#include "vramscope/net_security.h"

#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>
#include <fcntl.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>
#include <grpcpp/support/server_interceptor.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace vramscope::net {

namespace {

constexpr size_t kMaxSecretBytes = 1 << 20;
constexpr size_t kMinTokenBytes = 16;
constexpr char kAuthorization[] = "authorization";

absl::StatusOr<std::string> ReadFd(int fd, const std::string& path, absl::string_view what) {
  std::string data;
  char buffer[8192];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s %s: cannot read: %s", what, path, std::strerror(errno)));
    }
    if (n == 0) break;
    data.append(buffer, static_cast<size_t>(n));
    if (data.size() > kMaxSecretBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s %s: larger than %d bytes", what, path, kMaxSecretBytes));
    }
  }
  return data;
}

// Opens `path` (no links, no FIFOs blocking us) and checks it is a regular file.
absl::StatusOr<int> OpenRegular(const std::string& path, absl::string_view what, struct stat* st) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s %s: cannot open: %s", what, path,
        errno == ELOOP ? "it is a symbolic link (give the file itself)" : std::strerror(errno)));
  }
  if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrFormat("%s %s: not a regular file", what, path));
  }
  return fd;
}

absl::StatusOr<std::string> ReadPublicFile(const std::string& path, absl::string_view what) {
  struct stat st {};
  absl::StatusOr<int> fd = OpenRegular(path, what, &st);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<std::string> data = ReadFd(*fd, path, what);
  ::close(*fd);
  if (data.ok() && data->empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %s: empty file", what, path));
  }
  return data;
}

std::array<uint8_t, 32> Digest(absl::string_view text) {
  std::array<uint8_t, 32> digest{};
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

// The lines of a token file that hold a token: (line number, fields).
std::vector<std::pair<int, std::vector<absl::string_view>>> TokenLines(absl::string_view text) {
  std::vector<std::pair<int, std::vector<absl::string_view>>> lines;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    lines.emplace_back(number, absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty()));
  }
  return lines;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseTokenFile(
    absl::string_view text, const std::string& path, absl::string_view what) {
  std::vector<std::pair<std::string, std::string>> tokens;  // (identity, token)
  for (const auto& [number, fields] : TokenLines(text)) {
    if (fields.size() > 2) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s %s line %d: want `TOKEN` or `NAME TOKEN`, found %d fields", what,
                          path, number, fields.size()));
    }
    absl::string_view token = fields.back();
    if (token.size() < kMinTokenBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s %s line %d: a token of %d bytes is too short to be secret (want "
                          "at least %d; e.g. `openssl rand -hex 32`)",
                          what, path, number, token.size(), kMinTokenBytes));
    }
    std::string identity =
        fields.size() == 2 ? std::string(fields[0]) : absl::StrCat(path, " line ", number);
    tokens.emplace_back(std::move(identity), std::string(token));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %s: no token in it", what, path));
  }
  return tokens;
}

// Adds the bearer token to every call of a channel.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorization, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // lives as long as the channel, which owns this factory
};

// Default deny: a call to a method without a rule is cancelled before its handler can answer,
// whether or not the handler asks Authorize.
class DenyInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit DenyInterceptor(grpc::experimental::ServerRpcInfo* info) : info_(info) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      info_->server_context()->TryCancel();
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* info_;
};

class DenyInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit DenyInterceptorFactory(const MethodRoles* roles) : roles_(roles) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    if (info->method() != nullptr && roles_->contains(info->method())) return nullptr;
    return new DenyInterceptor(info);
  }

 private:
  const MethodRoles* roles_;  // the guard's, which outlives the server
};

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what) {
  struct stat st {};
  absl::StatusOr<int> fd = OpenRegular(path, what, &st);
  if (!fd.ok()) return fd.status();
  if ((st.st_mode & 077) != 0) {
    ::close(*fd);
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s %s: mode %04o lets group or others read or write it; it holds a secret: chmod 600 %s",
        what, path, st.st_mode & 07777, path));
  }
  absl::StatusOr<std::string> data = ReadFd(*fd, path, what);
  ::close(*fd);
  return data;
}

absl::StatusOr<ClientCredentials> LoadClientCredentials(const ClientSecurity& security) {
  ClientCredentials credentials;
  credentials.tls = security.tls();
  credentials.server_name = security.server_name;
  if (security.cert_file.empty() != security.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together (mutual TLS)");
  }
  if (!security.server_name.empty() && !credentials.tls) {
    return absl::InvalidArgumentError("--tls-server-name needs --tls-ca");
  }
  if (!security.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPublicFile(security.ca_file, "--tls-ca");
    if (!ca.ok()) return ca.status();
    credentials.ca_pem = *std::move(ca);
  }
  if (!security.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPublicFile(security.cert_file, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadSecretFile(security.key_file, "--tls-key");
    if (!key.ok()) return key.status();
    credentials.cert_pem = *std::move(cert);
    credentials.key_pem = *std::move(key);
  }
  if (!security.token_file.empty()) {
    absl::StatusOr<std::string> text = ReadSecretFile(security.token_file, "--token-file");
    if (!text.ok()) return text.status();
    // The first token line; `NAME TOKEN` (a line of the collector's file) works as well.
    auto lines = TokenLines(*text);
    if (lines.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--token-file %s: no token in it", security.token_file));
    }
    credentials.token = std::string(lines.front().second.back());
  }
  return credentials;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ClientCredentials& credentials,
                                           grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  if (credentials.tls) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = credentials.ca_pem;  // empty: gRPC's default roots
    options.pem_cert_chain = credentials.cert_pem;
    options.pem_private_key = credentials.key_pem;
    channel_credentials = grpc::SslCredentials(options);
    if (!credentials.server_name.empty()) {
      args.SetSslTargetNameOverride(credentials.server_name);
    }
  } else {
    channel_credentials = grpc::InsecureChannelCredentials();
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> creators;
  if (!credentials.token.empty()) {
    creators.push_back(std::make_unique<TokenInterceptorFactory>(credentials.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, channel_credentials, args,
                                                                 std::move(creators));
}

std::string ConnectHint(const ClientCredentials& credentials) {
  std::string hint = credentials.tls
                         ? "TLS: check that --tls-ca signed the collector's certificate and that "
                           "it names the address (or --tls-server-name)"
                         : "plaintext: if the collector serves TLS, pass --tls-ca=FILE";
  if (credentials.token.empty()) absl::StrAppend(&hint, "; no token sent (--token-file)");
  return hint;
}

const char* RoleName(Role role) { return role == Role::kWriter ? "writer" : "reader"; }

bool IsLoopbackAddress(absl::string_view listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) return true;
  absl::string_view host = listen;
  if (absl::StartsWith(host, "ipv4:")) host.remove_prefix(5);
  if (absl::StartsWith(host, "ipv6:")) host.remove_prefix(5);
  if (absl::StartsWith(host, "[")) {
    size_t close = host.find(']');
    if (close == absl::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else if (size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8, written as four decimal parts.
  std::vector<absl::string_view> parts = absl::StrSplit(host, '.');
  if (parts.size() != 4) return false;
  for (absl::string_view part : parts) {
    int value = 0;
    if (part.empty() || part.size() > 3 || !absl::SimpleAtoi(part, &value) || value > 255) {
      return false;
    }
  }
  return parts[0] == "127";
}

absl::StatusOr<std::unique_ptr<ServerGuard>> ServerGuard::Load(const ServerSecurity& security,
                                                               MethodRoles roles) {
  std::unique_ptr<ServerGuard> guard(new ServerGuard(std::move(roles)));
  guard->insecure_ = security.insecure;
  if (security.cert_file.empty() != security.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!security.client_ca_file.empty() && security.cert_file.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  if (!security.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPublicFile(security.cert_file, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadSecretFile(security.key_file, "--tls-key");
    if (!key.ok()) return key.status();
    if (key->empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--tls-key %s: empty file", security.key_file));
    }
    guard->cert_pem_ = *std::move(cert);
    guard->key_pem_ = *std::move(key);
  }
  if (!security.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPublicFile(security.client_ca_file, "--tls-client-ca");
    if (!ca.ok()) return ca.status();
    guard->client_ca_pem_ = *std::move(ca);
  }
  auto load_tokens = [](const std::string& path, const char* what,
                        std::vector<Token>* out) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    absl::StatusOr<std::string> text = ReadSecretFile(path, what);
    if (!text.ok()) return text.status();
    auto tokens = ParseTokenFile(*text, path, what);
    if (!tokens.ok()) return tokens.status();
    for (auto& [identity, token] : *tokens) out->push_back(Token{Digest(token), identity});
    return absl::OkStatus();
  };
  if (absl::Status s =
          load_tokens(security.writer_token_file, "--writer-token-file", &guard->writer_tokens_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          load_tokens(security.reader_token_file, "--reader-token-file", &guard->reader_tokens_);
      !s.ok()) {
    return s;
  }
  // One token in both files would make a writer able to read: refused, the roles stay apart.
  for (const Token& w : guard->writer_tokens_) {
    for (const Token& r : guard->reader_tokens_) {
      if (CRYPTO_memcmp(w.digest.data(), r.digest.data(), w.digest.size()) == 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "the token %s of --writer-token-file is also a reader token (%s): give writers and "
            "readers different tokens",
            w.identity, r.identity));
      }
    }
  }
  return guard;
}

std::unique_ptr<ServerGuard> ServerGuard::Open(MethodRoles roles) {
  return std::unique_ptr<ServerGuard>(new ServerGuard(std::move(roles)));
}

std::string ServerGuard::Describe() const {
  const char* transport =
      tls() ? (mutual_tls() ? "TLS with client certificates" : "TLS") : "plaintext";
  std::string token_text = !tokens()
                               ? "no tokens"
                               : absl::StrFormat("%d writer and %d reader tokens",
                                                 writer_tokens_.size(), reader_tokens_.size());
  return absl::StrCat(transport, ", ", token_text);
}

absl::Status ServerGuard::CheckListen(absl::string_view listen, std::string* warning) const {
  if (warning != nullptr) warning->clear();
  if (IsLoopbackAddress(listen) || (tls() && tokens())) return absl::OkStatus();
  if (insecure_) {
    if (warning != nullptr) {
      *warning = absl::StrFormat(
          "--insecure: serving %s beyond loopback with %s; anyone who can reach it can use it",
          listen, Describe());
    }
    return absl::OkStatus();
  }
  std::string missing = !tls() && !tokens() ? "TLS (--tls-cert, --tls-key) and tokens "
                                              "(--writer-token-file, --reader-token-file)"
                        : !tls()            ? "TLS (--tls-cert, --tls-key)"
                                            : "tokens (--writer-token-file, --reader-token-file)";
  return absl::FailedPreconditionError(absl::StrFormat(
      "refusing to listen on %s beyond loopback without %s: anyone who can reach it could %s; "
      "give them, or --insecure to serve it as it is",
      listen, missing,
      tls() ? "write and read processes' data"
            : "read the traffic and write and read processes' "
              "data"));
}

std::shared_ptr<grpc::ServerCredentials> ServerGuard::Credentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      mutual_tls() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = client_ca_pem_;
  options.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
  return grpc::SslServerCredentials(options);
}

void ServerGuard::AddTo(grpc::ServerBuilder* builder, const std::string& listen, int* port) const {
  builder->AddListeningPort(listen, Credentials(), port);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<DenyInterceptorFactory>(&roles_));
  builder->experimental().SetInterceptorCreators(std::move(creators));
}

const ServerGuard::Token* ServerGuard::Find(const std::vector<Token>& tokens,
                                            absl::string_view token) const {
  // Constant time in the token's bytes: digests of equal length, compared with CRYPTO_memcmp,
  // every one of them (no early exit), so timing tells neither which bytes nor which token.
  const std::array<uint8_t, 32> digest = Digest(token);
  const Token* found = nullptr;
  for (const Token& candidate : tokens) {
    if (CRYPTO_memcmp(candidate.digest.data(), digest.data(), digest.size()) == 0) {
      found = &candidate;
    }
  }
  return found;
}

absl::StatusOr<Peer> ServerGuard::Check(absl::string_view authorization, Role role) const {
  Peer peer;
  peer.role = role;
  if (!tokens()) {
    peer.identity = "anonymous";
    return peer;
  }
  absl::string_view token = authorization;
  if (!absl::ConsumePrefix(&token, "Bearer ") || token.empty()) {
    return absl::UnauthenticatedError(
        authorization.empty() ? "this collector needs a bearer token: pass --token-file=FILE"
                              : "the authorization metadata is not `Bearer TOKEN`");
  }
  const std::vector<Token>& wanted = role == Role::kWriter ? writer_tokens_ : reader_tokens_;
  if (const Token* match = Find(wanted, token); match != nullptr) {
    peer.identity = absl::StrCat(RoleName(role), " token ", match->identity);
    return peer;
  }
  const std::vector<Token>& other = role == Role::kWriter ? reader_tokens_ : writer_tokens_;
  if (Find(other, token) != nullptr) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "this token is a %s token; this call needs a %s token",
        RoleName(role == Role::kWriter ? Role::kReader : Role::kWriter), RoleName(role)));
  }
  return absl::UnauthenticatedError("unknown token: check --token-file");
}

absl::StatusOr<Peer> ServerGuard::AuthorizeBearer(absl::string_view authorization,
                                                  Role role) const {
  return Check(authorization, role);
}

grpc::Status ServerGuard::Authorize(const grpc::ServerContextBase& context,
                                    absl::string_view method, Peer* peer) const {
  auto rule = roles_.find(method);
  if (rule == roles_.end()) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("method ", method, " has no access rule: denied"));
  }
  absl::string_view authorization;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find(kAuthorization); it != metadata.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  absl::StatusOr<Peer> checked = Check(authorization, rule->second);
  if (!checked.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(checked.status().code()),
                        std::string(checked.status().message()));
  }
  *peer = *std::move(checked);
  if (!tokens() && mutual_tls()) {
    // No tokens: a verified client certificate names the peer (a writer's quota is its own).
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth != nullptr) {
      for (const grpc::string_ref& name : auth->FindPropertyValues("x509_common_name")) {
        peer->identity =
            absl::StrCat("client certificate ", absl::string_view(name.data(), name.size()));
        break;
      }
    }
  }
  return grpc::Status::OK;
}

}  // namespace vramscope::net
