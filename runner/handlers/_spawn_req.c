/* runner.handlers._spawn: a request's arguments, from Python to C (see _spawn_req.h).
 *
 * Every conversion (PyUnicode_FSConverter: str, bytes, path-like) may run Python code (a
 * __fspath__, a sequence's __iter__): the arrays are built from snapshots (a tuple of
 * each sequence, a copy of the dict) and sized by what was read, never by a len() taken
 * before, so that such code cannot make them overrun nor read freed items.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <string.h>

#include "_spawn_req.h"

/* a request and the Python objects its arrays point into */
struct pyreq {
    struct req r; /* first: a struct req * from the pool is a struct pyreq * */
    PyObject *key;  /* handed back by collect() */
    PyObject *keep; /* the bytes the arrays point into */
    PyObject *cwd_b;
};

void
flowrun_req_free(struct req *r)
{
    struct pyreq *p = (struct pyreq *)r;
    Py_XDECREF(p->key);
    Py_XDECREF(p->keep);
    Py_XDECREF(p->cwd_b);
    PyMem_RawFree(r->argv);
    PyMem_RawFree(r->execs);
    PyMem_RawFree(r->envp);
    PyMem_RawFree(p);
}

void
flowrun_req_free_list(struct req *r)
{
    while (r != NULL) {
        struct req *next = r->next;
        flowrun_req_free(r);
        r = next;
    }
}

/* `item` (str, bytes or path-like; no NUL) -> its bytes, kept alive by `keep`; NULL on error */
static const char *
fs_bytes(PyObject *item, PyObject *keep)
{
    PyObject *b = NULL;
    if (!PyUnicode_FSConverter(item, &b)) /* a NUL refused: ValueError */
        return NULL;
    int e = PyList_Append(keep, b);
    Py_DECREF(b); /* `keep` holds it */
    return e < 0 ? NULL : PyBytes_AS_STRING(b);
}

/* the items of `seq` -> a NULL-terminated char * array with `extra` more free slots, the
 * items' count in *n; from a tuple copy, so that code run by a conversion cannot change
 * the count under us */
static char **
to_cstrings(PyObject *seq, PyObject *keep, Py_ssize_t extra, Py_ssize_t *n)
{
    PyObject *items = PySequence_Tuple(seq);
    if (items == NULL)
        return NULL;
    *n = PyTuple_GET_SIZE(items);
    if (*n > (PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(char *)) - extra - 1) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return NULL;
    }
    char **out = PyMem_RawCalloc((size_t)(*n + extra + 1), sizeof(char *));
    if (out == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        if ((out[i] = (char *)fs_bytes(PyTuple_GET_ITEM(items, i), keep)) == NULL) {
            Py_DECREF(items);
            PyMem_RawFree(out);
            return NULL;
        }
    }
    Py_DECREF(items);
    return out;
}

/* envp = the items of `items` (b"key=value"), then "key=value" for each of `added` (a
 * copy of the caller's dict: nobody else can change it while a conversion runs code) */
static char **
to_envp(PyObject *items, PyObject *added, PyObject *keep)
{
    Py_ssize_t n, pos = 0;
    char **envp = to_cstrings(items, keep, PyDict_GET_SIZE(added), &n);
    if (envp == NULL)
        return NULL;
    PyObject *key, *value;
    while (PyDict_Next(added, &pos, &key, &value)) {
        PyObject *k = NULL, *v = NULL, *item = NULL;
        if (!PyUnicode_FSConverter(key, &k) || !PyUnicode_FSConverter(value, &v))
            goto error;
        if (strchr(PyBytes_AS_STRING(k), '=') != NULL) {
            PyErr_SetString(PyExc_ValueError, "illegal environment variable name");
            goto error;
        }
        item = PyBytes_FromFormat("%s=%s", PyBytes_AS_STRING(k), PyBytes_AS_STRING(v));
        if (item == NULL || (envp[n++] = (char *)fs_bytes(item, keep)) == NULL)
            goto error;
        Py_DECREF(k);
        Py_DECREF(v);
        Py_DECREF(item);
        continue;
    error:
        Py_XDECREF(k);
        Py_XDECREF(v);
        Py_XDECREF(item);
        PyMem_RawFree(envp);
        return NULL;
    }
    return envp;
}

PyObject *
flowrun_req_key(struct req *r)
{
    return ((struct pyreq *)r)->key;
}

struct req *
flowrun_req_new(PyObject *key, PyObject *argv_o, PyObject *execs_o, PyObject *cwd_o,
                PyObject *items_o, PyObject *added_o)
{
    struct pyreq *p = PyMem_RawCalloc(1, sizeof *p);
    if (p == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    struct req *r = &p->r;
    PyObject *added = NULL; /* a copy of added_o */
    Py_ssize_t n_argv;
    if ((p->keep = PyList_New(0)) == NULL ||
        (r->argv = to_cstrings(argv_o, p->keep, 0, &n_argv)) == NULL ||
        (r->execs = to_cstrings(execs_o, p->keep, 0, &r->n_execs)) == NULL ||
        (added = PyDict_Copy(added_o)) == NULL ||
        (r->envp = to_envp(items_o, added, p->keep)) == NULL)
        goto error;
    if (cwd_o != Py_None) {
        if (!PyUnicode_FSConverter(cwd_o, &p->cwd_b))
            goto error;
        r->cwd = PyBytes_AS_STRING(p->cwd_b);
    }
    if (n_argv == 0 || r->n_execs == 0) {
        PyErr_SetString(PyExc_ValueError, n_argv ? "no executable to try" : "empty argv");
        goto error;
    }
    Py_DECREF(added);
    Py_INCREF(key);
    p->key = key;
    return r;
error:
    Py_XDECREF(added);
    flowrun_req_free(r);
    return NULL;
}
