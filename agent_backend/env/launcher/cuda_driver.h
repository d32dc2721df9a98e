// The CUDA driver, reached through dlopen("libcuda.so.1") on first use, so that what includes
// this builds without CUDA headers or libraries and loads on machines without a GPU.
// Shared by the launcher (launcher.cpp) and the launch op (launch_op.cpp).
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace cuda_agent {

// The driver types and entry points used, as cuda.h declares them (stable ABI since CUDA 4).
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2;
constexpr int CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4;
constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;

// cuLaunchKernelEx's configuration, laid out as cuda.h's CUlaunchAttribute and CUlaunchConfig on
// 64-bit Linux; the sizes and offsets asserted below are checked against cuda.h by
// tests/test_compile_launcher.py.
struct LaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  union {
    char bytes[64];
    struct {
      unsigned x, y, z;
    } cluster_dim;
    int cooperative;
    void* align;
  } value;
};

struct LaunchConfig {
  unsigned grid_x, grid_y, grid_z;
  unsigned block_x, block_y, block_z;
  unsigned shared_mem;
  CUstream stream;
  LaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(LaunchAttribute) == 72 && offsetof(LaunchAttribute, value) == 8, "CUlaunchAttribute layout");
static_assert(sizeof(LaunchConfig) == 56 && offsetof(LaunchConfig, shared_mem) == 24 && offsetof(LaunchConfig, stream) == 32 &&
                  offsetof(LaunchConfig, attrs) == 40 && offsetof(LaunchConfig, num_attrs) == 48,
              "CUlaunchConfig layout");

struct Driver {
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuStreamIsCapturing)(CUstream, int*);  // CUstreamCaptureStatus, an enum the size of an int
  // Only cluster launches need these (CUDA 12+); nullptr where the driver lacks them.
  CUresult (*cuLaunchKernelEx)(const LaunchConfig*, CUfunction, void**, void**);
  CUresult (*cuOccupancyMaxActiveClusters)(int*, CUfunction, const LaunchConfig*);
};

template <typename F>
void bind_symbol(void* library, const char* name, F& out) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    throw std::runtime_error(std::string("the CUDA driver (libcuda.so.1) has no ") + name);
  }
  out = reinterpret_cast<F>(symbol);
}

inline Driver load_driver() {
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(std::string("cannot load the CUDA driver (libcuda.so.1): ") +
                             (why ? why : "not found") + "; is this a machine with an NVIDIA GPU?");
  }
  Driver d{};
  bind_symbol(library, "cuGetErrorString", d.cuGetErrorString);
  bind_symbol(library, "cuCtxGetCurrent", d.cuCtxGetCurrent);
  bind_symbol(library, "cuCtxSetCurrent", d.cuCtxSetCurrent);
  bind_symbol(library, "cuDeviceGet", d.cuDeviceGet);
  bind_symbol(library, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain);
  bind_symbol(library, "cuModuleLoadData", d.cuModuleLoadData);
  bind_symbol(library, "cuModuleGetFunction", d.cuModuleGetFunction);
  bind_symbol(library, "cuFuncSetAttribute", d.cuFuncSetAttribute);
  bind_symbol(library, "cuLaunchKernel", d.cuLaunchKernel);
  bind_symbol(library, "cuStreamIsCapturing", d.cuStreamIsCapturing);
  d.cuLaunchKernelEx = reinterpret_cast<decltype(d.cuLaunchKernelEx)>(dlsym(library, "cuLaunchKernelEx"));
  d.cuOccupancyMaxActiveClusters =
      reinterpret_cast<decltype(d.cuOccupancyMaxActiveClusters)>(dlsym(library, "cuOccupancyMaxActiveClusters"));
  return d;
}

// Loaded on first use; a failed load throws and is tried again on the next call.
inline const Driver& driver() {
  static const Driver d = load_driver();
  return d;
}

inline void check(CUresult status, const std::string& call) {
  if (status == CUDA_SUCCESS) return;
  const char* text = nullptr;
  if (driver().cuGetErrorString(status, &text) != CUDA_SUCCESS || text == nullptr) text = "unknown error";
  throw std::runtime_error(call + " failed: " + text + " (CUDA error " + std::to_string(status) + ")");
}

// Modules load into the calling thread's context: torch's, once it has touched the GPU.
// Otherwise take the device's primary context, the one torch uses too.
inline void ensure_context(const Driver& d, int device) {
  CUcontext context = nullptr;
  check(d.cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  if (context != nullptr) return;
  CUdevice handle = 0;
  check(d.cuDeviceGet(&handle, device), "cuDeviceGet");
  check(d.cuDevicePrimaryCtxRetain(&context, handle), "cuDevicePrimaryCtxRetain");
  check(d.cuCtxSetCurrent(context), "cuCtxSetCurrent");
}

// The kernel `name` of a loaded module (std::invalid_argument when it has none by that name).
inline CUfunction get_function(CUmodule module, const std::string& name) {
  CUfunction function = nullptr;
  CUresult status = driver().cuModuleGetFunction(&function, module, name.c_str());
  if (status == CUDA_ERROR_NOT_FOUND) {
    throw std::invalid_argument("no kernel named '" + name +
                                "' in the compiled module; declare it extern \"C\" __global__");
  }
  check(status, "cuModuleGetFunction('" + name + "')");
  return function;
}

// One kernel argument, stored where cuLaunchKernel reads it through kernelParams.
union ArgValue {
  void* ptr;
  int32_t i32;
  int64_t i64;
  float f32;
  double f64;
};

}  // namespace cuda_agent
