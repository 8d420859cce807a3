// The exporter's descriptor service (ipc.h): the fallback where pidfd_getfd is refused (Yama
// ptrace_scope >= 1 lets only ancestors ptrace, so a child importing its parent's memory, the
// everyday torch.multiprocessing case, cannot take its descriptors). One thread, started on the
// first export, with every signal blocked, on an abstract Unix socket named after the
// exporter's pid and start time; it answers only peers of the same uid (SO_PEERCRED), one
// request per connection, and only for a live export whose generation and nonce match.
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>

#include "ipc.h"
#include "log.h"

namespace vramscope::interposer {
namespace {

constinit std::atomic<int> g_state{0};  // 0 not started, 1 running, -1 failed
constinit int g_listen_fd = -1;
constinit pthread_mutex_t g_start_mu = PTHREAD_MUTEX_INITIALIZER;

int Address(int pid, std::uint64_t start, sockaddr_un* addr, socklen_t* length) {
  memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  const int n = IpcServiceAddress(pid, start, addr->sun_path, sizeof(addr->sun_path));
  if (n < 0) return -1;
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
  return 0;
}

void SetTimeouts(int fd) {
  timeval tv{2, 0};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

int SendReply(int socket, const int* fds, int n) {
  IpcReply reply{0, static_cast<std::uint32_t>(n)};
  iovec iov{&reply, sizeof(reply)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kIpcMaxChunks + 1))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (n > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * n);
    memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * n);
  }
  return sendmsg(socket, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(reply)) ? n : -EIO;
}

void Serve(int conn) {
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 || peer.uid != getuid()) {
    return;  // another user: no answer at all
  }
  IpcRequest request{};
  if (recv(conn, &request, sizeof(request), MSG_WAITALL) != sizeof(request) ||
      memcmp(request.magic, kIpcRequestMagic, sizeof(request.magic)) != 0) {
    return;
  }
  const int served = IpcServeRequest(request, SendReply, conn);
  if (served < 0) {
    IpcReply reply{-served, 0};
    (void)send(conn, &reply, sizeof(reply), MSG_NOSIGNAL);
  }
}

void* ServiceMain(void* arg) {
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(arg));
  for (;;) {
    const int conn = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EBADF || errno == EINVAL) return nullptr;
      continue;
    }
    SetTimeouts(conn);
    Serve(conn);
    close(conn);
  }
}

}  // namespace

bool IpcStartService(std::uint64_t start_time) {
  const int state = g_state.load(std::memory_order_acquire);
  if (state != 0) return state > 0;
  pthread_mutex_lock(&g_start_mu);
  if (g_state.load(std::memory_order_relaxed) == 0) {
    int result = -1;
    sockaddr_un addr;
    socklen_t length = 0;
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && Address(getpid(), start_time, &addr, &length) == 0 &&
        bind(fd, reinterpret_cast<sockaddr*>(&addr), length) == 0 && listen(fd, 64) == 0) {
      sigset_t all;
      sigset_t old;
      sigfillset(&all);
      pthread_sigmask(SIG_SETMASK, &all, &old);
      pthread_t thread;
      pthread_attr_t attr;
      pthread_attr_init(&attr);
      pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
      if (pthread_create(&thread, &attr, ServiceMain,
                         reinterpret_cast<void*>(static_cast<std::intptr_t>(fd))) == 0) {
        result = 1;
        g_listen_fd = fd;
      }
      pthread_attr_destroy(&attr);
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
    if (result < 0 && fd >= 0) close(fd);
    g_state.store(result, std::memory_order_release);
  }
  pthread_mutex_unlock(&g_start_mu);
  return g_state.load(std::memory_order_acquire) > 0;
}

void IpcServiceForgetInChild() {
  // The thread did not survive the fork; the listening socket is the parent's name.
  pthread_mutex_init(&g_start_mu, nullptr);
  if (g_listen_fd >= 0) close(g_listen_fd);
  g_listen_fd = -1;
  g_state.store(0, std::memory_order_relaxed);
}

int IpcRequestFds(int pid, std::uint64_t start, const IpcRequest& request, int* fds, int capacity) {
  sockaddr_un addr;
  socklen_t length = 0;
  if (Address(pid, start, &addr, &length) != 0) return -EINVAL;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  SetTimeouts(fd);
  int answer = -ECONNREFUSED;
  ucred peer{};
  socklen_t peer_length = sizeof(peer);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), length) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_length) == 0 && peer.pid == pid &&
      peer.uid == getuid() &&
      send(fd, &request, sizeof(request), MSG_NOSIGNAL) == sizeof(request)) {
    IpcReply reply{};
    iovec iov{&reply, sizeof(reply)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kIpcMaxChunks + 1))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    int received = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      const int* in = reinterpret_cast<const int*>(CMSG_DATA(c));
      for (int i = 0; i < count; ++i) {
        if (received < capacity) {
          fds[received++] = in[i];
        } else {
          close(in[i]);
        }
      }
    }
    if (n != sizeof(reply) || reply.status != 0 || (msg.msg_flags & MSG_CTRUNC) != 0 ||
        static_cast<int>(reply.fds) != received || received == 0) {
      for (int i = 0; i < received; ++i) close(fds[i]);
      answer = n == sizeof(reply) && reply.status != 0 ? -reply.status : -EPROTO;
    } else {
      answer = received;
    }
  }
  close(fd);
  return answer;
}

}  // namespace vramscope::interposer
