/* The calling code's own variables, read where they live: how many of a frame's variables
 * hold an object; and whether a weak reference reaches an object (references that no
 * count shows).
 *
 * CPython 3.11 to 3.13 keep a function's variables in the frame's own array, which is read
 * as Cython reads it for its tracebacks (the internal header pycore_frame.h): asking
 * through locals() would copy every variable into a dict the frame keeps (3.11 and 3.12),
 * holding them past the caller's `del`. 3.14 keeps tagged references there and says it
 * through PyFrame_GetVar. */
#ifndef DLINSPECT_FRAMES_H
#define DLINSPECT_FRAMES_H

#include <Python.h>

#define DL_FAST_CELL 0x40   /* CO_FAST_CELL (pycore_code.h, 3.11+): a variable inner functions share */
#define DL_FAST_FREE 0x80   /* CO_FAST_FREE: an enclosing function's variable, not this frame's */

#if PY_VERSION_HEX < 0x030E0000
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#endif
#include "internal/pycore_frame.h"
#endif

/* contract: the number of the function frame `frame`'s own variables (locals, and cells no
   inner function holds: not the free variables an enclosing function shares with it, nor a
   cell a closure may carry elsewhere) bound to `obj`, read in its own array (3.11 to 3.13) or
   through PyFrame_GetVar once per variable (3.14, where the cell is not seen: none counts);
   never fails. */
static Py_ssize_t dl_frame_refs(PyObject *frame, PyObject *obj)
{
    PyFrameObject *f = (PyFrameObject *)frame;
    PyCodeObject *co = PyFrame_GetCode(f);
    Py_ssize_t n = 0;
    for (int i = 0; i < co->co_nlocalsplus; i++) {
        const unsigned char kind = (unsigned char)PyBytes_AS_STRING(co->co_localspluskinds)[i];
        if (kind & DL_FAST_FREE) {
            continue;
        }
#if PY_VERSION_HEX < 0x030E0000
        PyObject *v = f->f_frame->localsplus[i];
        if (v != NULL && (kind & DL_FAST_CELL) && PyCell_Check(v)) {
            if (Py_REFCNT(v) != 1) {   /* (a closure holds the cell too) */
                continue;
            }
            v = PyCell_GET(v);
        }
#else
        if (kind & DL_FAST_CELL) {
            continue;
        }
        PyObject *v = PyFrame_GetVar(f, PyTuple_GET_ITEM(co->co_localsplusnames, i));
        if (v == NULL) {   /* (unbound) */
            PyErr_Clear();
            continue;
        }
        Py_DECREF(v);   /* (the frame keeps its own reference: only the address is compared) */
#endif
        n += v == obj;
    }
    Py_DECREF(co);
    return n;
}

/* contract: whether a weak reference to `obj` lives (its weak reference list not empty):
   whoever holds one reaches `obj` again while anything keeps it alive. The list lies
   tp_weaklistoffset bytes from the object, before it (a negative offset) where 3.12+
   manages it for a class defined in Python (torch.Tensor, a dict subclass); 0: none. */
static inline int dl_weakly_held(PyObject *obj)
{
    const Py_ssize_t at = Py_TYPE(obj)->tp_weaklistoffset;
    return at != 0 && *(PyObject **)((char *)obj + at) != NULL;
}

#endif
