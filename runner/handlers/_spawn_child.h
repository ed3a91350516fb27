/* runner.handlers._spawn: one handler's start (pipes, vfork, the child's steps, pidfd),
 * without Python: called by the pool's threads (_spawn.c), which never hold the GIL. */
#ifndef FLOWRUN_SPAWN_CHILD_H
#define FLOWRUN_SPAWN_CHILD_H

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>

/* the handler's descriptors 0-3 (stdin, stdout, stderr, control); 4 and above closed */
#define CHILD_FDS 4

enum { STAGE_NONE = 0, STAGE_CHDIR = 1, STAGE_EXEC = 2, STAGE_OTHER = 3, STAGE_SETUP = 4 };

/* at most this many resource limits a handler */
#define CHILD_MAX_LIMITS 8

/* what the child sets up before its exec (after its descriptors, before its signal
 * mask): resource limits, niceness, then group (no supplementary groups) and user, with
 * raw system calls (the vfork child is the one thread of its process: glibc's set*id
 * would signal the parent's threads) */
struct proc_setup {
    int n_limits;
    int resource[CHILD_MAX_LIMITS];
    struct rlimit value[CHILD_MAX_LIMITS];
    int nice; /* -1: leave */
    long uid; /* -1: leave */
    long gid; /* -1: leave */
};

struct child {
    char *const *argv;
    char *const *execs; /* candidates, tried in order (a PATH search done by the caller) */
    ssize_t n_execs;
    char *const *envp;
    const char *cwd; /* NULL: stay */
    const struct proc_setup *setup; /* NULL: nothing to set up */
    int src[CHILD_FDS];
    const sigset_t *mask; /* the child's signal mask (set by flowrun_spawn_child) */
    unsigned int max_fd;  /* for the close loop without close_range (set there too) */
    /* written by the vfork child, read by the parent once it runs again */
    volatile int err;
    volatile int stage;
};

/* Three pipes, the child (see struct child), its pidfd (-1 without pidfd_open), the write
 * ends closed. Returns 0 with the read ends in reads[0..2] (stdout, stderr, control), or
 * an errno with c->stage saying where it failed (the child reaped, nothing left open). */
int flowrun_spawn_child(struct child *c, const sigset_t *child_mask, int stdin_fd,
                        pid_t *pid_out, int *pidfd_out, int reads[3]);

/* close each descriptor of fds[0..n) that is not -1, and set it to -1 */
void flowrun_close_all(int *fds, int n);

#endif
