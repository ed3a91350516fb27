/* runner.handlers._spawn: a request (_spawn_pool.h) built from a submit's Python
 * arguments, with the Python objects its arrays point into. All with the GIL held. */
#ifndef FLOWRUN_SPAWN_REQ_H
#define FLOWRUN_SPAWN_REQ_H

#include <Python.h>

#include "_spawn_pool.h"

/* a request for argv (a sequence of str/bytes/path-like, not empty) tried as each of
 * execs (the same, not empty) in cwd (one of those or None) with the environment
 * env_items (b"key=value" items) + env_added (a dict: key -> value), holding a reference
 * to `key`; stdin_fd left to the caller. NULL with ValueError (a NUL byte, a name with
 * '=', an empty argv or execs), TypeError or MemoryError. */
struct req *flowrun_req_new(PyObject *key, PyObject *argv, PyObject *execs, PyObject *cwd,
                            PyObject *env_items, PyObject *env_added);
/* the child's set-up from `setup`, a tuple (limits, nice, uid, gid): limits a sequence
 * of (RLIMIT_* resource, soft, hard), nice -1 (leave) or 0-19, uid and gid -1 (leave) or
 * an id. 0, or -1 with TypeError/ValueError */
int flowrun_req_setup(struct req *r, PyObject *setup);
/* the key it was made with (borrowed) */
PyObject *flowrun_req_key(struct req *r);
/* a request and what it holds freed; a list of them (linked by `next`) */
void flowrun_req_free(struct req *r);
void flowrun_req_free_list(struct req *r);

#endif
