// Choosing a backend for a process: --device cpu|cuda, or the default (the GPU where
// this binary has the CUDA backend and the machine has a GPU, else the CPU).
//
// Thread-safety: make_backend may be called from any thread; the backend it returns
// is driven by one thread (backend.h).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "base/status.h"

namespace dserve {

struct BackendOptions {
  // "cpu", "cuda", or empty: $DSERVE_DEVICE when set (so that a test suite runs every
  // process it starts on one device), else cuda where cuda_device_count() > 0, else cpu.
  std::string device;
  CpuBackendOptions cpu;  // the CPU backend's options (its threads also serve the host work)
  int gpu = 0;            // which GPU, for cuda
};

// One line for the start-up log and errors: what --device accepts on this build.
std::string backend_devices_text();

// InvalidArgument for an unknown device; Unimplemented where cuda is asked for and this
// binary was built without it or the machine has no usable GPU (the CUDA runtime's own
// reason in the message).
Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options);

// The CUDA backend (backend/cuda/): whether this binary has it, how many GPUs the
// driver reports (0 without a driver, a GPU, or the backend), and the backend itself.
bool cuda_backend_built();
int cuda_device_count();
Result<std::unique_ptr<Backend>> make_cuda_backend(int gpu);

}  // namespace dserve
