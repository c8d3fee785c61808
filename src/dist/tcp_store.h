// TcpStore: the key-value store ranks meet through before gloo connects them, reached
// at an address and port given on the command line (torchrun's --master-addr and
// --master-port), so no mpirun or shared file system is needed.
//
// Rank 0 runs a TcpStoreServer; every rank (rank 0 included) talks to it through a
// TcpStore client, which implements gloo::rendezvous::Store so gloo's own
// connectFullMesh exchanges its pair addresses through it. The packaged gloo ships no
// TCP store (only file, hash and redis stores), hence this small one.
//
// Wire format. A client opens with the 8 bytes kStoreHello ("dserve-1"), which the
// server answers with 'H'; then requests, each an op byte, a u32 key length and the
// key, and for 'S' and 'C' a u32 value length and the value: 'S' key value (set) ->
// 'K'; 'C' key value (claim: set unless present) -> 'K', or 'V' u32 length value (the
// value that holds it); 'G' key -> 'N' (absent) or 'V' u32 length value. Keys are
// capped at 4 KiB and values at 64 MiB, so a stray client cannot make the server
// allocate without bound.
//
// Strangers: anything that connects to the port and does not open with the hello
// within kHandshakeTimeout (sends nothing, or junk) is dropped without touching the
// store, each connection on a thread of its own, so it delays no rank. A rank claims
// its key (gloo_communicator.cc), so a second process with the same rank cannot take
// the first one's place.
//
// Thread-safety: the server runs its own threads and guards its map with a mutex; a
// TcpStore client is used by one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "base/status.h"

namespace dserve::dist {

inline constexpr char kStoreHello[8] = {'d', 's', 'e', 'r', 'v', 'e', '-', '1'};
inline constexpr std::chrono::milliseconds kHandshakeTimeout{10'000};

class TcpStoreServer {
 public:
  // Listens on host:port (host "" or "0.0.0.0" = every interface). A port already in
  // use is a clear error, not a retry. A connection that has not sent the hello within
  // `handshake_timeout` is dropped.
  static Result<std::unique_ptr<TcpStoreServer>> start(const std::string& host, int port,
                                                       std::chrono::milliseconds handshake_timeout =
                                                           kHandshakeTimeout);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

 private:
  TcpStoreServer(int listen_fd, int port, std::chrono::milliseconds handshake_timeout);
  void accept_loop();
  void serve_client(int fd);
  // True when the client opened with kStoreHello in time (and was answered).
  bool handshake(int fd);

  int listen_fd_;
  int port_;
  const std::chrono::milliseconds handshake_timeout_;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mutex_;
  std::map<std::string, std::vector<char>> values_;  // GUARDED_BY(mutex_)
  std::vector<std::thread> clients_;                 // GUARDED_BY(mutex_)
  std::vector<int> client_fds_;                      // GUARDED_BY(mutex_)
};

// Errors inside the gloo::rendezvous::Store methods are thrown (gloo's interface has no
// status return) as gloo::IoException with a message naming the key and the server.
class TcpStore final : public gloo::rendezvous::Store {
 public:
  // Connects to host:port, retrying refused connections until `timeout` has passed
  // (the server's rank may start later than this one), and says hello. Something on
  // the port that does not answer the hello is a clear error.
  static Result<std::unique_ptr<TcpStore>> connect(const std::string& host, int port,
                                                   std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // Non-throwing forms for dserve's own rendezvous steps.
  Status try_set(const std::string& key, const std::string& value);
  // The value, or nullopt-like empty Result with kNotFound when absent.
  Result<std::string> try_get(const std::string& key);
  // Sets key to value unless it is set already: the value that holds it (== value when
  // this call claimed it).
  Result<std::string> claim(const std::string& key, const std::string& value);

  std::string endpoint() const { return host_ + ":" + std::to_string(port_); }

 private:
  TcpStore(int fd, std::string host, int port, std::chrono::milliseconds timeout)
      : fd_(fd), host_(std::move(host)), port_(port), timeout_(timeout) {}
  Status request(char op, const std::string& key, const std::vector<char>* value, char* reply,
                 std::vector<char>* reply_value);

  int fd_;
  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dserve::dist
