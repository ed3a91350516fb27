/* runner.handlers._spawn: start exec handlers on threads of our own, without the GIL.
 *
 * A Spawner (one per event loop) hands requests to a small pool of POSIX threads that
 * never take the GIL; each request is, in one go: three pipes (stdout, stderr, the
 * control channel; close-on-exec), a vfork() child (a new session, in cwd, stdin from
 * stdin_fd, stdout/stderr to the pipes, the control channel's write end as descriptor 3,
 * every other descriptor closed, SIGPIPE and SIGXFSZ back to their defaults, no signal
 * blocked), the child's pidfd (pidfd_open; -1 where the kernel has none), and the closing
 * of the write ends (_spawn_child.c: no Python there). Finished spawns are collected by the loop in batches: the
 * Spawner's eventfd is readable while there are some.
 *
 * The reaper (runner.handlers.reaper) must never reap a handler the loop has not taken
 * over yet: such pids are "pending" until forget(), and hold_reaps() keeps new spawns
 * back while the reaper looks at its children (a writer-preferring rwlock: spawns are
 * readers). docs/performance.md, issue 13, fifth pass, has the measurements.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include "_spawn_child.h"

/* bytes/str items of a sequence -> a NULL-terminated char* array into `keep`'s bytes */
static char **
to_cstrings(PyObject *seq, PyObject *keep, Py_ssize_t extra)
{
    PyObject *fast = PySequence_Fast(seq, "expected a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    char **out = PyMem_RawCalloc((size_t)(n + extra + 1), sizeof(char *));
    if (out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(item, &b)) /* bytes pass; str encoded; NUL refused */
            goto error;
        if (PyList_Append(keep, b) < 0) {
            Py_DECREF(b);
            goto error;
        }
        out[i] = PyBytes_AS_STRING(b);
        Py_DECREF(b); /* `keep` holds it */
    }
    Py_DECREF(fast);
    return out;
error:
    Py_DECREF(fast);
    PyMem_RawFree(out);
    return NULL;
}

/* append "key=value" of every item of `added` (a dict of str) to `envp` from `at` */
static int
add_env(char **envp, Py_ssize_t at, PyObject *added, PyObject *keep)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(added, &pos, &key, &value)) {
        PyObject *k = NULL, *v = NULL;
        if (!PyUnicode_FSConverter(key, &k))
            return -1;
        if (!PyUnicode_FSConverter(value, &v)) {
            Py_DECREF(k);
            return -1;
        }
        if (memchr(PyBytes_AS_STRING(k), '=', (size_t)PyBytes_GET_SIZE(k)) != NULL) {
            Py_DECREF(k);
            Py_DECREF(v);
            PyErr_SetString(PyExc_ValueError, "illegal environment variable name");
            return -1;
        }
        PyObject *item = PyBytes_FromFormat("%s=%s", PyBytes_AS_STRING(k), PyBytes_AS_STRING(v));
        Py_DECREF(k);
        Py_DECREF(v);
        if (item == NULL || PyList_Append(keep, item) < 0) {
            Py_XDECREF(item);
            return -1;
        }
        envp[at++] = PyBytes_AS_STRING(item);
        Py_DECREF(item);
    }
    return 0;
}

static unsigned int max_fd_cached;

static unsigned int
max_fd(void)
{
    if (max_fd_cached == 0) {
        struct rlimit rl;
        long m = sysconf(_SC_OPEN_MAX);
        max_fd_cached = (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                            ? (unsigned int)rl.rlim_cur
                            : (m > 0 ? (unsigned int)m : 1024);
    }
    return max_fd_cached;
}

/* ---- the pool: spawns on threads of our own, which never take the GIL -------------- */

struct core;

struct req {
    struct req *next;
    struct core *core;
    PyObject *key;  /* handed back by collect(); never touched off the GIL */
    PyObject *keep; /* the bytes the arrays point into */
    char **argv, **execs, **envp;
    ssize_t n_execs;
    PyObject *cwd_b;
    int stdin_fd;
    /* results */
    int err, stage;
    pid_t pid;
    int pidfd, reads[3];
};

/* one Spawner's state, freed by whichever of the object and the pool lets go last */
struct core {
    pthread_mutex_t lock;
    int efd;           /* eventfd: written when `done` goes from empty to non-empty */
    struct req *done;  /* finished spawns, newest first */
    int refs;          /* the Python object + the requests in flight */
    int orphaned;      /* the Python object is gone: end what is finished */
};

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
static struct req *q_head, *q_tail;
static int n_threads, idle_threads, max_threads = 4;
/* spawns (readers) against the reaper's look at our children (the writer) */
static pthread_rwlock_t reap_lock;
/* pids started by the pool and not yet handed over (forget()): never reaped by the reaper */
static pthread_mutex_t p_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t *pending;
static size_t n_pending, cap_pending;
/* requests of orphaned spawners, freed by the next call holding the GIL */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct req *garbage;

static void
core_release(struct core *c)
{
    pthread_mutex_lock(&c->lock);
    int left = --c->refs;
    pthread_mutex_unlock(&c->lock);
    if (left == 0) {
        if (c->efd >= 0)
            close(c->efd);
        pthread_mutex_destroy(&c->lock);
        free(c);
    }
}

static void
pending_add(pid_t pid)
{
    pthread_mutex_lock(&p_lock);
    if (n_pending == cap_pending) {
        size_t cap = cap_pending ? 2 * cap_pending : 64;
        pid_t *more = realloc(pending, cap * sizeof(pid_t));
        if (more != NULL) {
            pending = more;
            cap_pending = cap;
        }
    }
    if (n_pending < cap_pending)
        pending[n_pending++] = pid;
    pthread_mutex_unlock(&p_lock);
}

static void
pending_remove(pid_t pid)
{
    pthread_mutex_lock(&p_lock);
    for (size_t i = 0; i < n_pending; i++) {
        if (pending[i] == pid) {
            pending[i] = pending[--n_pending];
            break;
        }
    }
    pthread_mutex_unlock(&p_lock);
}

static void
free_req(struct req *r) /* with the GIL */
{
    Py_XDECREF(r->key);
    Py_XDECREF(r->keep);
    Py_XDECREF(r->cwd_b);
    PyMem_RawFree(r->argv);
    PyMem_RawFree(r->execs);
    PyMem_RawFree(r->envp);
    PyMem_RawFree(r);
}

static void
free_garbage(void) /* with the GIL */
{
    pthread_mutex_lock(&g_lock);
    struct req *r = garbage;
    garbage = NULL;
    pthread_mutex_unlock(&g_lock);
    while (r != NULL) {
        struct req *next = r->next;
        free_req(r);
        r = next;
    }
}

static void
finish(struct req *r)
{
    struct core *c = r->core;
    pthread_mutex_lock(&c->lock);
    if (c->orphaned) {
        pthread_mutex_unlock(&c->lock);
        if (r->err == 0) { /* nobody will run it: end its group, let the reaper reap it */
            kill(-r->pid, SIGKILL);
            int fds[4] = {r->pidfd, r->reads[0], r->reads[1], r->reads[2]};
            flowrun_close_all(fds, 4);
            pending_remove(r->pid);
        }
        pthread_mutex_lock(&g_lock);
        r->next = garbage;
        garbage = r;
        pthread_mutex_unlock(&g_lock);
    }
    else {
        int was_empty = c->done == NULL;
        r->next = c->done;
        c->done = r;
        if (was_empty) {
            uint64_t one = 1;
            ssize_t w = write(c->efd, &one, sizeof one);
            (void)w;
        }
        pthread_mutex_unlock(&c->lock);
    }
    core_release(c);
}

static void *
worker(void *unused)
{
    (void)unused;
    sigset_t empty;
    sigemptyset(&empty);
    for (;;) {
        pthread_mutex_lock(&q_lock);
        idle_threads++;
        while (q_head == NULL)
            pthread_cond_wait(&q_cond, &q_lock);
        idle_threads--;
        struct req *r = q_head;
        q_head = r->next;
        if (q_head == NULL)
            q_tail = NULL;
        pthread_mutex_unlock(&q_lock);
        struct child c;
        memset(&c, 0, sizeof c);
        c.argv = r->argv;
        c.execs = r->execs;
        c.n_execs = r->n_execs;
        c.envp = r->envp;
        c.cwd = r->cwd_b != NULL ? PyBytes_AS_STRING(r->cwd_b) : NULL;
        c.max_fd = max_fd_cached;
        pthread_rwlock_rdlock(&reap_lock);
        r->err = flowrun_spawn_child(&c, &empty, r->stdin_fd, &r->pid, &r->pidfd, r->reads);
        if (r->err == 0)
            pending_add(r->pid);
        pthread_rwlock_unlock(&reap_lock);
        r->stage = c.stage;
        finish(r);
    }
    return NULL;
}

/* with q_lock held: one more thread if none is idle and there is room */
static int
grow(void)
{
    if (idle_threads > 0 || n_threads >= max_threads)
        return 0;
    pthread_attr_t attr;
    pthread_t t;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* inherited: signals go to Python's threads */
    int e = pthread_create(&t, &attr, worker, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (e == 0)
        n_threads++;
    return e;
}

static void
before_fork(void)
{
    pthread_mutex_lock(&q_lock);
    pthread_mutex_lock(&p_lock);
}

static void
after_fork_parent(void)
{
    pthread_mutex_unlock(&p_lock);
    pthread_mutex_unlock(&q_lock);
}

static void
after_fork_child(void)
{
    /* a forked child has none of the pool's threads, and none of its children */
    pthread_mutex_init(&q_lock, NULL);
    pthread_mutex_init(&p_lock, NULL);
    n_threads = idle_threads = 0;
    q_head = q_tail = NULL;
    n_pending = 0;
}

typedef struct {
    PyObject_HEAD
    struct core *core;
} Spawner;

static int
Spawner_init(Spawner *self, PyObject *args, PyObject *kwds)
{
    if (!PyArg_ParseTuple(args, ":Spawner"))
        return -1;
    if (self->core != NULL)
        return 0;
    struct core *c = calloc(1, sizeof *c);
    if (c == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        free(c);
        return -1;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->refs = 1;
    self->core = c;
    return 0;
}

static void
Spawner_close_core(Spawner *self)
{
    struct core *c = self->core;
    if (c == NULL)
        return;
    self->core = NULL;
    pthread_mutex_lock(&c->lock);
    c->orphaned = 1;
    struct req *r = c->done;
    c->done = NULL;
    pthread_mutex_unlock(&c->lock);
    while (r != NULL) { /* finished, never collected: end them */
        struct req *next = r->next;
        if (r->err == 0) {
            kill(-r->pid, SIGKILL);
            int fds[4] = {r->pidfd, r->reads[0], r->reads[1], r->reads[2]};
            flowrun_close_all(fds, 4);
            pending_remove(r->pid);
        }
        free_req(r);
        r = next;
    }
    core_release(c);
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

static PyObject *
Spawner_fileno(Spawner *self, PyObject *unused)
{
    (void)unused;
    if (self->core == NULL) {
        PyErr_SetString(PyExc_ValueError, "closed Spawner");
        return NULL;
    }
    return PyLong_FromLong(self->core->efd);
}

static PyObject *
Spawner_submit(Spawner *self, PyObject *args)
{
    PyObject *key, *argv_o, *execs_o, *cwd_o, *items_o, *added_o;
    int stdin_fd;
    if (!PyArg_ParseTuple(args, "OOOOOO!i:submit", &key, &argv_o, &execs_o, &cwd_o, &items_o,
                          &PyDict_Type, &added_o, &stdin_fd))
        return NULL;
    if (self->core == NULL) {
        PyErr_SetString(PyExc_ValueError, "closed Spawner");
        return NULL;
    }
    if (stdin_fd < CHILD_FDS) {
        PyErr_SetString(PyExc_ValueError, "stdin_fd must be 4 or above");
        return NULL;
    }
    free_garbage();
    struct req *r = PyMem_RawCalloc(1, sizeof *r);
    if (r == NULL)
        return PyErr_NoMemory();
    r->keep = PyList_New(0);
    if (r->keep == NULL)
        goto error;
    Py_ssize_t n_items = PySequence_Size(items_o);
    if (n_items < 0 || (r->argv = to_cstrings(argv_o, r->keep, 0)) == NULL ||
        (r->execs = to_cstrings(execs_o, r->keep, 0)) == NULL ||
        (r->envp = to_cstrings(items_o, r->keep, PyDict_GET_SIZE(added_o))) == NULL ||
        add_env(r->envp, n_items, added_o, r->keep) < 0)
        goto error;
    if (cwd_o != Py_None && !PyUnicode_FSConverter(cwd_o, &r->cwd_b))
        goto error;
    r->n_execs = PySequence_Size(execs_o);
    r->stdin_fd = stdin_fd;
    r->pid = -1;
    r->pidfd = -1;
    max_fd();
    Py_INCREF(key);
    r->key = key;
    struct core *c = self->core;
    pthread_mutex_lock(&c->lock);
    c->refs++;
    pthread_mutex_unlock(&c->lock);
    r->core = c;
    pthread_mutex_lock(&q_lock);
    if (q_tail != NULL)
        q_tail->next = r;
    else
        q_head = r;
    q_tail = r;
    int e = grow();
    pthread_cond_signal(&q_cond);
    pthread_mutex_unlock(&q_lock);
    if (e != 0 && n_threads == 0) { /* no thread at all: it would wait for ever */
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError); /* (stays queued: started by a later one) */
    }
    Py_RETURN_NONE;
error:
    free_req(r);
    return NULL;
}

/* collect() -> [(key, pid, pidfd, out_r, err_r, ctl_r) | (key, None, errno, stage, 0, 0)] */
static PyObject *
Spawner_collect(Spawner *self, PyObject *unused)
{
    (void)unused;
    struct core *c = self->core;
    if (c == NULL)
        return PyList_New(0);
    free_garbage();
    pthread_mutex_lock(&c->lock);
    struct req *r = c->done;
    c->done = NULL;
    uint64_t count;
    ssize_t got = read(c->efd, &count, sizeof count);
    (void)got;
    pthread_mutex_unlock(&c->lock);
    PyObject *out = PyList_New(0);
    /* oldest first */
    struct req *prev = NULL;
    while (r != NULL) {
        struct req *next = r->next;
        r->next = prev;
        prev = r;
        r = next;
    }
    for (r = prev; r != NULL;) {
        struct req *next = r->next;
        PyObject *item = r->err == 0
            ? Py_BuildValue("(Oiiiii)", r->key, (int)r->pid, r->pidfd, r->reads[0], r->reads[1],
                            r->reads[2])
            : Py_BuildValue("(OOiiii)", r->key, Py_None, r->err, r->stage, 0, 0);
        if (out == NULL || item == NULL || PyList_Append(out, item) < 0) {
            /* out of memory: nothing sensible left but not to leak the descriptors */
            Py_XDECREF(item);
            if (r->err == 0) {
                int fds[4] = {r->pidfd, r->reads[0], r->reads[1], r->reads[2]};
                flowrun_close_all(fds, 4);
            }
        }
        else
            Py_DECREF(item);
        free_req(r);
        r = next;
    }
    return out;
}

static PyMethodDef Spawner_methods[] = {
    {"submit", (PyCFunction)Spawner_submit, METH_VARARGS,
     "submit(key, argv, executables, cwd, env_items, env_added, stdin_fd): start a handler on"
     " the pool; its result comes back with `key` from collect()."},
    {"collect", (PyCFunction)Spawner_collect, METH_NOARGS,
     "collect() -> the spawns finished since the last call, oldest first: (key, pid, pidfd,"
     " stdout, stderr, control) or (key, None, errno, stage, 0, 0); stage 1: the chdir."},
    {"fileno", (PyCFunction)Spawner_fileno, METH_NOARGS,
     "fileno() -> an eventfd, readable while collect() has something"},
    {"close", (PyCFunction)Spawner_close, METH_NOARGS,
     "close(): spawns finished or still to finish are ended (their groups killed)"},
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

static PyObject *
forget(PyObject *self, PyObject *pids)
{
    (void)self;
    PyObject *fast = PySequence_Fast(pids, "forget() takes a sequence of pids");
    if (fast == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        long pid = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        if (pid == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return NULL;
        }
        pending_remove((pid_t)pid);
    }
    Py_DECREF(fast);
    Py_RETURN_NONE;
}

static PyObject *
is_pending(PyObject *self, PyObject *arg)
{
    (void)self;
    long pid = PyLong_AsLong(arg);
    if (pid == -1 && PyErr_Occurred())
        return NULL;
    int found = 0;
    pthread_mutex_lock(&p_lock);
    for (size_t i = 0; i < n_pending && !found; i++)
        found = pending[i] == (pid_t)pid;
    pthread_mutex_unlock(&p_lock);
    return PyBool_FromLong(found);
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
        pthread_rwlock_wrlock(&reap_lock);
        Py_END_ALLOW_THREADS
    }
    else
        pthread_rwlock_unlock(&reap_lock);
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
    pthread_mutex_lock(&q_lock);
    max_threads = (int)n;
    pthread_mutex_unlock(&q_lock);
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
    PyModuleDef_HEAD_INIT, "_spawn",
    "Start an exec handler in one call without the GIL (runner.handlers.spawn).", -1, methods,
};

PyMODINIT_FUNC
PyInit__spawn(void)
{
    static int ready;
    if (!ready) {
        pthread_rwlockattr_t attr;
        pthread_rwlockattr_init(&attr);
        pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
        pthread_rwlock_init(&reap_lock, &attr);
        pthread_rwlockattr_destroy(&attr);
        pthread_atfork(before_fork, after_fork_parent, after_fork_child);
        ready = 1;
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
