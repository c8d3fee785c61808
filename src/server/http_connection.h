// One client connection of the HTTP front end: an asynchronous state machine on its own
// Asio strand that reads, parses (HttpRequestParser), hands each request to the
// ConnectionHost and writes the response; plain TCP or TLS. An idle connection holds a
// pending read and a timer, no thread.
//
// Phases and their deadlines (one timer, re-armed per phase):
//   handshake (TLS)  head_timeout
//   idle             keep_alive_timeout, until the first byte of the next request
//   head             head_timeout, from the first byte to the end of the header
//   body             body_timeout, from the end of the header to the end of the body
//   handling         none for the request; each write must progress within write_timeout
//   linger           2 s, reading and discarding what the client still sends after an
//                    error response, so that it reads the response rather than a reset
// While a request is handled, a read stays pending: pipelined requests are buffered
// (up to 64 KiB) and parsed in order once the response is written, and an end of
// stream or error means the client is gone: the exchange's ClientWatch fires and the
// request's engine work is aborted. A client that half-closes is treated as gone (as
// uvicorn does); whatever response is ready is still written before closing.
//
// Thread-safety: all state is touched on the strand only; HttpExchange's methods post
// to it. stop() may be called from any thread.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include <memory>

namespace dserve::server {

class ConnectionHost;

class Connection {
 public:
  virtual ~Connection() = default;
  // From any thread. Graceful: closes the connection unless a request is being handled,
  // whose response then closes it. Otherwise at once: a request being handled sees its
  // client gone.
  virtual void stop(bool graceful) = 0;
};

// Starts serving `socket` (whose executor is a strand). `tls` null: plain HTTP.
std::shared_ptr<Connection> start_connection(boost::asio::ip::tcp::socket socket,
                                             boost::asio::ssl::context* tls,
                                             ConnectionHost& host);

}  // namespace dserve::server
