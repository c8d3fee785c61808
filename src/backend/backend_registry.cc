#include "backend/backend_registry.h"

#include <cstdlib>

namespace dserve {

std::string backend_devices_text() {
  if (!cuda_backend_built()) return "cpu (this binary was built without the CUDA backend)";
  const int n = cuda_device_count();
  return "cpu, cuda (" + std::to_string(n) + (n == 1 ? " GPU" : " GPUs") + " found)";
}

Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options) {
  std::string device = options.device;
  if (device.empty()) {
    const char* env = std::getenv("DSERVE_DEVICE");
    device = env != nullptr && *env != '\0' ? env : cuda_device_count() > 0 ? "cuda" : "cpu";
  }
  if (device == "cpu") return make_cpu_backend(options.cpu);
  if (device == "cuda") return make_cuda_backend(options.gpu);
  return invalid_argument("device '" + device + "' (--device or $DSERVE_DEVICE): one of " +
                          backend_devices_text());
}

}  // namespace dserve
