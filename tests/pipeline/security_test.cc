// Security on the collector's gRPC edge, end to end: TLS (server certificate, optional client
// certificates), writer and reader bearer tokens with default deny, the loopback rule, secret
// file modes, the per-writer process quota, hostile process keys through the real Ingest RPC, and
// the modes of the files that hold traced processes' data (rings, spool, data directory).
// Certificates are made at test time with the openssl command (tests/net/test_certs.h); the
// collector runs in process on port 0, and as the real binary (with the agent and `vramscope`)
// where the command line is what is tested.
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "tests/collector/test_util.h"
#include "tests/net/test_certs.h"
#include "tests/pipeline/subprocess.h"
#include "vramscope/agent/outbox.h"
#include "vramscope/collector/collector.h"
#include "vramscope/collector/service.h"
#include "vramscope/log.h"
#include "vramscope/net_security.h"
#include "vramscope/ring/ring_writer.h"
#include "vramscope/v1/collector.grpc.pb.h"

namespace vramscope {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::vramscope::testing::Batch;
using ::vramscope::testing::BinaryFromEnv;
using ::vramscope::testing::Key;
using ::vramscope::testing::Subprocess;
using ::vramscope::testing::TempDir;
using ::vramscope::testing::TestCerts;

constexpr char kWriterA[] = "0123456789abcdef0123456789abcdef";
constexpr char kWriterB[] = "fedcba9876543210fedcba9876543210";
constexpr char kReader[] = "a1b2c3d4e5f60718293a4b5c6d7e8f90";
constexpr char kWrong[] = "00000000000000000000000000000000";

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vramscope::SetMinLogLevel(vramscope::LogLevel::kError);
    certs_ = std::make_unique<TestCerts>(certs_dir_.path());
    ASSERT_TRUE(certs_->ok()) << certs_->error();
    writer_tokens_ = certs_->WriteSecret(
        "writers", absl::StrCat("# agents\nnode-a ", kWriterA, "\nnode-b ", kWriterB, "\n"));
    reader_tokens_ = certs_->WriteSecret("readers", absl::StrCat(kReader, "\n"));
    writer_a_ = certs_->WriteSecret("writer-a.token", absl::StrCat(kWriterA, "\n"));
    writer_b_ = certs_->WriteSecret("writer-b.token", absl::StrCat(kWriterB, "\n"));
    reader_ = certs_->WriteSecret("reader.token", absl::StrCat(kReader, "\n"));
    wrong_ = certs_->WriteSecret("wrong.token", absl::StrCat(kWrong, "\n"));
  }

  // TLS with the test CA's server certificate, writer and reader tokens.
  net::ServerSecurity Locked() const {
    net::ServerSecurity security;
    security.cert_file = certs_->server_cert();
    security.key_file = certs_->server_key();
    security.writer_token_file = writer_tokens_;
    security.reader_token_file = reader_tokens_;
    return security;
  }

  // A client of the locked server: TLS trusting the test CA, with `token_file` (may be empty).
  net::ClientSecurity Client(const std::string& token_file) const {
    net::ClientSecurity security;
    security.ca_file = certs_->ca();
    security.token_file = token_file;
    return security;
  }

  void Start(const net::ServerSecurity& security, collector::CollectorOptions options = {},
             net::MethodRoles roles = collector::CollectorMethodRoles()) {
    options.data_dir = data_dir_.path() + "/data";
    collector_ = *collector::Collector::Open(options);
    absl::StatusOr<std::unique_ptr<net::ServerGuard>> guard =
        net::ServerGuard::Load(security, std::move(roles));
    ASSERT_TRUE(guard.ok()) << guard.status();
    collector::ServerOptions server_options;
    server_options.listen = "127.0.0.1:0";
    server_options.guard = *std::move(guard);
    absl::StatusOr<std::unique_ptr<collector::CollectorServer>> server =
        collector::CollectorServer::Start(collector_.get(), server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
  }

  std::unique_ptr<v1::Collector::Stub> Stub(const net::ClientSecurity& security) {
    absl::StatusOr<net::ClientCredentials> credentials = net::LoadClientCredentials(security);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    args.SetMaxReceiveMessageSize(64 << 20);
    return v1::Collector::NewStub(net::MakeChannel(address_, *credentials, args));
  }

  static std::chrono::system_clock::time_point Soon() {
    return std::chrono::system_clock::now() + std::chrono::seconds(20);
  }

  // Sends one batch on its own Ingest stream: the stream's status, and the answer in `ack`.
  static grpc::Status Send(v1::Collector::Stub& stub, const v1::EventBatch& batch,
                           v1::IngestAck* ack = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    auto stream = stub.Ingest(&context);
    v1::IngestAck answer;
    if (stream->Write(batch)) stream->Read(&answer);
    stream->WritesDone();
    v1::IngestAck extra;
    while (stream->Read(&extra)) {
    }
    if (ack != nullptr) *ack = answer;
    return stream->Finish();
  }

  static grpc::Status List(v1::Collector::Stub& stub, v1::ListProcessesResponse* list = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::ListProcessesRequest request;
    request.set_include_finished(true);
    v1::ListProcessesResponse response;
    grpc::Status status = stub.ListProcesses(&context, request, &response);
    if (list != nullptr) *list = response;
    return status;
  }

  static grpc::Status GetReport(v1::Collector::Stub& stub, const v1::ProcessKey& key) {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::GetReportRequest request;
    *request.mutable_process() = key;
    v1::Report report;
    return stub.GetReport(&context, request, &report);
  }

  // The first update of a Watch stream (status of the stream when there is none).
  static grpc::Status WatchOnce(v1::Collector::Stub& stub, v1::StatsUpdate* update = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::WatchRequest request;
    auto reader = stub.Watch(&context, request);
    v1::StatsUpdate first;
    if (reader->Read(&first)) {
      if (update != nullptr) *update = first;
      context.TryCancel();
      reader->Finish();
      return grpc::Status::OK;
    }
    return reader->Finish();
  }

  TempDir certs_dir_;
  TempDir data_dir_;
  std::unique_ptr<TestCerts> certs_;
  std::string writer_tokens_, reader_tokens_, writer_a_, writer_b_, reader_, wrong_;
  std::unique_ptr<collector::Collector> collector_;
  std::unique_ptr<collector::CollectorServer> server_;
  std::string address_;
};

TEST_F(SecurityTest, TlsAndTokensCarryWritesAndReadsEndToEnd) {
  Start(Locked());
  auto writer = Stub(Client(writer_a_));
  v1::IngestAck ack;
  ASSERT_TRUE(Send(*writer, Batch(Key(1), 1, 10), &ack).ok());
  EXPECT_EQ(ack.acked_sequence(), 1u);
  auto reader = Stub(Client(reader_));
  v1::ListProcessesResponse list;
  ASSERT_TRUE(List(*reader, &list).ok());
  ASSERT_EQ(list.processes_size(), 1);
  EXPECT_EQ(list.processes(0).process().pid(), 1u);
  EXPECT_TRUE(GetReport(*reader, Key(1)).ok());
  v1::StatsUpdate update;
  ASSERT_TRUE(WatchOnce(*reader, &update).ok());
  EXPECT_EQ(update.processes_size(), 1);
}

TEST_F(SecurityTest, APlaintextClientOfATlsCollectorFailsAndIsToldWhy) {
  Start(Locked());
  net::ClientSecurity plaintext;
  plaintext.token_file = reader_;
  grpc::Status status = List(*Stub(plaintext));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // The same through `vramscope report`: exit 3, and the hint names the flag.
  const std::string cli = BinaryFromEnv("VRAMSCOPE_EXE");
  ASSERT_FALSE(cli.empty()) << "run through meson test";
  Subprocess report;
  ASSERT_TRUE(report.Start({cli, "report", "--collector", address_, "--token-file", reader_}));
  EXPECT_EQ(report.Wait(), 3);
  EXPECT_THAT(report.output(), HasSubstr("if the collector serves TLS, pass --tls-ca"));
  // With the CA it works.
  Subprocess good;
  ASSERT_TRUE(good.Start(
      {cli, "report", "--collector", address_, "--tls-ca", certs_->ca(), "--token-file", reader_}));
  EXPECT_EQ(good.Wait(), 0) << good.output();
}

TEST_F(SecurityTest, AClientTrustingAnotherCaRefusesTheCollector) {
  Start(Locked());
  net::ClientSecurity other = Client(reader_);
  other.ca_file = certs_->other_ca();
  grpc::Status status = List(*Stub(other));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_TRUE(List(*Stub(Client(reader_))).ok());
}

TEST_F(SecurityTest, MutualTlsRefusesClientsWithoutACertificateItsCaSigned) {
  net::ServerSecurity security = Locked();
  security.client_ca_file = certs_->ca();
  Start(security);
  grpc::Status status = List(*Stub(Client(reader_)));  // no client certificate
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  net::ClientSecurity intruder = Client(reader_);
  intruder.cert_file = certs_->other_client_cert();
  intruder.key_file = certs_->other_client_key();
  status = List(*Stub(intruder));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  net::ClientSecurity member = Client(reader_);
  member.cert_file = certs_->client_cert();
  member.key_file = certs_->client_key();
  status = List(*Stub(member));
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(SecurityTest, WriterTokensCannotReadAndReaderTokensCannotWrite) {
  Start(Locked());
  auto writer = Stub(Client(writer_a_));
  auto reader = Stub(Client(reader_));
  ASSERT_TRUE(Send(*writer, Batch(Key(1), 1, 10)).ok());

  for (grpc::Status status : {List(*writer), GetReport(*writer, Key(1)), WatchOnce(*writer)}) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("needs a reader token"));
  }
  grpc::Status status = Send(*reader, Batch(Key(2), 1, 10));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("needs a writer token"));

  for (const std::string& token_file : {std::string(), wrong_}) {
    auto stranger = Stub(Client(token_file));
    for (grpc::Status denied : {List(*stranger), Send(*stranger, Batch(Key(3), 1, 10)),
                                WatchOnce(*stranger), GetReport(*stranger, Key(1))}) {
      EXPECT_EQ(denied.error_code(), grpc::StatusCode::UNAUTHENTICATED) << denied.error_message();
      EXPECT_THAT(denied.error_message(), Not(HasSubstr(kWrong)));
    }
  }
  // Nothing the refused writers sent was stored.
  v1::ListProcessesResponse list;
  ASSERT_TRUE(List(*reader, &list).ok());
  EXPECT_EQ(list.processes_size(), 1);
}

TEST_F(SecurityTest, TokensWorkWithoutTlsOnLoopback) {
  net::ServerSecurity security;
  security.writer_token_file = writer_tokens_;
  security.reader_token_file = reader_tokens_;
  Start(security);
  net::ClientSecurity reader;
  reader.token_file = reader_;
  EXPECT_TRUE(List(*Stub(reader)).ok());
  EXPECT_EQ(List(*Stub(net::ClientSecurity{})).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, AMethodWithoutARuleIsDenied) {
  // A rule table that forgot ListProcesses: the call never gets an answer.
  net::MethodRoles roles = collector::CollectorMethodRoles();
  roles.erase(absl::StrCat("/", v1::Collector::service_full_name(), "/ListProcesses"));
  Start(Locked(), {}, roles);
  v1::ListProcessesResponse list;
  grpc::Status status = List(*Stub(Client(reader_)), &list);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  EXPECT_EQ(list.processes_size(), 0);
  EXPECT_TRUE(WatchOnce(*Stub(Client(reader_))).ok());  // the others still work
}

TEST_F(SecurityTest, AHandlerThatForgetsToAskIsStillDeniedForAMethodWithoutARule) {
  // The generated base service answers UNIMPLEMENTED and asks nobody; the guard's interceptor
  // must end calls of a method without a rule before that.
  net::MethodRoles roles = collector::CollectorMethodRoles();
  roles.erase(absl::StrCat("/", v1::Collector::service_full_name(), "/GetReport"));
  std::unique_ptr<net::ServerGuard> guard = *net::ServerGuard::Load(Locked(), roles);
  v1::Collector::Service bare;
  grpc::ServerBuilder builder;
  int port = 0;
  guard->AddTo(&builder, "127.0.0.1:0", &port);
  builder.RegisterService(&bare);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  address_ = absl::StrCat("127.0.0.1:", port);
  auto reader = Stub(Client(reader_));
  grpc::Status status = GetReport(*reader, Key(1));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  // A method with a rule goes through to the handler.
  EXPECT_EQ(List(*reader).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  server->Shutdown();
}

TEST_F(SecurityTest, EveryCollectorMethodHasARule) {
  const net::MethodRoles roles = collector::CollectorMethodRoles();
  const google::protobuf::ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::Collector::service_full_name());
  ASSERT_NE(descriptor, nullptr);
  for (int i = 0; i < descriptor->method_count(); ++i) {
    const std::string name =
        absl::StrCat("/", descriptor->full_name(), "/", descriptor->method(i)->name());
    EXPECT_TRUE(roles.contains(name)) << name << " has no rule in CollectorMethodRoles";
  }
  EXPECT_EQ(roles.size(), static_cast<size_t>(descriptor->method_count()));
}

TEST_F(SecurityTest, OneWriterFillingItsQuotaDoesNotLockOutAnother) {
  collector::CollectorOptions options;
  options.max_processes = 2;
  Start(Locked(), options);
  auto a = Stub(Client(writer_a_));
  auto b = Stub(Client(writer_b_));
  ASSERT_TRUE(Send(*a, Batch(Key(1), 1, 5)).ok());
  ASSERT_TRUE(Send(*a, Batch(Key(2), 1, 5)).ok());
  grpc::Status full = Send(*a, Batch(Key(3), 1, 5));
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << full.error_message();
  EXPECT_THAT(full.error_message(), HasSubstr("node-a"));
  EXPECT_THAT(full.error_message(), HasSubstr("--max-processes=2 per writer"));
  EXPECT_THAT(full.error_message(), Not(HasSubstr(kWriterA)));
  // Writer B has its own quota.
  grpc::Status b1 = Send(*b, Batch(Key(4), 1, 5));
  EXPECT_TRUE(b1.ok()) << b1.error_message();
  EXPECT_TRUE(Send(*b, Batch(Key(5), 1, 5)).ok());
  // A's existing processes still take batches.
  EXPECT_TRUE(Send(*a, Batch(Key(1), 2, 5)).ok());
}

TEST_F(SecurityTest, WithMutualTlsAndNoTokensTheQuotaIsPerClientCertificate) {
  net::ServerSecurity security;
  security.cert_file = certs_->server_cert();
  security.key_file = certs_->server_key();
  security.client_ca_file = certs_->ca();
  collector::CollectorOptions options;
  options.max_processes = 1;
  Start(security, options);
  net::ClientSecurity member = Client("");
  member.cert_file = certs_->client_cert();
  member.key_file = certs_->client_key();
  auto stub = Stub(member);
  ASSERT_TRUE(Send(*stub, Batch(Key(1), 1, 5)).ok());
  grpc::Status full = Send(*stub, Batch(Key(2), 1, 5));
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("client certificate node-a"));
}

TEST_F(SecurityTest, HostileProcessKeysNeverNameAPathOutsideTheDataDirectory) {
  Start(Locked());
  auto writer = Stub(Client(writer_a_));
  const std::vector<std::string> hosts = {"../../../escaped",
                                          "/etc/passwd",
                                          "..",
                                          ".hidden",
                                          std::string("nul\0/../x", 9),
                                          "a/b/c",
                                          std::string(10 << 20, 'h')};
  uint32_t pid = 100;
  for (const std::string& host : hosts) {
    v1::IngestAck ack;
    grpc::Status status = Send(*writer, Batch(Key(++pid, host), 1, 5), &ack);
    ASSERT_TRUE(status.ok()) << status.error_message();
    if (host.size() > 255) {
      EXPECT_TRUE(ack.rejected());
      EXPECT_THAT(ack.reject_reason(), HasSubstr("longer than 255 bytes"));
      EXPECT_LT(ack.reject_reason().size(), 1000u);
    } else {
      EXPECT_FALSE(ack.rejected()) << ack.reject_reason();
      EXPECT_EQ(ack.acked_sequence(), 1u);
    }
  }
  // Only the data directory was written to, and only plain names in it.
  std::vector<std::string> top;
  for (const auto& entry : std::filesystem::directory_iterator(data_dir_.path())) {
    top.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(top, ::testing::ElementsAre("data"));
  const std::regex safe("[A-Za-z0-9_-][A-Za-z0-9._-]*\\.vslog");
  int logs = 0;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(data_dir_.path() + "/data")) {
    EXPECT_TRUE(entry.is_regular_file()) << entry.path();
    EXPECT_EQ(entry.path().parent_path(), std::filesystem::path(data_dir_.path() + "/data"));
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(std::regex_match(name, safe)) << name;
    EXPECT_LE(name.size(), 126u);
    ++logs;
  }
  EXPECT_EQ(logs, static_cast<int>(hosts.size()) - 1);
  // Each process is stored under its own key, as sent.
  v1::ListProcessesResponse list;
  ASSERT_TRUE(List(*Stub(Client(reader_)), &list).ok());
  EXPECT_EQ(list.processes_size(), static_cast<int>(hosts.size()) - 1);
}

TEST_F(SecurityTest, SecretFilesOthersMayReadAreRefusedWithoutShowingTheSecret) {
  for (mode_t mode : {0644, 0640, 0604, 0620}) {
    const std::string file = certs_->WriteSecret("loose.token", kWriterA, mode);
    net::ClientSecurity client;
    client.token_file = file;
    absl::StatusOr<net::ClientCredentials> loaded = net::LoadClientCredentials(client);
    ASSERT_FALSE(loaded.ok()) << std::oct << mode;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(loaded.status().message(), HasSubstr("chmod 600 " + file));
    EXPECT_THAT(loaded.status().message(), Not(HasSubstr(kWriterA)));
    net::ServerSecurity server;
    server.writer_token_file = file;
    EXPECT_EQ(net::ServerGuard::Load(server, {}).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  // The private key alike.
  ASSERT_EQ(::chmod(certs_->server_key().c_str(), 0644), 0);
  absl::StatusOr<std::unique_ptr<net::ServerGuard>> guard = net::ServerGuard::Load(Locked(), {});
  EXPECT_EQ(guard.status().code(), absl::StatusCode::kPermissionDenied);
  // A link to a good file is refused too (its target's mode is not what was checked).
  const std::string link = certs_->path("link.token");
  ASSERT_EQ(::symlink(writer_a_.c_str(), link.c_str()), 0);
  net::ClientSecurity linked;
  linked.token_file = link;
  EXPECT_FALSE(net::LoadClientCredentials(linked).ok());
  // 0600 and 0400 are fine.
  for (mode_t mode : {0600, 0400}) {
    const std::string file = certs_->WriteSecret("tight.token", kWriterA, mode);
    net::ClientSecurity client;
    client.token_file = file;
    absl::StatusOr<net::ClientCredentials> loaded = net::LoadClientCredentials(client);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->token, kWriterA);
  }
}

// The exit status of a daemon expected to stop by itself after printing `text`: once the text is
// out (or after 20 s) it gets SIGTERM, which one that refused has no time to take (it blocks the
// signal from its first line and exits) and one that went on serving ends with 0.
int ExitOnItsOwn(Subprocess& process, const std::string& text) {
  process.WaitForOutput(text);
  process.Kill(SIGTERM);
  return process.Wait();
}

TEST_F(SecurityTest, TheDaemonsRefuseALooseTokenFileAtStart) {
  const std::string collector_bin = BinaryFromEnv("VRAMSCOPE_COLLECTOR");
  const std::string agent_bin = BinaryFromEnv("VRAMSCOPE_AGENT");
  ASSERT_FALSE(collector_bin.empty() || agent_bin.empty()) << "run through meson test";
  const std::string loose = certs_->WriteSecret("loose.token", kWriterA, 0644);
  Subprocess collector;
  ASSERT_TRUE(collector.Start({collector_bin, "--listen=127.0.0.1:0",
                               "--data-dir=" + data_dir_.path(), "--writer-token-file=" + loose}));
  EXPECT_EQ(ExitOnItsOwn(collector, "chmod 600"), 2);
  EXPECT_THAT(collector.output(), HasSubstr("chmod 600"));
  EXPECT_THAT(collector.output(), Not(HasSubstr(kWriterA)));
  // The agent ends by itself either way (--once; without the check, exit 3 in a few seconds).
  Subprocess agent;
  ASSERT_TRUE(agent.Start({agent_bin, "--once", "--once-timeout=3",
                           "--ring-dir=" + data_dir_.path(), "--token-file=" + loose}));
  EXPECT_EQ(agent.Wait(), 2);
  EXPECT_THAT(agent.output(), HasSubstr("chmod 600"));
  EXPECT_THAT(agent.output(), Not(HasSubstr(kWriterA)));
}

TEST_F(SecurityTest, TheCollectorRefusesToListenBeyondLoopbackUnlessLockedOrInsecure) {
  const std::string collector_bin = BinaryFromEnv("VRAMSCOPE_COLLECTOR");
  ASSERT_FALSE(collector_bin.empty()) << "run through meson test";
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {collector_bin, "--listen=0.0.0.0:0",
                                     "--data-dir=" + data_dir_.path()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto process = std::make_unique<Subprocess>();
    EXPECT_TRUE(process->Start(argv));
    return process;
  };
  auto plain = run({});
  EXPECT_EQ(ExitOnItsOwn(*plain, "refusing"), 2);
  EXPECT_THAT(plain->output(),
              HasSubstr("refusing to listen on 0.0.0.0:0 beyond loopback without TLS"));
  EXPECT_THAT(plain->output(), HasSubstr("--insecure"));
  // TLS alone is not enough: anyone could still write.
  auto tls_only = run({"--tls-cert=" + certs_->server_cert(), "--tls-key=" + certs_->server_key()});
  EXPECT_EQ(ExitOnItsOwn(*tls_only, "refusing"), 2);
  EXPECT_THAT(tls_only->output(), HasSubstr("without tokens"));
  // --insecure serves, and says so.
  auto insecure = run({"--insecure"});
  EXPECT_NE(insecure->WaitForPort(), 0) << insecure->output();
  EXPECT_THAT(insecure->output(), HasSubstr("--insecure: serving 0.0.0.0:0 beyond loopback"));
  insecure->Kill(SIGTERM);
  EXPECT_EQ(insecure->Wait(), 0);
  // TLS and tokens serve.
  auto locked =
      run({"--tls-cert=" + certs_->server_cert(), "--tls-key=" + certs_->server_key(),
           "--writer-token-file=" + writer_tokens_, "--reader-token-file=" + reader_tokens_});
  EXPECT_NE(locked->WaitForPort(), 0) << locked->output();
  locked->Kill(SIGTERM);
  EXPECT_EQ(locked->Wait(), 0);
  // In process alike: the server refuses to start.
  collector::CollectorOptions options;
  options.data_dir = data_dir_.path() + "/in-process";
  auto core = *collector::Collector::Open(options);
  collector::ServerOptions server_options;
  server_options.listen = "0.0.0.0:0";
  EXPECT_EQ(collector::CollectorServer::Start(core.get(), server_options).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LoopbackTest, OnlyLoopbackAddressesCount) {
  for (const char* yes : {"127.0.0.1:7411", "127.0.0.1:0", "127.1.2.3:80", "localhost:7411",
                          "[::1]:7411", "ipv4:127.0.0.1:1", "unix:/tmp/sock"}) {
    EXPECT_TRUE(net::IsLoopbackAddress(yes)) << yes;
  }
  for (const char* no : {"0.0.0.0:7411", "[::]:7411", ":7411", "10.0.0.1:7411", "node1:7411",
                         "127.0.0.1.evil.com:80", "1270.0.0.1:1", "[::ffff:10.0.0.1]:1"}) {
    EXPECT_FALSE(net::IsLoopbackAddress(no)) << no;
  }
}

TEST_F(SecurityTest, AgentAndReportOverTlsWithTokens) {
  const std::string agent_bin = BinaryFromEnv("VRAMSCOPE_AGENT");
  const std::string cli = BinaryFromEnv("VRAMSCOPE_EXE");
  ASSERT_FALSE(agent_bin.empty() || cli.empty()) << "run through meson test";
  Start(Locked());
  TempDir rings;
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the traced "application": writes its ring and exits, as the shim would
    interposer::RingWriter writer;
    interposer::RingOpenOptions ring_options;
    ring_options.dir = rings.path().c_str();
    if (writer.Open(ring_options) != interposer::RingError::kOk) ::_exit(1);
    for (uint64_t i = 0; i < 1000; ++i) {
      writer.RecordAlloc(0, 0x7f0000000000 + i * 4096, 4000, 4096, VRAMSCOPE_RING_ALLOC_POOLED);
    }
    writer.MarkExited(0);
    ::_exit(0);
  }
  int wait_status = 0;
  ASSERT_EQ(::waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0);
  // A reader token cannot deliver: the agent says it cannot reach (exit 3), naming the reason.
  // What it drained waits in the spool for the next agent.
  TempDir spool;
  Subprocess refused;
  ASSERT_TRUE(refused.Start({agent_bin, "--once", "--once-timeout=3", "--ring-dir=" + rings.path(),
                             "--spool-dir=" + spool.path(), "--collector=" + address_,
                             "--tls-ca=" + certs_->ca(), "--token-file=" + reader_}));
  EXPECT_EQ(refused.Wait(), 3);
  EXPECT_THAT(refused.output(), HasSubstr("needs a writer token"));
  Subprocess agent;
  ASSERT_TRUE(agent.Start({agent_bin, "--once", "--ring-dir=" + rings.path(),
                           "--spool-dir=" + spool.path(), "--collector=" + address_,
                           "--tls-ca=" + certs_->ca(), "--token-file=" + writer_a_}));
  EXPECT_EQ(agent.Wait(), 0) << agent.output();
  EXPECT_THAT(agent.output(), Not(HasSubstr(kWriterA)));
  const std::string json = rings.path() + "/report.json";
  Subprocess report;
  ASSERT_TRUE(report.Start({cli, "report", "--collector", address_, "--pid", std::to_string(child),
                            "--format", "json", "-o", json, "--tls-ca", certs_->ca(),
                            "--token-file", reader_}));
  EXPECT_EQ(report.Wait(), 0) << report.output();
  EXPECT_THAT(testing::ReadFile(json), HasSubstr("\"events\": \"1002\""));
  // top --once over the same edge (its lines go to stdout: a file here).
  const std::string lines = rings.path() + "/top.txt";
  Subprocess top;
  ASSERT_TRUE(
      top.Start({"/bin/sh", "-c", "exec \"$0\" \"$@\" >" + lines, cli, "top", "--once",
                 "--collector", address_, "--tls-ca", certs_->ca(), "--token-file", reader_}));
  EXPECT_EQ(top.Wait(), 0) << top.output();
  EXPECT_THAT(testing::ReadFile(lines), HasSubstr(absl::StrCat("pid=", child)));
}

TEST_F(SecurityTest, AHugeHostIsLoggedCutShort) {
  const std::string collector_bin = BinaryFromEnv("VRAMSCOPE_COLLECTOR");
  ASSERT_FALSE(collector_bin.empty()) << "run through meson test";
  Subprocess collector;
  ASSERT_TRUE(collector.Start(
      {collector_bin, "--listen=127.0.0.1:0", "--data-dir=" + data_dir_.path() + "/data"}));
  const int port = collector.WaitForPort();
  ASSERT_NE(port, 0) << collector.output();
  address_ = absl::StrCat("127.0.0.1:", port);
  auto writer = Stub(net::ClientSecurity{});
  for (uint32_t pid = 1; pid <= 3; ++pid) {
    v1::IngestAck ack;
    ASSERT_TRUE(Send(*writer, Batch(Key(pid, std::string(10 << 20, 'h')), 1, 5), &ack).ok());
    EXPECT_TRUE(ack.rejected());
  }
  collector.Kill(SIGTERM);
  EXPECT_EQ(collector.Wait(), 0);
  EXPECT_THAT(collector.output(), HasSubstr("(10485760 bytes)"));
  EXPECT_LT(collector.output().size(), 64u << 10);
}

// Files that hold traced processes' data are their user's alone, whatever the umask.
TEST(FileModesTest, RingsSpoolAndDataDirectoryAreTheOwnersOnly) {
  const mode_t old_umask = ::umask(0);
  TempDir dir;
  struct stat st {};
  // The shim's ring file.
  interposer::RingWriter writer;
  interposer::RingOpenOptions ring_options;
  ring_options.dir = dir.path().c_str();
  ASSERT_EQ(writer.Open(ring_options), interposer::RingError::kOk);
  ASSERT_EQ(::stat(writer.path(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "ring";
  // The agent's spool: its directory (created here), a batch file, the rejected/ folder.
  {
    agent::OutboxOptions options;
    options.spool_dir = dir.path() + "/spool";
    agent::Outbox outbox(options);
    ASSERT_TRUE(outbox.Add(Batch(Key(1), 1, 5), 1, [] {}));
    ASSERT_TRUE(outbox.Add(Batch(Key(1), 2, 5), 2, [] {}));
    ASSERT_EQ(::stat(options.spool_dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700u) << "spool directory";
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(options.spool_dir)) {
      ASSERT_EQ(::stat(entry.path().c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 07777, 0600u) << entry.path();
      ++files;
    }
    EXPECT_EQ(files, 2);
    outbox.Reject(Key(1), 1, "test");
    ASSERT_EQ(::stat((options.spool_dir + "/rejected").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700u) << "rejected directory";
    for (const auto& entry : std::filesystem::directory_iterator(options.spool_dir + "/rejected")) {
      ASSERT_EQ(::stat(entry.path().c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 07777, 0600u) << entry.path();
    }
  }
  // The collector's data directory and logs.
  collector::CollectorOptions options;
  options.data_dir = dir.path() + "/collector/data";
  auto collector = *collector::Collector::Open(options);
  ASSERT_TRUE(collector->Ingest(Batch(Key(1), 1, 5)).ok());
  ASSERT_EQ(::stat(options.data_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u) << "data directory";
  for (const auto& entry : std::filesystem::directory_iterator(options.data_dir)) {
    ASSERT_EQ(::stat(entry.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u) << entry.path();
  }
  ::umask(old_umask);
}

}  // namespace
}  // namespace vramscope
