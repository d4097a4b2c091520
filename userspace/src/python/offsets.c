/* Prints the CPython struct offsets the frame walker uses (userspace/src/python/offsets.rs).
 * Build against a version's headers: gcc -I$inc -I$inc/internal offsets.c (inc = include/python3.X). */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#else
#include "frameobject.h"
#endif
#include <stdio.h>
#define O(t,f) printf("%s.%s %zu\n", #t, #f, offsetof(t,f))
int main(void){
  printf("version %x\n", PY_VERSION_HEX);
  O(_PyRuntimeState, interpreters.head);
  
#if PY_VERSION_HEX >= 0x030B0000
  O(PyInterpreterState, threads.head);
#else
  O(PyInterpreterState, tstate_head);
#endif
  O(PyThreadState, next);
  O(PyThreadState, thread_id);
#if PY_VERSION_HEX >= 0x030D0000
  O(PyThreadState, current_frame);
  O(_PyInterpreterFrame, f_executable);
  O(_PyInterpreterFrame, previous);
  O(_PyInterpreterFrame, instr_ptr);
  O(_PyInterpreterFrame, owner);
#elif PY_VERSION_HEX >= 0x030C0000
  O(PyThreadState, cframe);
  O(_PyCFrame, current_frame);
  O(_PyInterpreterFrame, f_code);
  O(_PyInterpreterFrame, previous);
  O(_PyInterpreterFrame, prev_instr);
  O(_PyInterpreterFrame, owner);
#elif PY_VERSION_HEX >= 0x030B0000
  O(PyThreadState, cframe);
  O(_PyCFrame, current_frame);
  O(_PyInterpreterFrame, f_code);
  O(_PyInterpreterFrame, previous);
  O(_PyInterpreterFrame, prev_instr);
  O(_PyInterpreterFrame, is_entry);
#else
  O(PyThreadState, frame);
  O(PyFrameObject, f_code);
  O(PyFrameObject, f_back);
  O(PyFrameObject, f_lasti);
#endif
  O(PyCodeObject, co_name);
#if PY_VERSION_HEX >= 0x030B0000
  O(PyCodeObject, co_qualname);
  O(PyCodeObject, co_code_adaptive);
#endif
  O(PyCodeObject, co_filename);
  O(PyCodeObject, co_firstlineno);
#if PY_VERSION_HEX >= 0x030A0000
  O(PyCodeObject, co_linetable);
#else
  O(PyCodeObject, co_lnotab);
#endif
  printf("sizeof.PyASCIIObject %zu\n", sizeof(PyASCIIObject));
  printf("sizeof.PyCompactUnicodeObject %zu\n", sizeof(PyCompactUnicodeObject));
  O(PyASCIIObject, length);
  O(PyBytesObject, ob_sval);
  O(PyVarObject, ob_size);
  return 0;
}
