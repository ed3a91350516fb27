/* runner.handlers._spawn: start exec handlers on threads of our own, without the GIL.
 *
 * A Spawner (one per event loop) hands requests to a small pool of POSIX threads that
 * never take the GIL (_spawn_pool.c); each request is, in one go: three pipes (stdout,
 * stderr, the control channel; close-on-exec), a vfork() child (a new session, in cwd,
 * stdin from stdin_fd, stdout/stderr to the pipes, the control channel's write end as
 * descriptor 3, every other descriptor closed, SIGPIPE and SIGXFSZ back to their
 * defaults, no signal blocked), the child's pidfd (pidfd_open; -1 where the kernel has
 * none), and the closing of the write ends (_spawn_child.c: no Python there). Finished
 * spawns are collected by the loop in batches: the Spawner's eventfd is readable while
 * there are some.
 *
 * This file is the Python binding: the Spawner type and the module; the arguments of a
 * request are converted into C arrays by _spawn_req.c.
 *
 * The reaper (runner.handlers.reaper) must never reap a handler the loop has not taken
 * over yet: such pids are "pending" until forget(), and hold_reaps() keeps new spawns
 * back while the reaper looks at its children. The measurements: docs/performance.md,
 * "The C spawn extension".
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <stddef.h>

#include "_spawn_child.h"
#include "_spawn_pool.h"
#include "_spawn_req.h"

typedef struct {
    PyObject_HEAD
    struct core *core;
} Spawner;

static int
Spawner_init(Spawner *self, PyObject *args, PyObject *kwds)
{
    (void)kwds;
    if (!PyArg_ParseTuple(args, ":Spawner"))
        return -1;
    if (self->core != NULL)
        return 0;
    if ((self->core = flowrun_core_new()) == NULL) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static void
Spawner_close_core(Spawner *self)
{
    struct core *c = self->core;
    if (c == NULL)
        return;
    self->core = NULL;
    flowrun_req_free_list(flowrun_core_close(c));
    flowrun_req_free_list(flowrun_pool_garbage());
}

static void
Spawner_dealloc(Spawner *self)
{
    Spawner_close_core(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Spawner_close(Spawner *self, PyObject *unused)
{
    (void)unused;
    Spawner_close_core(self);
    Py_RETURN_NONE;
}

/* self's core, or NULL with ValueError */
static struct core *
open_core(Spawner *self)
{
    if (self->core == NULL)
        PyErr_SetString(PyExc_ValueError, "closed Spawner");
    else if (flowrun_core_foreign(self->core))
        PyErr_SetString(PyExc_ValueError, "a Spawner made before a fork (use a new one)");
    else
        return self->core;
    return NULL;
}

static PyObject *
Spawner_fileno(Spawner *self, PyObject *unused)
{
    (void)unused;
    struct core *c = open_core(self);
    return c == NULL ? NULL : PyLong_FromLong(flowrun_core_fd(c));
}

static PyObject *
Spawner_submit(Spawner *self, PyObject *args)
{
    PyObject *key, *argv_o, *execs_o, *cwd_o, *items_o, *added_o, *setup_o = Py_None;
    int stdin_fd;
    if (!PyArg_ParseTuple(args, "OOOOOO!i|O:submit", &key, &argv_o, &execs_o, &cwd_o, &items_o,
                          &PyDict_Type, &added_o, &stdin_fd, &setup_o))
        return NULL;
    if (open_core(self) == NULL)
        return NULL;
    if (stdin_fd < CHILD_FDS) {
        PyErr_SetString(PyExc_ValueError, "stdin_fd must be 4 or above");
        return NULL;
    }
    struct req *r = flowrun_req_new(key, argv_o, execs_o, cwd_o, items_o, added_o);
    if (r == NULL)
        return NULL;
    r->stdin_fd = stdin_fd;
    if (setup_o != Py_None && flowrun_req_setup(r, setup_o) < 0) {
        flowrun_req_free(r);
        return NULL;
    }
    /* again: the conversions may have run Python code (__fspath__) that closed it */
    struct core *c = open_core(self);
    int e = c == NULL ? -1 : flowrun_pool_submit(c, r);
    if (e != 0) {
        if (e > 0) {
            errno = e;
            PyErr_SetFromErrno(PyExc_OSError);
        }
        flowrun_req_free(r);
        return NULL;
    }
    flowrun_req_free_list(flowrun_pool_garbage());
    Py_RETURN_NONE;
}

/* collect() -> [(key, pid, pidfd, out_r, err_r, ctl_r) | (key, None, errno, stage, 0, 0)] */
static PyObject *
Spawner_collect(Spawner *self, PyObject *unused)
{
    (void)unused;
    flowrun_req_free_list(flowrun_pool_garbage()); /* first: a key's __del__ may close self */
    struct core *c = self->core;
    if (c == NULL || flowrun_core_foreign(c))
        return PyList_New(0);
    PyObject *out = PyList_New(0);
    if (out == NULL) /* nothing taken: the eventfd stays readable */
        return NULL;
    struct req *r = flowrun_core_take(c);
    while (r != NULL) {
        struct req *next = r->next;
        PyObject *key = flowrun_req_key(r);
        PyObject *item = r->err == 0 ? Py_BuildValue("(Oiiiii)", key, (int)r->pid, r->pidfd,
                                                     r->reads[0], r->reads[1], r->reads[2])
                                     : Py_BuildValue("(OOiiii)", key, Py_None, r->err, r->stage, 0, 0);
        if (item == NULL || PyList_Append(out, item) < 0) {
            /* out of memory: no process or descriptor left behind, the others returned */
            flowrun_req_end(r);
            PyErr_WriteUnraisable((PyObject *)self);
        }
        Py_XDECREF(item);
        flowrun_req_free(r);
        r = next;
    }
    return out;
}

static PyMethodDef Spawner_methods[] = {
    {"submit", (PyCFunction)Spawner_submit, METH_VARARGS,
     "submit(key, argv, executables, cwd, env_items, env_added, stdin_fd, setup=None): start a"
     " handler on the pool; its result comes back with `key` from collect(). setup: (limits,"
     " nice, uid, gid) set in the child before its exec (limits: ((RLIMIT_*, soft, hard), ...);"
     " nice, uid, gid: -1 to leave). Raises ValueError (a NUL byte, a variable name with '=',"
     " an empty argv or executables, a closed Spawner, a bad setup)."},
    {"collect", (PyCFunction)Spawner_collect, METH_NOARGS,
     "collect() -> the spawns finished since the last call, oldest first: (key, pid, pidfd,"
     " stdout, stderr, control) or (key, None, errno, stage, 0, 0); stage 1: the chdir, 4: the setup."},
    {"fileno", (PyCFunction)Spawner_fileno, METH_NOARGS,
     "fileno() -> an eventfd, readable while collect() has something"},
    {"close", (PyCFunction)Spawner_close, METH_NOARGS,
     "close(): spawns finished or still to finish are ended (their groups killed), those"
     " still queued dropped"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SpawnerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "runner.handlers._spawn.Spawner",
    .tp_basicsize = sizeof(Spawner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Handlers started on the pool's threads, collected by one event loop.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Spawner_init,
    .tp_dealloc = (destructor)Spawner_dealloc,
    .tp_methods = Spawner_methods,
};

/* a pid_t from a Python int, or -1 with an exception */
static int
to_pid(PyObject *o, pid_t *pid)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v <= 0 || v > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "not a pid: %ld", v);
        return -1;
    }
    *pid = (pid_t)v;
    return 0;
}

static PyObject *
forget(PyObject *self, PyObject *pids)
{
    (void)self;
    PyObject *fast = PySequence_Tuple(pids);
    if (fast == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fast); i++) {
        pid_t pid;
        if (to_pid(PyTuple_GET_ITEM(fast, i), &pid) < 0) {
            Py_DECREF(fast);
            return NULL;
        }
        flowrun_pending_remove(pid);
    }
    Py_DECREF(fast);
    Py_RETURN_NONE;
}

static PyObject *
is_pending(PyObject *self, PyObject *arg)
{
    (void)self;
    pid_t pid;
    if (to_pid(arg, &pid) < 0)
        return NULL;
    return PyBool_FromLong(flowrun_pending_has(pid));
}

static PyObject *
hold_reaps(PyObject *self, PyObject *arg)
{
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    if (on) {
        Py_BEGIN_ALLOW_THREADS
        flowrun_hold_reaps(1);
        Py_END_ALLOW_THREADS
    }
    else
        flowrun_hold_reaps(0);
    Py_RETURN_NONE;
}

static PyObject *
set_threads(PyObject *self, PyObject *arg)
{
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > 256) {
        PyErr_SetString(PyExc_ValueError, "1 to 256 threads");
        return NULL;
    }
    flowrun_pool_set_threads((int)n);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"forget", forget, METH_O,
     "forget(pids): these pool-started handlers are now known to the caller's reaper"},
    {"is_pending", is_pending, METH_O,
     "is_pending(pid) -> True while a pool-started handler is not yet forget()-ten"},
    {"hold_reaps", hold_reaps, METH_O,
     "hold_reaps(True): wait for the spawns under way and hold new ones back (the reaper's"
     " look at its children); hold_reaps(False): let them go (same thread)"},
    {"set_threads", set_threads, METH_O, "set_threads(n): the pool's size (default 4)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_spawn",
    .m_doc = "Start an exec handler in one call without the GIL (runner.handlers.spawn).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__spawn(void)
{
    int e = flowrun_pool_init();
    if (e != 0) {
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (PyType_Ready(&SpawnerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "CONTROL_FD", CHILD_FDS - 1) < 0 ||
        PyModule_AddObjectRef(m, "Spawner", (PyObject *)&SpawnerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
