// The fast path's launcher: loads CUBINs into the current CUDA context and launches their
// kernels on a given stream, with arguments packed from a Python sequence in one call.
//
// It reaches the driver through cuda_driver.h (dlopen'd on first use), so it builds without CUDA
// headers or libraries and imports on machines without a GPU.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda_driver.h"

namespace py = pybind11;
using namespace cuda_agent;

namespace {

constexpr size_t kMaxArgs = 256;

uintptr_t load_module(py::bytes image, int device) {
  const Driver& d = driver();
  ensure_context(d, device);
  CUmodule module = nullptr;
  check(d.cuModuleLoadData(&module, PyBytes_AS_STRING(image.ptr())), "cuModuleLoadData");
  return reinterpret_cast<uintptr_t>(module);
}

uintptr_t module_function(uintptr_t module, const std::string& name) {
  return reinterpret_cast<uintptr_t>(get_function(reinterpret_cast<CUmodule>(module), name));
}

// Python integer -> C integer, without accepting floats; false (error cleared) if impossible.
bool to_long_long(PyObject* obj, long long& out) {
  PyObject* index = PyNumber_Index(obj);
  if (index == nullptr) {
    PyErr_Clear();
    return false;
  }
  out = PyLong_AsLongLong(index);
  Py_DECREF(index);
  if (out == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// grid and block: an int, or a sequence of 1 to 3 ints, each at least 1.
Dim3 to_dim3(py::handle value, const char* what) {
  long long sizes[3] = {1, 1, 1};
  bool ok = true;
  if (PyIndex_Check(value.ptr())) {
    ok = to_long_long(value.ptr(), sizes[0]);
  } else {
    py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(value.ptr(), ""));
    if (!seq) PyErr_Clear();
    const long long count = seq ? PySequence_Fast_GET_SIZE(seq.ptr()) : 0;
    ok = count >= 1 && count <= 3;
    for (long long i = 0; ok && i < count; ++i) {
      ok = to_long_long(PySequence_Fast_GET_ITEM(seq.ptr(), i), sizes[i]);
    }
  }
  const long long limit = std::numeric_limits<unsigned>::max();
  for (long long size : sizes) ok = ok && size >= 1 && size <= limit;
  if (!ok) {
    throw py::value_error(std::string(what) + " must be a positive int or a tuple of 1 to 3 positive ints, got " +
                          py::repr(value).cast<std::string>());
  }
  return Dim3{static_cast<unsigned>(sizes[0]), static_cast<unsigned>(sizes[1]), static_cast<unsigned>(sizes[2])};
}

const char* type_name(char code) {
  switch (code) {
    case 'p': return "ptr";
    case 'i': return "i32";
    case 'l': return "i64";
    case 'f': return "f32";
    case 'd': return "f64";
  }
  return nullptr;
}

[[noreturn]] void bad_argument(size_t index, char code, PyObject* obj, const std::string& why) {
  throw py::type_error("argument " + std::to_string(index) + " (" + type_name(code) + ") " + why + ", got " +
                       py::repr(obj).cast<std::string>().substr(0, 80));
}

// A tensor's device address, refusing objects the GPU cannot read through.
void* tensor_address(PyObject* obj, size_t index, char code) {
  static PyObject* const is_cuda_name = PyUnicode_InternFromString("is_cuda");
  static PyObject* const data_ptr_name = PyUnicode_InternFromString("data_ptr");
  py::object is_cuda = py::reinterpret_steal<py::object>(PyObject_GetAttr(obj, is_cuda_name));
  if (!is_cuda) {
    PyErr_Clear();
    bad_argument(index, code, obj, "must be a torch.Tensor or an int address");
  }
  if (is_cuda.ptr() != Py_True) bad_argument(index, code, obj, "must be a CUDA tensor");
  py::object address = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(obj, data_ptr_name));
  if (!address) throw py::error_already_set();
  return PyLong_AsVoidPtr(address.ptr());
}

void pack(char code, PyObject* obj, size_t index, ArgValue& out) {
  long long integer = 0;
  switch (code) {
    case 'p':
      if (PyLong_Check(obj)) {
        if (!to_long_long(obj, integer)) bad_argument(index, code, obj, "must fit in 64 bits");
        out.ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(integer));
      } else {
        out.ptr = tensor_address(obj, index, code);
      }
      return;
    case 'i':
      if (!to_long_long(obj, integer) || integer < std::numeric_limits<int32_t>::min() ||
          integer > std::numeric_limits<int32_t>::max()) {
        bad_argument(index, code, obj, "must be an int that fits in 32 bits");
      }
      out.i32 = static_cast<int32_t>(integer);
      return;
    case 'l':
      if (!to_long_long(obj, integer)) bad_argument(index, code, obj, "must be an int that fits in 64 bits");
      out.i64 = integer;
      return;
    case 'f':
    case 'd': {
      double real = PyFloat_AsDouble(obj);
      if (real == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        bad_argument(index, code, obj, "must be a float");
      }
      if (code == 'f') out.f32 = static_cast<float>(real);
      else out.f64 = real;
      return;
    }
  }
}

class Function {
 public:
  Function(uintptr_t handle, std::string name, std::string arg_codes)
      : function_(reinterpret_cast<CUfunction>(handle)), name_(std::move(name)), arg_codes_(std::move(arg_codes)) {
    if (arg_codes_.size() > kMaxArgs) throw py::value_error("a kernel takes at most " + std::to_string(kMaxArgs) + " arguments");
    for (char code : arg_codes_) {
      if (type_name(code) == nullptr) throw py::value_error(std::string("unknown argument type code '") + code + "'");
    }
  }

  // cluster: None, or the blocks of one thread-block cluster (an int or 1 to 3 ints; sm_90+).
  void launch(py::handle grid, py::handle block, py::handle args, unsigned shared_mem, uintptr_t stream,
              py::handle cluster) {
    const Dim3 g = to_dim3(grid, "grid");
    const Dim3 b = to_dim3(block, "block");
    const bool clustered = !cluster.is_none();
    const Dim3 c = clustered ? to_dim3(cluster, "cluster") : Dim3{};
    if (clustered && (g.x % c.x || g.y % c.y || g.z % c.z)) {
      throw py::value_error("the grid must be a whole number of clusters in each dimension");
    }
    py::object seq = py::reinterpret_steal<py::object>(PySequence_Fast(args.ptr(), "args must be a list or tuple"));
    if (!seq) throw py::error_already_set();
    const size_t count = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr()));
    if (count != arg_codes_.size()) {
      throw py::type_error("kernel '" + name_ + "' takes " + std::to_string(arg_codes_.size()) + " arguments, got " +
                           std::to_string(count));
    }
    ArgValue values[kMaxArgs];
    void* params[kMaxArgs];
    PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
    for (size_t i = 0; i < count; ++i) {
      pack(arg_codes_[i], items[i], i, values[i]);
      params[i] = &values[i];
    }
    const Driver& d = driver();
    if (shared_mem > shared_mem_limit_) {
      check(d.cuFuncSetAttribute(function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(shared_mem)),
            "cuFuncSetAttribute(max dynamic shared memory = " + std::to_string(shared_mem) + ")");
      shared_mem_limit_ = shared_mem;
    }
    if (!clustered) {
      check(d.cuLaunchKernel(function_, g.x, g.y, g.z, b.x, b.y, b.z, shared_mem, reinterpret_cast<CUstream>(stream),
                             params, nullptr),
            "cuLaunchKernel('" + name_ + "')");
      return;
    }
    if (d.cuLaunchKernelEx == nullptr) {
      throw std::runtime_error("this CUDA driver has no cuLaunchKernelEx: cluster launches need CUDA 12 or later");
    }
    LaunchAttribute attribute{};
    attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attribute.value.cluster_dim = {c.x, c.y, c.z};
    const LaunchConfig config{g.x, g.y, g.z, b.x, b.y, b.z, shared_mem, reinterpret_cast<CUstream>(stream), &attribute, 1};
    check(d.cuLaunchKernelEx(&config, function_, params, nullptr), "cuLaunchKernelEx('" + name_ + "', cluster)");
  }

  const std::string& name() const { return name_; }
  const std::string& arg_codes() const { return arg_codes_; }

 private:
  CUfunction function_;
  std::string name_;
  std::string arg_codes_;
  // Dynamic shared memory the function's limit was raised to: none yet. The default limit, 48 KB less
  // the kernel's static shared memory, would refuse even 48 KB exactly, so any request raises it.
  unsigned shared_mem_limit_ = 0;
};

}  // namespace

PYBIND11_MODULE(_cuda_agent_launcher, m) {
  m.doc() = "Loads CUBINs and launches their kernels through the CUDA driver, found at run time.";
  m.def("load_module", &load_module, py::arg("image"), py::arg("device"),
        "Load a CUBIN into the current context (or device's primary one); returns the module handle.");
  m.def("get_function", &module_function, py::arg("module"), py::arg("name"),
        "The handle of the extern \"C\" kernel `name` in a loaded module.");
  // module_local: two copies of the launcher (two cache roots) may load into one process.
  py::class_<Function>(m, "Function", py::module_local())
      .def(py::init<uintptr_t, std::string, std::string>(), py::arg("handle"), py::arg("name"), py::arg("arg_codes"))
      .def("launch", &Function::launch, py::arg("grid"), py::arg("block"), py::arg("args"), py::arg("shared_mem"),
           py::arg("stream"), py::arg("cluster") = py::none(),
           "Launch on `stream` (a raw cudaStream_t as int); args packed by arg_codes: "
           "p=pointer (tensor or int), i=int32, l=int64, f=float32, d=float64. cluster: None, or the "
           "thread-block cluster's shape (through cuLaunchKernelEx).")
      .def_property_readonly("name", &Function::name)
      .def_property_readonly("arg_codes", &Function::arg_codes);
}
