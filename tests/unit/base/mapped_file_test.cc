// MappedFile::release against the file's bytes as std::ifstream reads them, page
// arithmetic from sysconf(_SC_PAGESIZE), and the process's resident memory as
// /proc/self/statm reports it (resident_memory_bytes).
#include "base/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/memory_limit.h"

namespace dserve {
namespace {

namespace fs = std::filesystem;

class MappedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("DSERVE_TEST_TMPDIR");
    path_ = fs::path(base ? base : fs::temp_directory_path().string()) /
            ("mapped_file_test." + std::to_string(getpid()));
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes_.resize(4096 * page_ + 123);  // 16 MiB and a partial page at 4 KiB pages
    std::mt19937 rng(7);
    for (auto& b : bytes_) b = static_cast<char>(rng());
    std::ofstream(path_, std::ios::binary).write(bytes_.data(), static_cast<std::streamsize>(bytes_.size()));
  }
  void TearDown() override { fs::remove(path_); }

  std::string file_bytes() const {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path path_;
  size_t page_ = 0;
  std::string bytes_;
};

TEST_F(MappedFileTest, ReleasesWholePagesInsideTheRangeAndKeepsTheDataReadable) {
  auto map = MappedFile::open(path_.string());
  ASSERT_TRUE(map.ok()) << map.status().to_string();
  const MappedFile& f = **map;
  ASSERT_EQ(f.size(), bytes_.size());
  volatile uint64_t sum = 0;
  for (size_t i = 0; i < f.size(); i += page_) sum = sum + f.data()[i];  // all resident
  const int64_t before = resident_memory_bytes();

  // From 100 bytes in to 200 bytes before the end: the first and last pages are
  // partly outside the range and stay.
  const size_t begin = 100, n = f.size() - 300;
  const size_t first = (begin + page_ - 1) / page_ * page_, end = (begin + n) / page_ * page_;
  EXPECT_EQ(f.release(f.data() + begin, n), end - first);
  const int64_t after = resident_memory_bytes();
  EXPECT_GT(before - after, static_cast<int64_t>(end - first) * 9 / 10)
      << "resident " << before << " -> " << after << " bytes";

  // Read again through the map: the file's bytes, faulted back in.
  const std::string want = file_bytes();
  ASSERT_EQ(want.size(), f.size());
  EXPECT_EQ(std::memcmp(f.data(), want.data(), want.size()), 0);
}

TEST_F(MappedFileTest, ReleasesNothingOutsideTheMap) {
  auto map = MappedFile::open(path_.string());
  ASSERT_TRUE(map.ok()) << map.status().to_string();
  const MappedFile& f = **map;
  std::vector<uint8_t> heap(8 * page_, 0x5a);
  EXPECT_EQ(f.release(heap.data(), heap.size()), 0u);  // not the map's: left alone
  EXPECT_EQ(heap[3 * page_], 0x5a);
  EXPECT_EQ(f.release(f.data() + f.size() - page_, 2 * page_), 0u);  // runs past the end
  EXPECT_EQ(f.release(f.data() + 1, page_), 0u);                      // no whole page inside
}

}  // namespace
}  // namespace dserve
