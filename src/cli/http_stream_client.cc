#include "cli/http_stream_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace dserve::cli {
namespace {

constexpr size_t kMaxErrorBody = 2048;  // bytes of a non-2xx body kept for the error text

bool is_2xx(int status) { return status >= 200 && status < 300; }

Status ensure_curl_global_init() {
  static std::once_flag once;
  static CURLcode rc = CURLE_OK;
  std::call_once(once, [] { rc = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (rc != CURLE_OK)
    return internal_error(std::string("curl_global_init: ") + curl_easy_strerror(rc));
  return Status::Ok();
}

std::string trim(std::string s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\r' || s[b] == '\n' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\r' || s[e - 1] == '\n' || s[e - 1] == '\t'))
    --e;
  return s.substr(b, e - b);
}

curl_slist* make_header_list(const std::vector<std::string>& headers) {
  curl_slist* list = nullptr;
  for (const std::string& h : headers) list = curl_slist_append(list, h.c_str());
  return list;
}

}  // namespace

// ---- SseParser -------------------------------------------------------------------

Status SseParser::feed(std::string_view bytes, std::vector<std::string>& out) {
  size_t i = 0;
  if (last_was_cr_ && !bytes.empty()) {
    if (bytes[0] == '\n') i = 1;  // the "\n" of a "\r\n" split across chunks
    last_was_cr_ = false;
  }
  while (i < bytes.size()) {
    const size_t j = bytes.find_first_of("\r\n", i);
    const size_t end = j == std::string_view::npos ? bytes.size() : j;
    line_.append(bytes.data() + i, end - i);
    if (line_.size() > kMaxLineBytes) {
      return corrupt("SSE line longer than " + std::to_string(kMaxLineBytes) + " bytes");
    }
    if (j == std::string_view::npos) break;
    end_line(out);
    if (bytes[j] == '\r') {
      if (j + 1 == bytes.size()) {
        last_was_cr_ = true;
        i = j + 1;
      } else {
        i = bytes[j + 1] == '\n' ? j + 2 : j + 1;
      }
    } else {
      i = j + 1;
    }
  }
  return Status::Ok();
}

void SseParser::finish(std::vector<std::string>& out) {
  if (!line_.empty()) end_line(out);
  last_was_cr_ = false;
}

void SseParser::end_line(std::vector<std::string>& out) {
  // "data" alone is a data field with an empty value; "data:x" and "data: x" carry x.
  std::string_view line(line_);
  if (line == "data") {
    out.emplace_back();
  } else if (line.starts_with("data:")) {
    line.remove_prefix(5);
    if (line.starts_with(' ')) line.remove_prefix(1);
    out.emplace_back(line);
  }
  line_.clear();
}

// ---- HttpStreamClient ------------------------------------------------------------

struct HttpStreamClient::Transfer {
  HttpStreamClient* client = nullptr;
  uint64_t id = 0;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  StreamRequest request;  // owns the URL and the body curl points into
  SseParser parser;
  std::vector<std::string> events;  // scratch, reused for every chunk
  int http_status = 0;
  std::string reason;
  std::string error_body;  // the start of a non-2xx body
  Status abort;            // set when the parser or the listener stopped the stream
  char errbuf[CURL_ERROR_SIZE] = {};

  ~Transfer() {
    if (easy != nullptr) curl_easy_cleanup(easy);
    if (headers != nullptr) curl_slist_free_all(headers);
  }

  // Hands the collected events to the listener; false when it aborted the stream.
  bool deliver(SteadyTime now) {
    for (const std::string& e : events) {
      Status s = client->listener_->on_event(id, e, now);
      if (!s.ok()) {
        abort = std::move(s);
        events.clear();
        return false;
      }
    }
    events.clear();
    return true;
  }
};

HttpStreamClient::HttpStreamClient(StreamListener* listener) : listener_(listener) {}

HttpStreamClient::~HttpStreamClient() {
  CURLM* multi = static_cast<CURLM*>(multi_);
  for (auto& [id, t] : transfers_) curl_multi_remove_handle(multi, t->easy);
  transfers_.clear();
  if (multi != nullptr) curl_multi_cleanup(multi);
}

Result<std::unique_ptr<HttpStreamClient>> HttpStreamClient::create(StreamListener* listener) {
  DS_RETURN_IF_ERROR(ensure_curl_global_init());
  std::unique_ptr<HttpStreamClient> c(new HttpStreamClient(listener));
  CURLM* multi = curl_multi_init();
  if (multi == nullptr) return internal_error("curl_multi_init failed");
  c->multi_ = multi;
  // Keep idle connections for reuse by later requests, up to a generous bound.
  curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, 2048L);
  return c;
}

size_t HttpStreamClient::on_header(char* data, size_t size, size_t n, void* user) {
  Transfer* t = static_cast<Transfer*>(user);
  const std::string_view line(data, size * n);
  // Every response's status line ("HTTP/1.1 200 OK"); an interim 100 is replaced by the
  // final one.
  if (line.starts_with("HTTP/")) {
    const size_t sp = line.find(' ');
    if (sp != std::string_view::npos) {
      t->http_status = std::atoi(std::string(line.substr(sp + 1, 3)).c_str());
      const size_t sp2 = line.find(' ', sp + 1);
      t->reason =
          sp2 == std::string_view::npos ? std::string() : trim(std::string(line.substr(sp2 + 1)));
    }
  }
  return size * n;
}

size_t HttpStreamClient::on_body(char* data, size_t size, size_t n, void* user) {
  Transfer* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  if (!is_2xx(t->http_status)) {
    const size_t keep =
        std::min(bytes, kMaxErrorBody - std::min(kMaxErrorBody, t->error_body.size()));
    t->error_body.append(data, keep);
    return bytes;
  }
  const SteadyTime now = std::chrono::steady_clock::now();
  Status s = t->parser.feed(std::string_view(data, bytes), t->events);
  if (!s.ok()) {
    t->abort = std::move(s);
    return 0;  // stops the transfer with CURLE_WRITE_ERROR
  }
  return t->deliver(now) ? bytes : 0;
}

Status HttpStreamClient::start(uint64_t id, StreamRequest request) {
  if (transfers_.count(id) != 0) {
    return invalid_argument("stream id " + std::to_string(id) + " is already active");
  }
  auto t = std::make_unique<Transfer>();
  t->client = this;
  t->id = id;
  t->request = std::move(request);
  t->easy = curl_easy_init();
  if (t->easy == nullptr) return internal_error("curl_easy_init failed");
  t->headers = make_header_list(t->request.headers);
  CURL* e = t->easy;
  curl_easy_setopt(e, CURLOPT_URL, t->request.url.c_str());
  curl_easy_setopt(e, CURLOPT_POST, 1L);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, t->request.body.data());
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->request.body.size()));
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->headers);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &HttpStreamClient::on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &HttpStreamClient::on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, t.get());
  curl_easy_setopt(e, CURLOPT_PRIVATE, t.get());
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  const CURLMcode mc = curl_multi_add_handle(static_cast<CURLM*>(multi_), e);
  if (mc != CURLM_OK)
    return internal_error(std::string("curl_multi_add_handle: ") + curl_multi_strerror(mc));
  transfers_.emplace(id, std::move(t));
  return Status::Ok();
}

Status HttpStreamClient::poll(std::chrono::milliseconds timeout) {
  CURLM* multi = static_cast<CURLM*>(multi_);
  int running = 0;
  CURLMcode mc = curl_multi_perform(multi, &running);
  if (mc != CURLM_OK)
    return internal_error(std::string("curl_multi_perform: ") + curl_multi_strerror(mc));
  finish_done_transfers();
  mc = curl_multi_poll(multi, nullptr, 0, static_cast<int>(std::max<int64_t>(0, timeout.count())),
                       nullptr);
  if (mc != CURLM_OK)
    return internal_error(std::string("curl_multi_poll: ") + curl_multi_strerror(mc));
  mc = curl_multi_perform(multi, &running);
  if (mc != CURLM_OK)
    return internal_error(std::string("curl_multi_perform: ") + curl_multi_strerror(mc));
  finish_done_transfers();
  return Status::Ok();
}

void HttpStreamClient::finish_done_transfers() {
  CURLM* multi = static_cast<CURLM*>(multi_);
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
    if (msg->msg != CURLMSG_DONE) continue;
    Transfer* t = nullptr;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &t);
    const CURLcode rc = msg->data.result;
    StreamEnd end;
    end.http_status = t->http_status;
    end.time = std::chrono::steady_clock::now();
    if (!t->abort.ok()) {
      end.error = t->abort.message();
    } else if (rc != CURLE_OK) {
      end.error = t->errbuf[0] != 0 ? std::string(t->errbuf) : std::string(curl_easy_strerror(rc));
    } else if (!is_2xx(t->http_status)) {
      end.error = "HTTP " + std::to_string(t->http_status) +
                  (t->reason.empty() ? std::string() : " " + t->reason);
      const std::string body = trim(t->error_body);
      if (!body.empty()) end.error += ": " + body;
    } else {
      t->parser.finish(t->events);
      if (t->deliver(end.time)) {
        end.ok = true;
      } else {
        end.error = t->abort.message();
      }
    }
    curl_multi_remove_handle(multi, t->easy);
    const uint64_t id = t->id;
    listener_->on_end(id, end);
    transfers_.erase(id);
  }
}

// ---- http_get --------------------------------------------------------------------

Result<std::string> http_get(const std::string& url, const std::vector<std::string>& headers,
                             std::chrono::milliseconds timeout) {
  DS_RETURN_IF_ERROR(ensure_curl_global_init());
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> e(curl_easy_init(), &curl_easy_cleanup);
  if (!e) return internal_error("curl_easy_init failed");
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> list(make_header_list(headers),
                                                                   &curl_slist_free_all);
  std::string body;
  char errbuf[CURL_ERROR_SIZE] = {};
  auto write = +[](char* data, size_t size, size_t n, void* user) -> size_t {
    static_cast<std::string*>(user)->append(data, size * n);
    return size * n;
  };
  curl_easy_setopt(e.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(e.get(), CURLOPT_HTTPHEADER, list.get());
  curl_easy_setopt(e.get(), CURLOPT_WRITEFUNCTION, write);
  curl_easy_setopt(e.get(), CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(e.get(), CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(e.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e.get(), CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  const CURLcode rc = curl_easy_perform(e.get());
  if (rc != CURLE_OK) {
    return io_error("GET " + url + ": " +
                    (errbuf[0] != 0 ? std::string(errbuf) : curl_easy_strerror(rc)));
  }
  long status = 0;
  curl_easy_getinfo(e.get(), CURLINFO_RESPONSE_CODE, &status);
  if (!is_2xx(static_cast<int>(status))) {
    return io_error("GET " + url + ": HTTP " + std::to_string(status) + ": " +
                    trim(body).substr(0, 512));
  }
  return body;
}

}  // namespace dserve::cli
