/* runner.handlers._spawn: a request's arguments, from Python to C (see _spawn_req.h).
 *
 * Every conversion (PyUnicode_FSConverter: str, bytes, path-like) may run Python code (a
 * __fspath__): the arrays are sized by what is read (never by a len() taken apart from
 * it), each item is held while converted, and a list or dict whose size that code
 * changes is a RuntimeError, so that it can neither make them overrun nor read freed
 * items.
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

static int
changed(const char *what)
{
    PyErr_Format(PyExc_RuntimeError, "%s changed size during submit", what);
    return -1;
}

/* the items of `seq` -> a NULL-terminated char * array with `extra` more free slots, the
 * items' count in *n. A list is read in place (no copy: a submit's hot path) with its
 * size checked before each item and each item held while converted: one changed by the
 * code of a conversion is a RuntimeError, never a read past its end. */
static char **
to_cstrings(PyObject *seq, PyObject *keep, Py_ssize_t extra, Py_ssize_t *n, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, "expected a sequence");
    if (fast == NULL)
        return NULL;
    *n = PySequence_Fast_GET_SIZE(fast);
    char **out = NULL;
    if (*n > (PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(char *)) - extra - 1 ||
        (out = PyMem_RawCalloc((size_t)(*n + extra + 1), sizeof(char *))) == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        if (PySequence_Fast_GET_SIZE(fast) != *n) {
            changed(what);
            goto error;
        }
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        Py_INCREF(item);
        out[i] = (char *)fs_bytes(item, keep);
        Py_DECREF(item);
        if (out[i] == NULL)
            goto error;
    }
    if (PySequence_Fast_GET_SIZE(fast) != *n) {
        changed(what);
        goto error;
    }
    Py_DECREF(fast);
    return out;
error:
    Py_DECREF(fast);
    PyMem_RawFree(out);
    return NULL;
}

/* "key=value" of one variable, kept alive by `keep`, or NULL */
static char *
env_item(PyObject *key, PyObject *value, PyObject *keep)
{
    PyObject *k = NULL, *v = NULL, *item = NULL;
    char *out = NULL;
    if (!PyUnicode_FSConverter(key, &k) || !PyUnicode_FSConverter(value, &v))
        goto done;
    if (strchr(PyBytes_AS_STRING(k), '=') != NULL) {
        PyErr_SetString(PyExc_ValueError, "illegal environment variable name");
        goto done;
    }
    item = PyBytes_FromFormat("%s=%s", PyBytes_AS_STRING(k), PyBytes_AS_STRING(v));
    if (item != NULL)
        out = (char *)fs_bytes(item, keep);
done:
    Py_XDECREF(k);
    Py_XDECREF(v);
    Py_XDECREF(item);
    return out;
}

/* envp = the items of `items` (b"key=value"), then "key=value" for each of `added` (a
 * dict, read in place: never more items than slots, and a RuntimeError if its size
 * changed meanwhile) */
static char **
to_envp(PyObject *items, PyObject *added, PyObject *keep)
{
    Py_ssize_t n, pos = 0, n_added = PyDict_GET_SIZE(added);
    char **envp = to_cstrings(items, keep, n_added, &n, "env_items");
    if (envp == NULL)
        return NULL;
    Py_ssize_t end = n + n_added;
    PyObject *key, *value;
    while (PyDict_Next(added, &pos, &key, &value)) {
        if (n == end || PyDict_GET_SIZE(added) != n_added) {
            changed("env_added");
            goto error;
        }
        Py_INCREF(key); /* held: a conversion's code may take them out of the dict */
        Py_INCREF(value);
        envp[n] = env_item(key, value, keep);
        Py_DECREF(key);
        Py_DECREF(value);
        if (envp[n++] == NULL)
            goto error;
    }
    if (n != end) {
        changed("env_added");
        goto error;
    }
    return envp;
error:
    PyMem_RawFree(envp);
    return NULL;
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
    Py_ssize_t n_argv;
    if ((p->keep = PyList_New(0)) == NULL ||
        (r->argv = to_cstrings(argv_o, p->keep, 0, &n_argv, "argv")) == NULL ||
        (r->execs = to_cstrings(execs_o, p->keep, 0, &r->n_execs, "executables")) == NULL ||
        (r->envp = to_envp(items_o, added_o, p->keep)) == NULL)
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
    Py_INCREF(key);
    p->key = key;
    return r;
error:
    flowrun_req_free(r);
    return NULL;
}

/* see _spawn_req.h */
int
flowrun_req_setup(struct req *r, PyObject *setup)
{
    PyObject *limits;
    int nice;
    long uid, gid;
    if (!PyArg_ParseTuple(setup, "Oill:setup", &limits, &nice, &uid, &gid))
        return -1;
    PyObject *fast = PySequence_Tuple(limits);
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(fast);
    if (n > CHILD_MAX_LIMITS) {
        PyErr_SetString(PyExc_ValueError, "too many limits");
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int res;
        unsigned long long soft, hard;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fast, i), "iKK:limit", &res, &soft, &hard))
            goto error;
        r->setup.resource[i] = res;
        r->setup.value[i].rlim_cur = (rlim_t)soft;
        r->setup.value[i].rlim_max = (rlim_t)hard;
    }
    if (nice > 19 || uid < -1 || gid < -1) {
        PyErr_SetString(PyExc_ValueError, "nice above 19, or a negative uid or gid");
        goto error;
    }
    r->setup.n_limits = (int)n;
    r->setup.nice = nice;
    r->setup.uid = uid;
    r->setup.gid = gid;
    r->has_setup = 1;
    Py_DECREF(fast);
    return 0;
error:
    Py_DECREF(fast);
    return -1;
}
