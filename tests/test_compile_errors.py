"""Compiler output trimmed to the few lines a model or a person can act on."""
from agent_backend.env.compile_errors import MAX_CHARS, CompileError, trim_compiler_log

# What nvcc 13.0 (and NVRTC, in the same format) printed for a source with three errors.
NVCC_LOG = """\
kernel.cu(3): error: identifier "undefined_thing" is undefined
      if (i < n) out[i] = a[i] + undefined_thing;
                                 ^

kernel.cu(7): warning #177-D: variable "unused" was declared but never referenced
  extern "C" __attribute__((global)) void g(float* o) { o[0] = f(1.0f); int unused; }
                                                                            ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

kernel.cu(6): error: expression must have class type but it has type "float"
  template <typename T> __attribute__((device)) T f(T x) { return x.foo; }
                                                                  ^
          detected during instantiation of "T f(T) [with T=float]" at line 7

2 errors detected in the compilation of "kernel.cu".
"""

# What torch.utils.cpp_extension.load_inline raised for a C++ error (ninja's output inside).
LOAD_INLINE_LOG = """\
Error building extension 'brk': [1/2] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=brk -isystem /venv/torch/include -fPIC -std=c++20 -c /tmp/errs/li/main.cpp -o main.o
FAILED: [code=1] main.o
c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=brk -isystem /venv/torch/include -fPIC -std=c++20 -c /tmp/errs/li/main.cpp -o main.o
/tmp/errs/li/main.cpp: In function 'int add_one(int)':
/tmp/errs/li/main.cpp:2:33: error: 'oops' was not declared in this scope
    2 | int add_one(int x) { return x + oops; }
      |                                 ^~~~
ninja: build stopped: subcommand failed.
"""


def test_nvcc_errors_keep_message_and_source_line_drop_warnings_and_banners():
    text = trim_compiler_log(NVCC_LOG)
    assert text.splitlines()[0] == 'kernel.cu(3): error: identifier "undefined_thing" is undefined'
    assert "if (i < n) out[i] = a[i] + undefined_thing;" in text
    assert 'kernel.cu(6): error: expression must have class type but it has type "float"' in text
    assert "detected during instantiation" in text
    assert "warning" not in text and "Remark" not in text and "errors detected" not in text


def test_load_inline_log_keeps_the_error_without_commands_or_paths():
    text = trim_compiler_log(LOAD_INLINE_LOG)
    assert text == (
        "main.cpp:2:33: error: 'oops' was not declared in this scope\n"
        "    2 | int add_one(int x) { return x + oops; }\n"
        "      |                                 ^~~~"
    )


def test_tool_errors_are_kept():
    ptxas = "ptxas error   : Entry function 'big' uses too much shared data (0x61a80 bytes, 0xc000 max)\n"
    assert trim_compiler_log(ptxas) == ptxas.strip()
    assert trim_compiler_log("nvcc fatal   : Unknown option '--bogus'") == "nvcc fatal   : Unknown option '--bogus'"
    undefined = "ImportError: /home/u/.cache/ext_ab12/ext_ab12.so: undefined symbol: _Z3foov"
    assert trim_compiler_log(undefined) == "ImportError: ext_ab12.so: undefined symbol: _Z3foov"


def test_only_the_first_errors_are_shown_and_the_rest_counted():
    log = "".join(f"kernel.cu({i}): error: bad thing {i}\n    x = {i};\n\n" for i in range(1, 9))
    text = trim_compiler_log(log, max_errors=3)
    assert "bad thing 3" in text and "bad thing 4" not in text
    assert text.endswith("(5 more errors not shown)")


def test_repeated_errors_appear_once():
    log = "main.cu(2): error: oops\n  y;\n" * 3
    assert trim_compiler_log(log) == "main.cu(2): error: oops\n  y;"


def test_length_is_capped():
    log = "".join(f"kernel.cu({i}): error: {'x' * 900}\n" for i in range(5))
    text = trim_compiler_log(log)
    assert len(text) <= MAX_CHARS
    assert text.endswith("... (truncated)")


def test_unrecognised_output_falls_back_to_its_last_lines():
    log = "\n".join(f"line {i}" for i in range(30)) + "\nninja: build stopped: subcommand failed.\n"
    text = trim_compiler_log(log)
    assert text.splitlines() == [f"line {i}" for i in range(20, 30)]
    assert trim_compiler_log("") == "compilation failed with no compiler output"


def test_compile_error_keeps_the_whole_log():
    error = CompileError.from_log(NVCC_LOG)
    assert str(error).startswith("kernel.cu(3): error")
    assert error.log == NVCC_LOG
    assert isinstance(error, RuntimeError)
