// read_memory_limit against files laid out as the kernel lays out /proc/self/cgroup,
// /proc/self/mountinfo and the cgroup v1 / v2 file systems (Documentation/admin-guide/
// cgroup-v1/memory.rst, cgroup-v2.rst, proc(5)), written under a temporary directory.
#include "base/memory_limit.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace dserve {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kPhysical = 16 * kGiB;
// What cgroup v1 reports for "no limit": LONG_MAX rounded down to a page.
constexpr const char* kV1Unlimited = "9223372036854771712\n";

class MemoryLimitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("DSERVE_TEST_TMPDIR");
    root_ = fs::path(base ? base : fs::temp_directory_path().string()) /
            ("memory_limit_test." + std::to_string(getpid()) + "." +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    files_.proc_self_cgroup = (root_ / "proc_self_cgroup").string();
    files_.proc_self_mountinfo = (root_ / "proc_self_mountinfo").string();
    files_.physical_bytes = kPhysical;
  }
  void TearDown() override { fs::remove_all(root_); }

  // Writes `text` at `rel` under the temporary root, creating directories.
  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string path(const std::string& rel) const { return (root_ / rel).string(); }
  // A mountinfo line for a cgroup hierarchy: `root` of it mounted at `rel`.
  std::string mount_line(int id, const std::string& root, const std::string& rel, bool v2) const {
    return std::to_string(id) + " 31 0:" + std::to_string(id) + " " + root + " " + path(rel) +
           " rw,nosuid,nodev,noexec,relatime shared:" + std::to_string(id) + " - " +
           (v2 ? "cgroup2 cgroup2 rw,nsdelegate" : "cgroup cgroup rw,memory") + "\n";
  }
  void write_proc(const std::string& cgroup, const std::string& mountinfo) {
    std::ofstream(files_.proc_self_cgroup) << cgroup;
    std::ofstream(files_.proc_self_mountinfo)
        << "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        << "31 22 0:26 / " << path("sys/fs/cgroup") << " rw shared:9 - tmpfs tmpfs rw,mode=755\n"
        << mountinfo;
  }

  fs::path root_;
  MemoryLimitFiles files_;
};

TEST_F(MemoryLimitTest, V1TakesTheTightestLimitUpTheNestedPath) {
  write_proc("5:devices:/kubepods/pod1/ctr\n4:memory:/kubepods/pod1/ctr\n1:name=systemd:/\n",
             mount_line(35, "/", "sys/fs/cgroup/memory", false));
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", kV1Unlimited);
  write("sys/fs/cgroup/memory/kubepods/memory.limit_in_bytes", "8589934592\n");
  write("sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes", "2147483648\n");
  write("sys/fs/cgroup/memory/kubepods/pod1/ctr/memory.limit_in_bytes", kV1Unlimited);
  const MemoryLimit limit = read_memory_limit(files_);
  EXPECT_EQ(limit.bytes, 2 * kGiB);
  EXPECT_EQ(limit.source,
            "cgroup v1 memory.limit_in_bytes of " + path("sys/fs/cgroup/memory/kubepods/pod1"));
}

TEST_F(MemoryLimitTest, V1GroupThatIsTheMountsRootReadsTheMountPoint) {
  // A container without a cgroup namespace: its group is mounted as the hierarchy root.
  write_proc("4:memory:/docker/abc\n",
             mount_line(35, "/docker/abc", "sys/fs/cgroup/memory", false));
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", "536870912\n");
  const MemoryLimit limit = read_memory_limit(files_);
  EXPECT_EQ(limit.bytes, 512 << 20);
  EXPECT_EQ(limit.source, "cgroup v1 memory.limit_in_bytes of " + path("sys/fs/cgroup/memory"));
}

TEST_F(MemoryLimitTest, V2ReadsMemoryMaxWithMaxMeaningUnlimited) {
  write_proc("0::/user.slice/app.service\n", mount_line(41, "/", "sys/fs/cgroup", true));
  write("sys/fs/cgroup/user.slice/memory.max", "3221225472\n");
  write("sys/fs/cgroup/user.slice/app.service/memory.max", "max\n");
  const MemoryLimit limit = read_memory_limit(files_);
  EXPECT_EQ(limit.bytes, 3 * kGiB);
  EXPECT_EQ(limit.source, "cgroup v2 memory.max of " + path("sys/fs/cgroup/user.slice"));
}

TEST_F(MemoryLimitTest, V2UnlimitedEverywhereIsPhysicalMemory) {
  write_proc("0::/a/b\n", mount_line(41, "/", "sys/fs/cgroup", true));
  write("sys/fs/cgroup/a/memory.max", "max\n");
  write("sys/fs/cgroup/a/b/memory.max", "max\n");
  const MemoryLimit limit = read_memory_limit(files_);
  EXPECT_EQ(limit.bytes, kPhysical);
  EXPECT_EQ(limit.source, "physical memory");
}

TEST_F(MemoryLimitTest, V2InANamespaceSeesItsGroupAsRoot) {
  // In a cgroup namespace (Docker's and Kubernetes' default on v2) both files are
  // relative to the container's group.
  write_proc("0::/\n", mount_line(41, "/", "sys/fs/cgroup", true));
  write("sys/fs/cgroup/memory.max", "1073741824\n");
  EXPECT_EQ(read_memory_limit(files_).bytes, kGiB);
}

TEST_F(MemoryLimitTest, V2IsPreferredOverV1) {
  write_proc("4:memory:/g\n0::/g\n",
             mount_line(35, "/", "sys/fs/cgroup/memory", false) +
                 mount_line(41, "/", "sys/fs/cgroup/unified", true));
  write("sys/fs/cgroup/memory/g/memory.limit_in_bytes", "1073741824\n");
  write("sys/fs/cgroup/unified/g/memory.max", "2147483648\n");
  const MemoryLimit limit = read_memory_limit(files_);
  EXPECT_EQ(limit.bytes, 2 * kGiB);
  EXPECT_EQ(limit.source.rfind("cgroup v2 memory.max", 0), 0u) << limit.source;
}

TEST_F(MemoryLimitTest, HybridHostWithoutV2MemoryControllerUsesV1) {
  // The unified hierarchy is mounted, but the memory controller stays with v1: no
  // memory.max files there.
  write_proc("4:memory:/process_api/x\n0::/\n",
             mount_line(35, "/", "sys/fs/cgroup/memory", false) +
                 mount_line(41, "/", "sys/fs/cgroup/unified", true));
  write("sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n");
  write("sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes", "805306368\n");
  write("sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", kV1Unlimited);
  const MemoryLimit limit = read_memory_limit(files_);
  EXPECT_EQ(limit.bytes, 768 << 20);
  EXPECT_EQ(limit.source,
            "cgroup v1 memory.limit_in_bytes of " + path("sys/fs/cgroup/memory/process_api/x"));
}

TEST_F(MemoryLimitTest, LimitAbovePhysicalMemoryIsPhysicalMemory) {
  write_proc("0::/big\n", mount_line(41, "/", "sys/fs/cgroup", true));
  write("sys/fs/cgroup/big/memory.max", std::to_string(64 * kGiB) + "\n");
  const MemoryLimit limit = read_memory_limit(files_);
  EXPECT_EQ(limit.bytes, kPhysical);
  EXPECT_EQ(limit.source, "physical memory");
}

TEST_F(MemoryLimitTest, NoCgroupFilesIsPhysicalMemory) {
  EXPECT_EQ(read_memory_limit(files_).source, "physical memory");  // nothing written
  write_proc("4:memory:/gone\n", mount_line(35, "/", "sys/fs/cgroup/memory", false));
  EXPECT_EQ(read_memory_limit(files_).bytes, kPhysical);  // the group's files are missing
}

TEST_F(MemoryLimitTest, GroupOutsideTheMountsRootFallsBackToTheMountPoint) {
  // A process moved out of a namespace's root sees "/../sibling" in /proc/self/cgroup.
  write_proc("0::/../sibling\n", mount_line(41, "/ns", "sys/fs/cgroup", true));
  write("sys/fs/cgroup/memory.max", "1073741824\n");
  EXPECT_EQ(read_memory_limit(files_).bytes, kGiB);
}

TEST_F(MemoryLimitTest, MountPointsWithEscapedSpaces) {
  write_proc("0::/g\n", mount_line(41, "/", "cgroup\\040root", true));
  write("cgroup root/g/memory.max", "1073741824\n");
  EXPECT_EQ(read_memory_limit(files_).bytes, kGiB);
}

TEST(MemoryLimitValueTest, ParsesBytesAndRefusesTheRest) {
  EXPECT_EQ(parse_memory_limit_value("1073741824\n"), kGiB);
  EXPECT_EQ(parse_memory_limit_value("0"), 0);
  EXPECT_EQ(parse_memory_limit_value("max\n"), std::nullopt);
  EXPECT_EQ(parse_memory_limit_value(""), std::nullopt);
  EXPECT_EQ(parse_memory_limit_value("-1\n"), std::nullopt);
  EXPECT_EQ(parse_memory_limit_value("12k"), std::nullopt);
}

TEST(MemoryLimitRealTest, ThisProcessHasAPositiveLimitNamingItsSource) {
  const MemoryLimit limit = read_memory_limit();
  EXPECT_GT(limit.bytes, 0);
  EXPECT_FALSE(limit.source.empty());
}

TEST(ResidentMemoryTest, GrowsWhenPagesAreTouched) {
  const int64_t before = resident_memory_bytes();
  ASSERT_GT(before, 0);
  constexpr size_t kBytes = size_t{64} << 20;
  std::unique_ptr<char[]> touched(new char[kBytes]);
  std::memset(touched.get(), 1, kBytes);
  EXPECT_GE(resident_memory_bytes() - before, int64_t{kBytes} / 2);
  EXPECT_EQ(touched[kBytes - 1], 1);
}

}  // namespace
}  // namespace dserve
