// Module init for the extension: a plain Python module whose import loads the shared library,
// which registers the ops with the PyTorch dispatcher as a side effect of static initialisers.
#pragma once

#include <Python.h>

#define VLLM_STRINGIFY_(x) #x
#define VLLM_STRINGIFY(x) VLLM_STRINGIFY_(x)
#define VLLM_CONCAT_(a, b) a##b
#define VLLM_CONCAT(a, b) VLLM_CONCAT_(a, b)

#ifdef VLLM_WITH_CUDA
#define VLLM_CUDA_ENABLED 1
#else
#define VLLM_CUDA_ENABLED 0
#endif

// Defines PyInit_<NAME>; the module carries two build facts: cpu_isa and cuda_enabled.
#define REGISTER_EXTENSION(NAME)                                                  \
  PyMODINIT_FUNC VLLM_CONCAT(PyInit_, NAME)() {                                   \
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,                    \
                                        VLLM_STRINGIFY(NAME), nullptr, 0, nullptr}; \
    PyObject* m = PyModule_Create(&module);                                       \
    if (m == nullptr) return nullptr;                                             \
    PyModule_AddStringConstant(m, "cpu_isa", VLLM_CPU_ISA_NAME);                  \
    PyModule_AddIntConstant(m, "cuda_enabled", VLLM_CUDA_ENABLED);                \
    return m;                                                                     \
  }
