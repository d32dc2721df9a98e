// The launch op: a kernel described as data (launch_spec.py) run from C++, so that a winner
// costs what its kernel costs. cuda_agent::launch(key, program, inputs) looks the spec up by
// key, checks the inputs against it, allocates the outputs (and any scratch workspace a kernel
// takes) through torch's caching allocator, keeps a kernel's counters (memory zeroed once, one
// buffer a stream, that each launch leaves zeroed; a CUDA graph zeroes its own on every replay), and
// launches the first kernel whose alignment the
// inputs meet (in thread-block clusters, or as a cooperative grid, where its spec says so,
// through cuLaunchKernelEx) on torch's current stream of the inputs' device, so that it can be
// captured in a CUDA graph. A Meta kernel gives the
// outputs' shapes and strides to tracing (FakeTensorMode, Inductor).
//
// The op's schemas are defined from Python (launch_op.py), with a default kernel for a process
// that has not loaded this library yet: `launch` takes the inputs as a list, `launch.in<N>` as
// N separate tensors (what compiled graphs call: torch.ops parses those faster from Python).
// Specs are registered from Python (register_spec). A key with no spec goes to
// cuda_agent::run_winner with the subgraph's `program`: it finds the winner in the kernel cache
// (registering its spec, so the next call stays here) or runs the program.
//
// torch's current stream comes from the AOTInductor C shim (aoti_torch_get_current_cuda_stream,
// looked up at run time in libtorch_cuda) and the driver through cuda_driver.h, so this source
// builds against a CPU-only torch as well.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_driver.h"

namespace py = pybind11;
using namespace cuda_agent;

namespace {

constexpr size_t kMaxArgs = 256;
constexpr size_t kMaxDevices = 128;  // c10::DeviceIndex is an int8_t

enum class ArgKind : uint8_t { Input, Output, Constant, Workspace, Counters };

// A kernel's counters on one stream of one device (a barrier's, which its last user resets).
struct Counters {
  c10::DeviceIndex device;
  CUstream stream;
  at::Tensor memory;
};

struct Layout {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};

struct Kernel {
  std::string image;  // the CUBIN
  std::string name;
  std::array<unsigned, 3> grid{}, block{};
  std::array<unsigned, 3> cluster{1, 1, 1};  // blocks per thread-block cluster; all 1: a plain launch
  bool cooperative = false;                  // all blocks resident at once (grid.sync() in the kernel)
  bool persistent = false;  // clusters looping over their work: no more launched than can be resident at once
  unsigned shared_mem = 0;
  std::vector<ArgKind> kinds;
  std::vector<int64_t> indices;     // of the input or output, for pointer arguments
  std::vector<ArgValue> constants;  // the value, for constants; the bytes, for a workspace or counters
  std::vector<int64_t> alignment;   // per input, bytes; empty: none required
  std::array<std::atomic<CUfunction>, kMaxDevices> functions{};  // loaded on first use per device
  std::array<unsigned, kMaxDevices> grid_x{};  // blocks launched along x per device, set with its function
  // Its counters argument's memory: one buffer for each stream it is launched on (launches on one
  // stream never overlap, on two they may); never freed, a launch may still be queued.
  std::mutex counters_mutex;
  std::vector<Counters> counters;
};

struct Spec {
  std::string digest;
  std::vector<Layout> inputs, outputs;
  std::vector<std::unique_ptr<Kernel>> kernels;
  std::atomic<uint64_t> launches{0};
};

std::mutex table_mutex;   // guards the table
std::mutex loading_mutex; // one module load at a time

// Never destroyed: a launch may still run while the interpreter shuts down.
std::unordered_map<std::string, std::shared_ptr<Spec>>& table() {
  static auto* specs = new std::unordered_map<std::string, std::shared_ptr<Spec>>();
  return *specs;
}

std::shared_ptr<Spec> find(c10::string_view key) {
  std::lock_guard<std::mutex> lock(table_mutex);
  auto found = table().find(std::string(key));
  return found == table().end() ? nullptr : found->second;
}

// ----------------------------------------------------------------------------- the device side

using GetCurrentStream = int32_t (*)(int32_t, void**);

// torch's current stream of a device, through the AOTInductor C shim in libtorch_cuda: a stable
// C function, loaded with torch's CUDA build, absent from a CPU-only one.
void* current_stream(c10::DeviceIndex device) {
  static const GetCurrentStream get = [] {
    void* symbol = nullptr;
    if (void* library = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD)) {
      symbol = dlsym(library, "aoti_torch_get_current_cuda_stream");
    }
    if (symbol == nullptr) symbol = dlsym(RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream");
    TORCH_CHECK(symbol != nullptr, "cuda_agent::launch: this torch has no CUDA (no aoti_torch_get_current_cuda_stream)");
    return reinterpret_cast<GetCurrentStream>(symbol);
  }();
  void* stream = nullptr;
  TORCH_CHECK(get(device, &stream) == 0, "cuda_agent::launch: cannot get the current CUDA stream of device ",
              static_cast<int>(device));
  return stream;
}

bool clustered(const Kernel& kernel) { return kernel.cluster != std::array<unsigned, 3>{1, 1, 1}; }

// A persistent kernel's blocks along x on this device: as many whole clusters as can be resident at
// once, at most the grid's (on an H200, 15 clusters of 8 blocks that each fill an SM; a 16th would
// start only when one of those ended).
unsigned resident_grid_x(const Kernel& kernel, CUfunction function) {
  const Driver& d = driver();
  TORCH_CHECK(d.cuOccupancyMaxActiveClusters != nullptr,
              "cuda_agent::launch: this CUDA driver has no cuOccupancyMaxActiveClusters (CUDA 12 or later)");
  LaunchAttribute attribute{};
  attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attribute.value.cluster_dim = {kernel.cluster[0], kernel.cluster[1], kernel.cluster[2]};
  const LaunchConfig config{kernel.grid[0],  kernel.grid[1],     kernel.grid[2], kernel.block[0], kernel.block[1],
                            kernel.block[2], kernel.shared_mem, nullptr,        &attribute,      1};
  int clusters = 0;
  check(d.cuOccupancyMaxActiveClusters(&clusters, function, &config),
        "cuOccupancyMaxActiveClusters('" + kernel.name + "')");
  TORCH_CHECK(clusters > 0, "cuda_agent::launch: no cluster of '", kernel.name, "' fits on this GPU");
  return std::min(kernel.grid[0], static_cast<unsigned>(clusters) * kernel.cluster[0]);  // a grid along x only
}

// The kernel's function in `device`'s context (the current one), loaded on first use there.
CUfunction function_on(Kernel& kernel, c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && static_cast<size_t>(device) < kMaxDevices, "bad CUDA device index ", static_cast<int>(device));
  CUfunction function = kernel.functions[device].load(std::memory_order_acquire);
  if (function != nullptr) return function;
  std::lock_guard<std::mutex> lock(loading_mutex);
  function = kernel.functions[device].load(std::memory_order_acquire);
  if (function != nullptr) return function;
  const Driver& d = driver();
  ensure_context(d, device);
  CUmodule module = nullptr;
  check(d.cuModuleLoadData(&module, kernel.image.data()), "cuModuleLoadData('" + kernel.name + "')");
  function = get_function(module, kernel.name);
  // Raised for any dynamic shared memory: by default a kernel may take 48 KB less its static shared
  // memory, so even 48 KB exactly would be refused (as "too many blocks" where cooperative).
  if (kernel.shared_mem > 0) {
    check(d.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                               static_cast<int>(kernel.shared_mem)),
          "cuFuncSetAttribute(max dynamic shared memory = " + std::to_string(kernel.shared_mem) + ")");
  }
  kernel.grid_x[device] = kernel.persistent ? resident_grid_x(kernel, function) : kernel.grid[0];
  kernel.functions[device].store(function, std::memory_order_release);  // publishes grid_x too
  return function;
}

// ----------------------------------------------------------------------------- the op

bool same_strides(const at::Tensor& t, const Layout& layout) {
  // A size-1 dim's stride never addresses anything: any value is the same layout.
  const auto strides = t.strides();
  for (size_t d = 0; d < layout.sizes.size(); ++d) {
    if (layout.sizes[d] != 1 && strides[d] != layout.strides[d]) return false;
  }
  return true;
}

// "[2, 3]", with no stream: on the H100 machine (torch 2.11's wheel, this built with its g++ 13)
// formatting a refusal with c10::str (an ostream, torch's printers) ended the process (SIGSEGV).
std::string text_of(c10::IntArrayRef values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

std::string text_of(const at::Tensor& t) {
  const std::string device = t.is_cuda() ? "cuda:" + std::to_string(t.get_device()) : t.is_cpu() ? "cpu" : "non-CUDA";
  return device + " " + text_of(t.sizes()) + " " + text_of(t.strides()) + " " + c10::toString(t.scalar_type());
}

// Why the inputs fall outside the spec ("" where they do not), without throwing: the direct call
// from Python raises it as a Python error (launch_direct), the op as a C++ one.
std::string input_problem(const Spec& spec, at::TensorList inputs, c10::DeviceType device_type) {
  if (inputs.size() != spec.inputs.size()) {
    return "cuda_agent::launch: the kernel takes " + std::to_string(spec.inputs.size()) + " inputs, got " +
           std::to_string(inputs.size());
  }
  const c10::Device device = inputs[0].device();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    const Layout& want = spec.inputs[i];
    const bool ok = t.device().type() == device_type && t.device() == device && t.scalar_type() == want.dtype &&
                    t.sizes() == c10::IntArrayRef(want.sizes) && same_strides(t, want);
    if (!ok) {
      return "input " + std::to_string(i) + ": this kernel is specialised to CUDA tensors (all on one device) of " +
             "shape " + text_of(want.sizes) + ", stride " + text_of(want.strides) + ", dtype " +
             c10::toString(want.dtype) + "; got " + text_of(t);
    }
  }
  return "";
}

void check_inputs(const Spec& spec, at::TensorList inputs, c10::DeviceType device_type) {
  const std::string problem = input_problem(spec, inputs, device_type);
  TORCH_CHECK_VALUE(problem.empty(), problem);
}

template <class Empty>
std::vector<at::Tensor> allocate_outputs(const Spec& spec, Empty empty) {
  std::vector<at::Tensor> outputs;
  outputs.reserve(spec.outputs.size());
  for (const Layout& layout : spec.outputs) outputs.push_back(empty(layout));
  return outputs;
}

// The allocator at::empty_strided takes for CUDA tensors, found once from a tensor it made:
// torch's caching allocator, or a pluggable one set by torch.cuda.memory.change_current_allocator,
// which c10::GetAllocator(kCUDA) does not follow (and the caching allocator it keeps is then
// never initialised).
c10::Allocator* cuda_allocator(c10::Device device) {
  static c10::Allocator* const allocator = [device] {
    c10::Allocator* found = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device)).storage().allocator();
    TORCH_CHECK(found != nullptr, "cuda_agent::launch: CUDA tensors come from no allocator");
    return found;
  }();
  return allocator;
}

// What at::empty_strided does for a CUDA device, less its dispatch (about 1 us a call on an
// H100's host): `allocator` (cuda_allocator) allocates on the current device, from a CUDA graph's
// private pool while the current stream is capturing.
at::Tensor empty_cuda(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype,
                      c10::Allocator* allocator) {
  return at::detail::empty_strided_generic(sizes, strides, allocator, c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                           dtype);
}

// The inputs' device made current for the call (the allocator and the driver work on the current
// one), with no guard where it already is: a guard costs two device queries more.
class CurrentDevice {
 public:
  explicit CurrentDevice(c10::Device device) {
    const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
    if (impl->getDevice() != device) guard_.emplace(device);
  }

 private:
  std::optional<c10::DeviceGuard> guard_;
};

// The first kernel of the spec whose alignment the inputs meet, or null.
Kernel* choose_kernel(const Spec& spec, at::TensorList inputs) {
  for (const auto& kernel : spec.kernels) {
    bool aligned = true;
    for (size_t i = 0; aligned && i < kernel->alignment.size(); ++i) {
      aligned = reinterpret_cast<uintptr_t>(inputs[i].const_data_ptr()) % kernel->alignment[i] == 0;
    }
    if (aligned) return kernel.get();
  }
  return nullptr;
}

void launch(const Kernel& kernel, unsigned grid_x, CUfunction function, CUstream stream, void** params) {
  const Driver& d = driver();
  CUresult status;
  if (!clustered(kernel) && !kernel.cooperative) {
    status = d.cuLaunchKernel(function, grid_x, kernel.grid[1], kernel.grid[2], kernel.block[0],
                              kernel.block[1], kernel.block[2], kernel.shared_mem, stream, params, nullptr);
  } else {
    TORCH_CHECK(d.cuLaunchKernelEx != nullptr, "cuda_agent::launch: this CUDA driver has no cuLaunchKernelEx: "
                "cluster and cooperative launches need CUDA 12 or later");
    LaunchAttribute attributes[2]{};
    unsigned count = 0;
    if (clustered(kernel)) {
      attributes[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attributes[count++].value.cluster_dim = {kernel.cluster[0], kernel.cluster[1], kernel.cluster[2]};
    }
    if (kernel.cooperative) {
      attributes[count].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attributes[count++].value.cooperative = 1;
    }
    const LaunchConfig config{grid_x,          kernel.grid[1],     kernel.grid[2], kernel.block[0], kernel.block[1],
                              kernel.block[2], kernel.shared_mem, stream,         attributes,      count};
    status = d.cuLaunchKernelEx(&config, function, params, nullptr);
  }
  // the message only where it is needed: building it costs every call
  if (status != CUDA_SUCCESS) check(status, "launching '" + kernel.name + "'");
}

// The kernel's counters for a launch on `stream`: those it already has there, else `bytes` new ones
// zeroed on that stream ahead of the launch (on torch's current stream: the launch's). A launch being
// captured into a CUDA graph takes new ones, allocated as a workspace is (the graph's pool; freed into
// `workspaces` when the op returns) and zeroed by a fill the graph captures too, so every replay zeroes
// its own, and graphs replayed at once, or a graph's pool handing the memory on, never share a count.
void* counters_for(Kernel& kernel, int64_t bytes, c10::DeviceIndex device, CUstream stream,
                   c10::Allocator* allocator, std::vector<at::Tensor>& workspaces) {
  int capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    workspaces.push_back(empty_cuda({bytes}, {1}, at::kByte, allocator));
    return workspaces.back().zero_().mutable_data_ptr();
  }
  std::lock_guard<std::mutex> lock(kernel.counters_mutex);
  for (Counters& held : kernel.counters) {
    if (held.device == device && held.stream == stream) return held.memory.mutable_data_ptr();
  }
  at::Tensor memory = empty_cuda({bytes}, {1}, at::kByte, allocator);
  memory.zero_();
  kernel.counters.push_back(Counters{device, stream, memory});
  return memory.mutable_data_ptr();
}

// A key with no spec here: cuda_agent::run_winner finds its winner or runs the program.
std::vector<at::Tensor> run_winner(c10::string_view key, c10::string_view program, at::TensorList inputs) {
  TORCH_CHECK(!program.empty(), "cuda_agent::launch: no launch spec is registered under '", key, "'");
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("cuda_agent::run_winner", "");
  torch::jit::Stack stack;
  stack.emplace_back(std::string(key));
  stack.emplace_back(std::string(program));
  stack.emplace_back(inputs.vec());
  op.callBoxed(&stack);
  return stack.back().toTensorVector();
}

// Launches the spec's kernel on `inputs` into new `outputs`, or says why not (the inputs outside
// the spec, no kernel for their alignment) without throwing.
std::string launch_spec(Spec& spec, at::TensorList inputs, std::vector<at::Tensor>& outputs) {
  std::string problem = input_problem(spec, inputs, c10::DeviceType::CUDA);
  if (!problem.empty()) return problem;
  Kernel* const chosen = choose_kernel(spec, inputs);
  if (chosen == nullptr) return "cuda_agent::launch: no kernel of the spec accepts the inputs' alignment";
  Kernel& kernel = *chosen;
  const c10::Device device = inputs[0].device();
  const CurrentDevice current(device);
  c10::Allocator* allocator = cuda_allocator(device);
  outputs = allocate_outputs(spec, [allocator](const Layout& layout) {
    return empty_cuda(layout.sizes, layout.strides, layout.dtype, allocator);
  });
  const CUfunction function = function_on(kernel, device.index());
  const auto stream = static_cast<CUstream>(current_stream(device.index()));
  const size_t count = kernel.kinds.size();
  ArgValue values[kMaxArgs];
  void* params[kMaxArgs];
  // Scratch memory, uninitialised: freed when the op returns, and reused only by work queued
  // after the kernel on this stream (the caching allocator's rule), so never while it runs.
  std::vector<at::Tensor> workspaces;
  for (size_t a = 0; a < count; ++a) {
    switch (kernel.kinds[a]) {
      // const_data_ptr: an input is only read, so a copy-on-write input is not copied first
      case ArgKind::Input: values[a].ptr = const_cast<void*>(inputs[kernel.indices[a]].const_data_ptr()); break;
      case ArgKind::Output: values[a].ptr = outputs[kernel.indices[a]].mutable_data_ptr(); break;
      case ArgKind::Constant: values[a] = kernel.constants[a]; break;
      case ArgKind::Workspace:
        workspaces.push_back(empty_cuda({kernel.constants[a].i64}, {1}, at::kByte, allocator));
        values[a].ptr = workspaces.back().mutable_data_ptr();
        break;
      case ArgKind::Counters:
        values[a].ptr = counters_for(kernel, kernel.constants[a].i64, device.index(), stream, allocator, workspaces);
        break;
    }
    params[a] = &values[a];
  }
  launch(kernel, kernel.grid_x[device.index()], function, stream, params);
  spec.launches.fetch_add(1, std::memory_order_relaxed);
  return "";
}

// The outputs of `key`'s spec launched on `inputs` (or, for a key with no spec, run_winner's), or
// why the inputs are refused: what the op and the direct call both do.
std::string launch_key(c10::string_view key, c10::string_view program, at::TensorList inputs,
                       std::vector<at::Tensor>& outputs) {
  const std::shared_ptr<Spec> spec = find(key);
  if (spec != nullptr) return launch_spec(*spec, inputs, outputs);
  outputs = run_winner(key, program, inputs);
  return "";
}

std::vector<at::Tensor> launch_cuda(c10::string_view key, c10::string_view program, at::TensorList inputs) {
  std::vector<at::Tensor> outputs;
  const std::string problem = launch_key(key, program, inputs, outputs);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  return outputs;
}

std::vector<at::Tensor> launch_meta(c10::string_view key, c10::string_view /*program*/, at::TensorList inputs) {
  const std::shared_ptr<Spec> spec = find(key);
  TORCH_CHECK(spec != nullptr, "cuda_agent::launch: no launch spec is registered under '", key, "'");
  check_inputs(*spec, inputs, c10::DeviceType::Meta);
  const c10::Device device = inputs[0].device();
  return allocate_outputs(*spec, [device](const Layout& layout) {
    return at::empty_strided(layout.sizes, layout.strides, at::TensorOptions().dtype(layout.dtype).device(device));
  });
}

// The overloads taking the inputs one by one: a Tensor[] costs a call from Python about 0.5 us
// more to parse (measured on the 2-core build machine's CPU).
constexpr size_t kMostPositionalInputs = 8;  // launch.in1 .. launch.in8, as launch_op.py defines them

using LaunchFunction = std::vector<at::Tensor> (*)(c10::string_view, c10::string_view, at::TensorList);

template <size_t, class T>
using Each = T;

template <LaunchFunction Launch, size_t... I>
std::vector<at::Tensor> positional(c10::string_view key, c10::string_view program,
                                   Each<I, const at::Tensor&>... inputs) {
  const std::array<at::Tensor, sizeof...(I)> list{inputs...};
  return Launch(key, program, list);
}

template <LaunchFunction Launch, size_t... I>
void impl_positional(torch::Library& m, std::index_sequence<I...>) {
  m.impl(("launch.in" + std::to_string(sizeof...(I))).c_str(), &positional<Launch, I...>);
}

// launch, and launch.in1 .. launch.in<kMostPositionalInputs>, all by `Launch`
template <LaunchFunction Launch, size_t... N>
void impl_all(torch::Library& m, std::index_sequence<N...>) {
  m.impl("launch", Launch);
  (impl_positional<Launch>(m, std::make_index_sequence<N + 1>{}), ...);
}

// launch_cuda called from Python with no dispatcher in between: what a compiled graph's wrapper
// calls (launch_lowering.py). torch.ops' path from Python (argument parsing against the schema,
// the boxed call, the autograd fallback) cost about 3 us of the op's 12 us a call on an H100's
// host. Written against Python's C API (a fast call: no argument tuple, no casters); a refused
// input is raised as a Python error with no C++ exception in between.
// args: key, program, then the inputs one by one or as one list.
PyObject* launch_direct(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  const auto fail = [](PyObject* type, const std::string& why) -> PyObject* {
    PyErr_SetString(type, why.c_str());
    return nullptr;
  };
  if (nargs < 3) return fail(PyExc_TypeError, "cuda_agent launch: takes (key, program, *inputs)");
  Py_ssize_t key_size = 0, program_size = 0;
  const char* key = PyUnicode_Check(args[0]) ? PyUnicode_AsUTF8AndSize(args[0], &key_size) : nullptr;
  const char* program = PyUnicode_Check(args[1]) ? PyUnicode_AsUTF8AndSize(args[1], &program_size) : nullptr;
  if (key == nullptr || program == nullptr) {
    return fail(PyExc_TypeError, "cuda_agent launch: the key and the program are strings");
  }
  const bool listed = nargs == 3 && PyList_Check(args[2]);
  PyObject* const* items = listed ? PySequence_Fast_ITEMS(args[2]) : args + 2;
  const Py_ssize_t count = listed ? PyList_GET_SIZE(args[2]) : nargs - 2;
  if (count == 0) return fail(PyExc_ValueError, "cuda_agent launch: no inputs");
  std::vector<at::Tensor> inputs;
  inputs.reserve(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!THPVariable_Check(items[i])) {
      return fail(PyExc_TypeError, "cuda_agent launch: input " + std::to_string(i) + " is not a tensor");
    }
    inputs.push_back(THPVariable_Unpack(items[i]));
  }
  HANDLE_TH_ERRORS
  std::vector<at::Tensor> outputs;
  const std::string problem = launch_key(c10::string_view(key, static_cast<size_t>(key_size)),
                                         c10::string_view(program, static_cast<size_t>(program_size)), inputs, outputs);
  if (!problem.empty()) return fail(PyExc_ValueError, problem);
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(outputs.size()));
  for (size_t i = 0; list != nullptr && i < outputs.size(); ++i) {
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), THPVariable_Wrap(outputs[i]));
  }
  return list;
  END_HANDLE_TH_ERRORS
}

PyMethodDef launch_direct_def = {
    "launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&launch_direct)), METH_FASTCALL,
    "launch(key, program, *inputs) -> outputs: the op's CUDA kernel with no dispatcher in between (the inputs "
    "one by one, or as one list)."};

// ----------------------------------------------------------------------------- registration

using LayoutData = std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::string>;
using ArgData = std::pair<std::string, py::object>;
using KernelData = std::tuple<py::bytes, std::string, std::array<int64_t, 3>, std::array<int64_t, 3>, int64_t,
                              std::vector<ArgData>, std::vector<int64_t>, std::array<int64_t, 3>, bool, bool>;

[[noreturn]] void refuse(const std::string& why) { throw std::invalid_argument("launch spec: " + why); }

at::ScalarType dtype_of(const std::string& name) {
  static const std::unordered_map<std::string, at::ScalarType> dtypes = {
      {"float32", at::kFloat}, {"float16", at::kHalf},  {"bfloat16", at::kBFloat16}, {"float64", at::kDouble},
      {"bool", at::kBool},     {"int8", at::kChar},     {"uint8", at::kByte},        {"int16", at::kShort},
      {"int32", at::kInt},     {"int64", at::kLong}};
  auto found = dtypes.find(name);
  if (found == dtypes.end()) refuse("unknown dtype '" + name + "'");
  return found->second;
}

std::vector<Layout> layouts_of(const std::vector<LayoutData>& data) {
  std::vector<Layout> layouts;
  for (const auto& [sizes, strides, dtype] : data) {
    if (sizes.size() != strides.size()) refuse("a tensor's shape and stride differ in length");
    layouts.push_back(Layout{sizes, strides, dtype_of(dtype)});
  }
  return layouts;
}

unsigned to_unsigned(int64_t value, const char* what) {
  if (value < 0 || value > std::numeric_limits<unsigned>::max()) refuse(std::string(what) + " out of range");
  return static_cast<unsigned>(value);
}

std::unique_ptr<Kernel> kernel_of(const KernelData& data, size_t n_inputs, size_t n_outputs) {
  const auto& [image, name, grid, block, shared_mem, args, alignment, cluster, cooperative, persistent] = data;
  auto kernel = std::make_unique<Kernel>();
  kernel->image = std::string(image);
  kernel->name = name;
  for (int d = 0; d < 3; ++d) {
    if (grid[d] < 1 || block[d] < 1 || cluster[d] < 1) refuse("grid, block and cluster sizes must be at least 1");
    kernel->grid[d] = to_unsigned(grid[d], "grid size");
    kernel->block[d] = to_unsigned(block[d], "block size");
    kernel->cluster[d] = to_unsigned(cluster[d], "cluster size");
    if (grid[d] % cluster[d] != 0) refuse("the grid must be a whole number of clusters in each dimension");
  }
  kernel->shared_mem = to_unsigned(shared_mem, "shared_mem");
  kernel->cooperative = cooperative;
  kernel->persistent = persistent;
  if (persistent && (!clustered(*kernel) || cooperative || grid[1] != 1 || grid[2] != 1)) {
    refuse("a persistent launch is one of clusters along x, not cooperative");
  }
  if (args.size() > kMaxArgs) refuse("a kernel takes at most " + std::to_string(kMaxArgs) + " arguments");
  if (!alignment.empty() && alignment.size() != n_inputs) refuse("alignment must name every input");
  for (int64_t a : alignment) {
    if (a < 1) refuse("alignment must be positive");
  }
  kernel->alignment = alignment;
  for (const auto& [kind, value] : args) {
    ArgValue constant{};
    int64_t index = -1;
    ArgKind arg_kind = ArgKind::Constant;
    if (kind == "input" || kind == "output") {
      arg_kind = kind == "input" ? ArgKind::Input : ArgKind::Output;
      index = value.cast<int64_t>();
      if (index < 0 || static_cast<size_t>(index) >= (kind == "input" ? n_inputs : n_outputs)) {
        refuse(kind + " " + std::to_string(index) + " does not exist");
      }
    } else if (kind == "i32") {
      const int64_t v = value.cast<int64_t>();
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) refuse("i32 out of range");
      constant.i32 = static_cast<int32_t>(v);
    } else if (kind == "i64") {
      constant.i64 = value.cast<int64_t>();
    } else if (kind == "f32") {
      constant.f32 = static_cast<float>(value.cast<double>());
    } else if (kind == "f64") {
      constant.f64 = value.cast<double>();
    } else if (kind == "workspace" || kind == "counters") {
      arg_kind = kind == "workspace" ? ArgKind::Workspace : ArgKind::Counters;
      constant.i64 = value.cast<int64_t>();
      if (constant.i64 < 1) {
        refuse(kind == "workspace" ? "a workspace takes at least one byte" : "counters take at least one byte");
      }
      if (arg_kind == ArgKind::Counters && std::count(kernel->kinds.begin(), kernel->kinds.end(), arg_kind)) {
        refuse("a kernel takes at most one counters argument");
      }
    } else {
      refuse("unknown argument kind '" + kind + "'");
    }
    kernel->kinds.push_back(arg_kind);
    kernel->indices.push_back(index);
    kernel->constants.push_back(constant);
  }
  return kernel;
}

// Registers a spec under `key`, loading its kernels on CUDA device `device` now (a load failure
// shows at registration, and a CUDA graph capture never has to load a module); other devices,
// and every device where `device` is -1, load on first use. A key keeps the spec it was first
// given: registering another digest is an error.
void register_spec(const std::string& key, const std::string& digest, int64_t device,
                   const std::vector<LayoutData>& inputs, const std::vector<LayoutData>& outputs,
                   const std::vector<KernelData>& kernels) {
  std::shared_ptr<Spec> spec = find(key);
  if (spec != nullptr && spec->digest != digest) refuse("'" + key + "' already names another spec");
  if (spec == nullptr) {
    if (inputs.empty() || outputs.empty() || kernels.empty()) refuse("needs inputs, outputs and kernels");
    spec = std::make_shared<Spec>();
    spec->digest = digest;
    spec->inputs = layouts_of(inputs);
    spec->outputs = layouts_of(outputs);
    for (const KernelData& data : kernels) spec->kernels.push_back(kernel_of(data, inputs.size(), outputs.size()));
  }
  if (device >= 0) {
    const c10::Device cuda(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    c10::DeviceGuard guard(cuda);
    for (auto& kernel : spec->kernels) function_on(*kernel, cuda.index());
  }
  std::lock_guard<std::mutex> lock(table_mutex);
  auto [entry, added] = table().emplace(key, spec);
  if (!added && entry->second->digest != digest) refuse("'" + key + "' already names another spec");
}

// Launches made under `key` so far (-1: none registered).
int64_t launch_count(const std::string& key) {
  const std::shared_ptr<Spec> spec = find(key);
  return spec == nullptr ? -1 : static_cast<int64_t>(spec->launches.load(std::memory_order_relaxed));
}

// Bytes of `key`'s counters, on every stream, that are not zero (-1: no spec
// registered): each launch must leave them zeroed, so verification asks after its calls, once the
// device is synchronised (the count runs on the current stream, not the launches').
int64_t counters_left(const std::string& key) {
  const std::shared_ptr<Spec> spec = find(key);
  if (spec == nullptr) return -1;
  int64_t left = 0;
  for (auto& kernel : spec->kernels) {
    std::lock_guard<std::mutex> lock(kernel->counters_mutex);
    for (const Counters& held : kernel->counters) left += held.memory.ne(0).sum().item<int64_t>();
  }
  return left;
}

}  // namespace

TORCH_LIBRARY_IMPL(cuda_agent, CUDA, m) {
  impl_all<launch_cuda>(m, std::make_index_sequence<kMostPositionalInputs>{});
}

TORCH_LIBRARY_IMPL(cuda_agent, Meta, m) {
  impl_all<launch_meta>(m, std::make_index_sequence<kMostPositionalInputs>{});
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "cuda_agent::launch's spec table: kernels described as data, launched from C++.";
  m.def("register_spec", &register_spec, py::arg("key"), py::arg("digest"), py::arg("device"), py::arg("inputs"),
        py::arg("outputs"), py::arg("kernels"),
        "Register a spec under `key` and load its kernels on CUDA device `device`. inputs/outputs: "
        "(sizes, strides, dtype name); kernels: (cubin, name, grid, block, shared_mem, [(kind, value)], alignment, "
        "cluster, cooperative, persistent).");
  m.add_object("launch", py::reinterpret_steal<py::object>(PyCFunction_New(&launch_direct_def, nullptr)));
  m.def("launch_count", &launch_count, py::arg("key"), "Launches made under `key` (-1: not registered).");
  m.def("counters_left", &counters_left, py::arg("key"),
        "Bytes of `key`'s kernels' counters that are not zero (-1: not registered); synchronise the device first.");
}
