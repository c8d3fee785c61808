#include "base/memory_limit.h"

#include <unistd.h>

#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

namespace dserve {
namespace {

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::ostringstream text;
  text << f.rdbuf();
  return text.str();
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

bool contains(const std::vector<std::string>& items, const std::string& item) {
  for (const std::string& i : items) {
    if (i == item) return true;
  }
  return false;
}

// The process's group in the unified (v2) hierarchy and in the v1 memory hierarchy,
// from /proc/self/cgroup's "hierarchy-id:controllers:path" lines.
struct ProcessGroups {
  std::optional<std::string> v2;
  std::optional<std::string> v1_memory;
};

ProcessGroups parse_proc_self_cgroup(const std::string& text) {
  ProcessGroups groups;
  for (const std::string& line : split(text, '\n')) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a);
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      groups.v2 = path;
    } else if (contains(split(controllers, ','), "memory")) {
      groups.v1_memory = path;
    }
  }
  return groups;
}

struct Mount {
  std::string root;         // the directory of the hierarchy mounted here
  std::string mount_point;  // where it is mounted
  std::string fstype;
  std::vector<std::string> super_options;
};

// mountinfo escapes space, tab, newline and backslash in paths as \ooo (octal).
std::string unescape_mount_path(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int value = 0;
      const char* digits = s.data() + i + 1;
      const std::from_chars_result r = std::from_chars(digits, digits + 3, value, 8);
      if (r.ec == std::errc() && r.ptr == digits + 3) {
        out += static_cast<char>(value);
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// "36 35 98:0 /root /mount/point rw,noatime master:1 - fstype source super,options":
// optional fields run up to the lone "-".
std::vector<Mount> parse_mountinfo(const std::string& text) {
  std::vector<Mount> mounts;
  for (const std::string& line : split(text, '\n')) {
    std::vector<std::string> fields;
    std::istringstream in(line);
    for (std::string f; in >> f;) fields.push_back(f);
    size_t dash = 6;
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (dash + 3 >= fields.size()) continue;  // not a full line
    mounts.push_back({unescape_mount_path(fields[3]), unescape_mount_path(fields[4]),
                      fields[dash + 1], split(fields[dash + 3], ',')});
  }
  return mounts;
}

// Whether `dir` is `root` or lies below it, component-wise ("/a" holds "/a/b", not "/ab").
bool is_within(const std::string& dir, const std::string& root) {
  if (root == "/") return true;
  return dir.compare(0, root.size(), root) == 0 &&
         (dir.size() == root.size() || dir[root.size()] == '/');
}

std::string strip_trailing_slash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// The directory of `group` among `mounts` of one hierarchy, and the mount point above
// which no limit of this process's can lie. A mount whose root holds the group is used
// (the deepest such root); where none does (a namespace that hides the group), the
// first mount point stands for the group.
struct GroupDir {
  std::string dir;
  std::string top;
};

std::optional<GroupDir> locate_group(const std::vector<const Mount*>& mounts,
                                     const std::string& group) {
  const Mount* best = nullptr;
  for (const Mount* m : mounts) {
    if (is_within(group, m->root) && (best == nullptr || m->root.size() > best->root.size())) {
      best = m;
    }
  }
  if (best == nullptr) {
    if (mounts.empty()) return std::nullopt;
    const std::string top = strip_trailing_slash(mounts.front()->mount_point);
    return GroupDir{top, top};
  }
  const std::string top = strip_trailing_slash(best->mount_point);
  const std::string below = best->root == "/" ? group : group.substr(best->root.size());
  return GroupDir{strip_trailing_slash(top + below), top};
}

// The smallest value of `file` in `dir` and every directory above it up to `top`.
std::optional<MemoryLimit> tightest_limit(const GroupDir& g, const std::string& file,
                                          const std::string& hierarchy) {
  std::optional<MemoryLimit> tightest;
  std::string dir = g.dir;
  while (true) {
    std::optional<std::string> text = read_text(dir + "/" + file);
    std::optional<int64_t> bytes = text ? parse_memory_limit_value(*text) : std::nullopt;
    if (bytes && (!tightest || *bytes < tightest->bytes)) {
      tightest = MemoryLimit{*bytes, hierarchy + " " + file + " of " + dir};
    }
    if (dir.size() <= g.top.size()) break;
    const size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos) break;
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
  return tightest;
}

std::optional<MemoryLimit> hierarchy_limit(const std::vector<Mount>& mounts,
                                           const std::optional<std::string>& group, bool v2) {
  if (!group) return std::nullopt;
  std::vector<const Mount*> hierarchy;
  for (const Mount& m : mounts) {
    const bool match = v2 ? m.fstype == "cgroup2"
                          : m.fstype == "cgroup" && contains(m.super_options, "memory");
    if (match) hierarchy.push_back(&m);
  }
  std::optional<GroupDir> g = locate_group(hierarchy, *group);
  if (!g) return std::nullopt;
  return v2 ? tightest_limit(*g, "memory.max", "cgroup v2")
            : tightest_limit(*g, "memory.limit_in_bytes", "cgroup v1");
}

int64_t physical_memory_bytes() {
  return int64_t{sysconf(_SC_PHYS_PAGES)} * int64_t{sysconf(_SC_PAGE_SIZE)};
}

}  // namespace

int64_t resident_memory_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // in kB
  }
  return 0;
}

std::optional<int64_t> parse_memory_limit_value(const std::string& text) {
  size_t end = text.size();
  while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == ' ')) --end;
  if (end == 0) return std::nullopt;
  int64_t value = 0;
  const std::from_chars_result r = std::from_chars(text.data(), text.data() + end, value);
  if (r.ec != std::errc() || r.ptr != text.data() + end || value < 0) return std::nullopt;
  return value;
}

MemoryLimit read_memory_limit(const MemoryLimitFiles& files) {
  const int64_t physical =
      files.physical_bytes > 0 ? files.physical_bytes : physical_memory_bytes();
  const MemoryLimit machine{physical, "physical memory"};
  std::optional<std::string> cgroup_text = read_text(files.proc_self_cgroup);
  std::optional<std::string> mountinfo_text = read_text(files.proc_self_mountinfo);
  if (!cgroup_text || !mountinfo_text) return machine;
  const ProcessGroups groups = parse_proc_self_cgroup(*cgroup_text);
  const std::vector<Mount> mounts = parse_mountinfo(*mountinfo_text);
  // v2 first: on a hybrid host the unified hierarchy may hold no memory controller (no
  // memory.max files), and then the v1 memory hierarchy holds the limit.
  for (bool v2 : {true, false}) {
    std::optional<MemoryLimit> limit =
        hierarchy_limit(mounts, v2 ? groups.v2 : groups.v1_memory, v2);
    if (limit && limit->bytes < physical) return *limit;
  }
  return machine;
}

}  // namespace dserve
