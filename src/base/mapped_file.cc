#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace dserve {

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = path + ": " + std::strerror(err);
    return err == ENOENT ? not_found(msg) : io_error(msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return io_error(path + ": " + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": is a directory, expected a file");
  }
  size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return io_error(path + ": mmap failed: " + std::strerror(err));
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::advise_huge_pages() const {
#ifdef MADV_HUGEPAGE
  if (data_ != nullptr) madvise(const_cast<uint8_t*>(data_), size_, MADV_HUGEPAGE);
#endif
}

size_t MappedFile::release(const void* p, size_t n) const {
  const auto begin = reinterpret_cast<uintptr_t>(p), map = reinterpret_cast<uintptr_t>(data_);
  if (data_ == nullptr || begin < map || n > size_ || begin - map > size_ - n) return 0;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t end = (begin + n) / page * page;
  if (end <= first) return 0;
  // A private, read-only file map: its pages are never dirty, so dropping them loses
  // nothing.
  if (madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED) != 0) return 0;
  return end - first;
}

void* alloc_huge(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  constexpr size_t kPage = size_t{4} << 10;
  // Rounded to whole pages only: a huge page is advised over the whole 2 MiB spans
  // alone, since with transparent huge pages the first touch of a span makes all of it
  // resident, and a small buffer padded to 2 MiB (a norm's weight, a small model's
  // packed matrix) would take 2 MiB of memory instead of its size.
  const size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  const size_t huge_span = rounded / kHuge * kHuge;
  void* p = nullptr;
  if (posix_memalign(&p, huge_span > 0 ? kHuge : kPage, rounded) != 0) return nullptr;
#ifdef MADV_HUGEPAGE
  if (huge_span > 0) madvise(p, huge_span, MADV_HUGEPAGE);
#endif
  return p;
}

void free_huge(void* p, size_t) { free(p); }

}  // namespace dserve
