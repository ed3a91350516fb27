/* runner.handlers._spawn: the pool of POSIX threads that start handlers, without Python.
 *
 * A `core` is one Spawner's state (its eventfd and its finished requests); a `req` one
 * handler to start. The binding (_spawn.c) fills a req (its arrays and its own Python
 * references, which the pool never touches: it embeds the req in a larger struct), hands
 * it to flowrun_pool_submit, and gets it back from flowrun_core_take (finished),
 * flowrun_core_close (never to be collected) or flowrun_pool_garbage (finished after its
 * core was closed), to free with the GIL held. No function here needs the GIL; none
 * calls Python. */
#ifndef FLOWRUN_SPAWN_POOL_H
#define FLOWRUN_SPAWN_POOL_H

#include <sys/types.h>

#include "_spawn_child.h"

struct core;

struct req {
    struct req *next;
    struct core *core;
    /* what to start (read by a pool thread; owned by the binding) */
    char **argv, **execs, **envp;
    ssize_t n_execs;
    const char *cwd; /* NULL: stay */
    int stdin_fd;
    int has_setup; /* setup applies */
    struct proc_setup setup;
    /* the result: err 0 (pid, pidfd or -1, reads = stdout, stderr, control read ends),
     * else an errno and the stage it failed at (_spawn_child.h) */
    int err, stage;
    pid_t pid;
    int pidfd, reads[3];
};

/* once per process: the reap lock, the fork handlers; 0 or an errno */
int flowrun_pool_init(void);

/* a new core (its eventfd close-on-exec, non-blocking), or NULL with errno set */
struct core *flowrun_core_new(void);
/* its eventfd: readable while flowrun_core_take has something */
int flowrun_core_fd(const struct core *c);
/* 0 for a core of this process, 1 for one created before a fork (never to be used) */
int flowrun_core_foreign(const struct core *c);

/* queue `r` (its core set here) and make sure a thread runs it: 0, or an errno with `r`
 * not queued (EBADF: a closed or foreign core; else no thread could be started) */
int flowrun_pool_submit(struct core *c, struct req *r);
/* the finished requests, oldest first (the eventfd read back to 0) */
struct req *flowrun_core_take(struct core *c);
/* the object lets go of `c`: returns the requests for the caller to free, those finished
 * ended (flowrun_req_end) and those still queued never started (err ECANCELED); those
 * in flight are ended by their thread and go to flowrun_pool_garbage. A foreign core
 * (see above) is left alone but for its eventfd: its children are the parent's. */
struct req *flowrun_core_close(struct core *c);
/* requests finished after their core was closed, for the caller to free */
struct req *flowrun_pool_garbage(void);

/* a started handler nobody will run: its group killed, its descriptors closed, no
 * longer pending (the reaper collects it) */
void flowrun_req_end(struct req *r);

/* pids started and not yet handed over (flowrun_pending_remove): the reaper leaves them */
void flowrun_pending_remove(pid_t pid);
int flowrun_pending_has(pid_t pid);
/* on: wait for the spawns under way, hold new ones back (blocks); off: let them go */
void flowrun_hold_reaps(int on);
/* the pool's size, 1 to 256 (default 4) */
void flowrun_pool_set_threads(int n);

#endif
