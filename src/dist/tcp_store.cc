#include "dist/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <gloo/common/error.h>

namespace dserve::dist {
namespace {

constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint32_t kMaxValueBytes = 64u << 20;

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_blob(int fd, const char* data, uint32_t n) {
  return write_all(fd, &n, sizeof n) && (n == 0 || write_all(fd, data, n));
}

bool read_blob(int fd, uint32_t limit, std::vector<char>* out) {
  uint32_t n = 0;
  if (!read_all(fd, &n, sizeof n) || n > limit) return false;
  out->resize(n);
  return n == 0 || read_all(fd, out->data(), n);
}

// Resolves host (name or numeric, IPv4) for connect/bind; "" means any.
Result<sockaddr_in> resolve(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0") {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    return addr;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0 || res == nullptr) {
    return invalid_argument("cannot resolve address '" + host + "': " + ::gai_strerror(rc));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return addr;
}

// Reads exactly n bytes before `deadline`; false on a timeout, an error or the end.
bool read_before(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int rc = ::poll(&pfd, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

// ---- server ----

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& host, int port,
                                                              std::chrono::milliseconds handshake_timeout) {
  if (port < 0 || port > 65535) return invalid_argument("port " + std::to_string(port) + " is out of range");
  DS_ASSIGN_OR_RETURN(sockaddr_in addr, resolve(host, port));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return io_error(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  // SO_REUSEADDR only skips TIME_WAIT leftovers of an earlier run; a live listener on
  // the port still makes bind fail with EADDRINUSE.
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    ::close(fd);
    std::string where = (host.empty() ? "0.0.0.0" : host) + ":" + std::to_string(port);
    if (err == EADDRINUSE) return io_error("rendezvous port " + where + " is already in use");
    return io_error("cannot listen on " + where + ": " + std::strerror(err));
  }
  if (::listen(fd, 128) != 0) {
    int err = errno;
    ::close(fd);
    return io_error(std::string("listen: ") + std::strerror(err));
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto server =
      std::unique_ptr<TcpStoreServer>(new TcpStoreServer(fd, ntohs(addr.sin_port), handshake_timeout));
  if (::pipe2(server->wake_pipe_, O_CLOEXEC) != 0) return io_error("pipe2 failed");
  server->acceptor_ = std::thread([s = server.get()] { s->accept_loop(); });
  return server;
}

TcpStoreServer::TcpStoreServer(int listen_fd, int port, std::chrono::milliseconds handshake_timeout)
    : listen_fd_(listen_fd), port_(port), handshake_timeout_(handshake_timeout) {}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  if (wake_pipe_[1] >= 0) {
    char c = 0;
    (void)!::write(wake_pipe_[1], &c, 1);
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> clients;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
    clients.swap(clients_);
  }
  for (auto& t : clients) t.join();
  for (int fd : client_fds_) ::close(fd);
  ::close(listen_fd_);
  for (int fd : wake_pipe_) {
    if (fd >= 0) ::close(fd);
  }
}

void TcpStoreServer::accept_loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mutex_);
    client_fds_.push_back(fd);
    clients_.emplace_back([this, fd] { serve_client(fd); });
  }
}

bool TcpStoreServer::handshake(int fd) {
  char hello[sizeof kStoreHello];
  if (!read_before(fd, hello, sizeof hello, std::chrono::steady_clock::now() + handshake_timeout_) ||
      std::memcmp(hello, kStoreHello, sizeof hello) != 0) {
    return false;
  }
  const char ack = 'H';
  return write_all(fd, &ack, 1);
}

void TcpStoreServer::serve_client(int fd) {
  // A stranger (silent, or not speaking this protocol) is dropped here: the socket's
  // end tells it, and nothing it sent reaches the store.
  if (!handshake(fd)) {
    ::shutdown(fd, SHUT_RDWR);
    return;
  }
  std::vector<char> key, value;
  for (;;) {
    char op = 0;
    if (!read_all(fd, &op, 1) || !read_blob(fd, kMaxKeyBytes, &key)) return;
    std::string k(key.begin(), key.end());
    if (op == 'S') {
      if (!read_blob(fd, kMaxValueBytes, &value)) return;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        values_[k] = value;
      }
      char ok = 'K';
      if (!write_all(fd, &ok, 1)) return;
    } else if (op == 'C') {
      if (!read_blob(fd, kMaxValueBytes, &value)) return;
      std::vector<char> holder;
      bool taken = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto [it, inserted] = values_.try_emplace(k, value);
        taken = !inserted;
        if (taken) holder = it->second;
      }
      const char tag = taken ? 'V' : 'K';
      if (!write_all(fd, &tag, 1)) return;
      if (taken && !write_blob(fd, holder.data(), static_cast<uint32_t>(holder.size()))) return;
    } else if (op == 'G') {
      std::vector<char> found;
      bool present = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = values_.find(k);
        if (it != values_.end()) {
          present = true;
          found = it->second;
        }
      }
      char tag = present ? 'V' : 'N';
      if (!write_all(fd, &tag, 1)) return;
      if (present && !write_blob(fd, found.data(), static_cast<uint32_t>(found.size()))) return;
    } else {
      return;  // not our protocol: drop the connection
    }
  }
}

// ---- client ----

Result<std::unique_ptr<TcpStore>> TcpStore::connect(const std::string& host, int port,
                                                    std::chrono::milliseconds timeout) {
  DS_ASSIGN_OR_RETURN(sockaddr_in addr, resolve(host, port));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return io_error(std::string("socket: ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      char ack = 0;
      if (!write_all(fd, kStoreHello, sizeof kStoreHello) ||
          !read_before(fd, &ack, 1,
                       std::chrono::steady_clock::now() +
                           std::clamp<std::chrono::milliseconds>(timeout, std::chrono::seconds(1), kHandshakeTimeout)) ||
          ack != 'H') {
        ::close(fd);
        return io_error(host + ":" + std::to_string(port) +
                        " did not answer as a dserve rendezvous (another program on the port?)");
      }
      return std::unique_ptr<TcpStore>(new TcpStore(fd, host, port, timeout));
    }
    last_error = std::strerror(errno);
    ::close(fd);
    if (std::chrono::steady_clock::now() >= deadline) {
      return io_error("could not reach rank 0's rendezvous at " + host + ":" + std::to_string(port) +
                      " within " + std::to_string(timeout.count() / 1000.0).substr(0, 5) + " s (" +
                      last_error + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TcpStore::~TcpStore() { ::close(fd_); }

Status TcpStore::request(char op, const std::string& key, const std::vector<char>* value, char* reply,
                         std::vector<char>* reply_value) {
  const bool sent = write_all(fd_, &op, 1) && write_blob(fd_, key.data(), static_cast<uint32_t>(key.size())) &&
                    (value == nullptr || write_blob(fd_, value->data(), static_cast<uint32_t>(value->size())));
  if (!sent || !read_all(fd_, reply, 1)) {
    return io_error("lost the connection to rank 0's rendezvous at " + endpoint() + " (rank 0 exited?)");
  }
  if (*reply == 'V' && (reply_value == nullptr || !read_blob(fd_, kMaxValueBytes, reply_value))) {
    return io_error("lost the connection to rank 0's rendezvous at " + endpoint());
  }
  return Status::Ok();
}

Status TcpStore::try_set(const std::string& key, const std::string& value) {
  std::vector<char> v(value.begin(), value.end());
  char reply = 0;
  return request('S', key, &v, &reply, nullptr);
}

Result<std::string> TcpStore::claim(const std::string& key, const std::string& value) {
  std::vector<char> v(value.begin(), value.end());
  char reply = 0;
  std::vector<char> holder;
  DS_RETURN_IF_ERROR(request('C', key, &v, &reply, &holder));
  if (reply == 'K') return value;
  return std::string(holder.begin(), holder.end());
}

Result<std::string> TcpStore::try_get(const std::string& key) {
  char reply = 0;
  std::vector<char> value;
  DS_RETURN_IF_ERROR(request('G', key, nullptr, &reply, &value));
  if (reply != 'V') return not_found("rendezvous key '" + key + "' is not set");
  return std::string(value.begin(), value.end());
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  char reply = 0;
  Status s = request('S', key, &data, &reply, nullptr);
  if (!s.ok()) throw gloo::IoException(s.message());
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  char reply = 0;
  std::vector<char> value;
  Status s = request('G', key, nullptr, &reply, &value);
  if (!s.ok()) throw gloo::IoException(s.message());
  if (reply != 'V') throw gloo::IoException("rendezvous key '" + key + "' vanished");
  return value;
}

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) {
    for (;;) {
      char reply = 0;
      std::vector<char> value;
      Status s = request('G', key, nullptr, &reply, &value);
      if (!s.ok()) throw gloo::IoException(s.message());
      if (reply == 'V') break;
      if (std::chrono::steady_clock::now() >= deadline) {
        throw gloo::IoException("timed out waiting for rendezvous key '" + key + "' at " + endpoint());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

}  // namespace dserve::dist
