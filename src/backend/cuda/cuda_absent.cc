// The CUDA backend's entry points in a binary built without it (no nvcc at build time,
// or DSERVE_CUDA=OFF): --device cuda then fails with the reason.
#include "backend/backend_registry.h"

namespace dserve {

bool cuda_backend_built() { return false; }
int cuda_device_count() { return 0; }

Result<std::unique_ptr<Backend>> make_cuda_backend(int gpu) {
  (void)gpu;
  return unimplemented(
                "--device cuda: this dserve was built without the CUDA backend (no nvcc was "
                "found at build time; install the CUDA toolkit and rebuild)");
}

}  // namespace dserve
