// AuditLog: concurrent record() calls give whole, parseable lines, one per call, all on
// disk once the log is destroyed; Sha256 against FIPS 180-2's published test vectors.
#include "server/audit_log.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace dserve::server {
namespace {

std::string temp_path(const char* name) {
  const char* dir = std::getenv("DSERVE_TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

TEST(Sha256, FipsTestVectors) {
  // FIPS 180-2, appendix B.1 and B.2.
  EXPECT_EQ(Sha256::hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 h;  // the same message in pieces
  h.update("abcdbcdecdefdefgefghfghighijhijk");
  h.update("ijkljklmklmnlmnomnopnopq");
  EXPECT_EQ(h.hex_digest(), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(AuditLog::key_id("abc"), "sha256:ba7816bf8f01cfea");
}

TEST(AuditLog, ConcurrentRecordsAreWholeLines) {
  const std::string path = temp_path("audit_log_test.jsonl");
  std::remove(path.c_str());
  constexpr int kThreads = 8, kPerThread = 200;
  {
    auto log = AuditLog::open(path);
    ASSERT_TRUE(log.ok()) << log.status().message();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          AuditRecord r;
          r.request_id = std::to_string(t) + "-" + std::to_string(i);
          r.endpoint = "/v1/completions";
          r.model = "m\n\"\xff";  // escaped, and invalid UTF-8 replaced
          r.request_sha256 = Sha256::hex(r.request_id);
          r.status = 200;
          if (i % 2) r.prompt_tokens = i;
          (*log)->record(std::move(r));
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }  // the destructor writes what is queued
  std::ifstream f(path);
  std::set<std::string> ids;
  std::string line;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string id = j["request_id"];
    EXPECT_EQ(j["request_sha256"], Sha256::hex(id));
    EXPECT_TRUE(j["key_id"].is_null());
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), size_t{kThreads * kPerThread});
  EXPECT_FALSE(AuditLog::open("/no/such/dir/audit.jsonl").ok());
}

}  // namespace
}  // namespace dserve::server
