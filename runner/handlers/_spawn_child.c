/* runner.handlers._spawn: one handler's start, without Python (see _spawn_child.h).
 *
 * The child's steps are CPython's _posixsubprocess's with vfork (same order, same errors:
 * the first errno of the candidate paths that is not ENOENT/ENOTDIR), but an exec
 * failure comes back as an errno through the memory a vfork child shares with its parent
 * instead of an error pipe.
 */
#define _GNU_SOURCE
#include "_spawn_child.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

static void
reset_signals(const sigset_t *mask)
{
    /* A handler the parent installed must not run in the child before its exec (they
     * share memory): back to the default for every signal the child's mask lets in. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < _NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP || sigismember(mask, sig) == 1)
            continue;
        struct sigaction sa;
        if (sigaction(sig, NULL, &sa) == -1)
            continue;
        void *h = (sa.sa_flags & SA_SIGINFO) ? (void *)sa.sa_sigaction : (void *)sa.sa_handler;
        if (h == (void *)SIG_IGN || h == (void *)SIG_DFL)
            continue;
        (void)sigaction(sig, &dfl, NULL);
    }
}

/* limits, niceness, group and user (see struct proc_setup): 0, or -1 with errno set */
static int
apply_setup(const struct proc_setup *s)
{
    for (int i = 0; i < s->n_limits; i++) {
        if (setrlimit(s->resource[i], &s->value[i]) < 0)
            return -1;
    }
    if (s->nice >= 0 && setpriority(PRIO_PROCESS, 0, s->nice) < 0)
        return -1;
    if (s->gid >= 0) {
        if (syscall(SYS_setgroups, 0, NULL) < 0)
            return -1;
        if (syscall(SYS_setresgid, (gid_t)s->gid, (gid_t)s->gid, (gid_t)s->gid) < 0)
            return -1;
    }
    if (s->uid >= 0 && syscall(SYS_setresuid, (uid_t)s->uid, (uid_t)s->uid, (uid_t)s->uid) < 0)
        return -1;
    return 0;
}

/* The vfork child: only async-signal-safe calls, nothing written but c->err/c->stage
 * and its own frame. Never inlined (nor vfork_child): its locals then live below the
 * frame of the function that called vfork, which the parent uses again once it runs. */
__attribute__((noinline, noreturn)) static void
child_exec(struct child *c)
{
    int sig_restore[] = {SIGPIPE, SIGXFSZ}; /* Python ignores them; Popen restores them */
    for (int i = 0; i < CHILD_FDS; i++) {
        if (dup2(c->src[i], i) < 0)
            goto fail;
    }
    if (c->cwd != NULL && chdir(c->cwd) < 0) {
        c->err = errno;
        c->stage = STAGE_CHDIR;
        _exit(127);
    }
    for (size_t i = 0; i < sizeof sig_restore / sizeof sig_restore[0]; i++)
        signal(sig_restore[i], SIG_DFL);
    if (setsid() < 0)
        goto fail;
    if (syscall(SYS_close_range, CHILD_FDS, ~0U, 0) < 0) {
        if (c->max_fd == 0) /* close_range was there: fail rather than leave any open */
            goto fail;
        for (unsigned int fd = CHILD_FDS; fd < c->max_fd; fd++)
            close(fd);
    }
    if (c->setup != NULL && apply_setup(c->setup) < 0) {
        c->err = errno;
        c->stage = STAGE_SETUP;
        _exit(127);
    }
    reset_signals(c->mask);
    if (pthread_sigmask(SIG_SETMASK, c->mask, NULL) != 0)
        goto fail;
    int saved = 0;
    for (ssize_t i = 0; i < c->n_execs; i++) {
        execve(c->execs[i], c->argv, c->envp);
        if (errno != ENOENT && errno != ENOTDIR && saved == 0)
            saved = errno;
    }
    c->err = saved ? saved : (c->n_execs > 0 ? errno : ENOENT);
    c->stage = STAGE_EXEC;
    _exit(127);
fail:
    c->err = errno;
    c->stage = STAGE_OTHER;
    _exit(127);
}

/* As CPython's _posixsubprocess isolates its vfork in do_fork_exec (3.11): the child
 * runs on this thread's stack while the parent is suspended, so vfork is called from a
 * frame of its own, holding nothing the parent needs, never inlined into its caller. */
__attribute__((noinline)) static pid_t
vfork_child(struct child *c)
{
    pid_t pid = vfork();
    if (pid == 0)
        child_exec(c); /* never returns */
    return pid;
}

/* the highest descriptor number + 1 the close loop must cover (no close_range) */
static unsigned int
fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        return rl.rlim_cur > 1U << 30 ? 1U << 30 : (unsigned int)rl.rlim_cur;
    long m = sysconf(_SC_OPEN_MAX);
    return m > 0 && m < 1L << 30 ? (unsigned int)m : 1U << 16;
}

/* whether the kernel has close_range (Linux 5.9), asked once: without it the child's
 * close loop needs fd_limit(), a system call per spawn otherwise saved */
static int
has_close_range(void)
{
    static int known; /* 0: not asked yet, 1: yes, 2: no */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k == 0) {
        k = syscall(SYS_close_range, ~0U, ~0U, 0) == 0 ? 1 : 2; /* closes nothing */
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k == 1;
}

/* Make `fd` 4 or above (the child's 0-3 are dup2 targets); close-on-exec. */
static int
lift(int fd)
{
    if (fd >= CHILD_FDS)
        return fd;
    int up = fcntl(fd, F_DUPFD_CLOEXEC, CHILD_FDS);
    int e = errno;
    close(fd);
    errno = e;
    return up;
}

void
flowrun_close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
    }
}

/* see _spawn_child.h */
int
flowrun_spawn_child(struct child *c, const sigset_t *child_mask, int stdin_fd, pid_t *pid_out,
                    int *pidfd_out, int reads[3])
{
    int ends[6] = {-1, -1, -1, -1, -1, -1}; /* (read, write) x stdout, stderr, control */
    int err = 0;
    pid_t pid = -1;
    for (int i = 0; i < 3; i++) {
        if (pipe2(ends + 2 * i, O_CLOEXEC) < 0 || (ends[2 * i + 1] = lift(ends[2 * i + 1])) < 0) {
            err = errno;
            goto fail;
        }
    }
    c->src[0] = stdin_fd;
    c->src[1] = ends[1];
    c->src[2] = ends[3];
    c->src[3] = ends[5];
    sigset_t all, old;
    sigfillset(&all);
    if ((err = pthread_sigmask(SIG_BLOCK, &all, &old)) != 0)
        goto fail;
    c->mask = child_mask;
    c->max_fd = has_close_range() ? 0 : fd_limit();
    c->err = 0;
    c->stage = STAGE_NONE;
    pid = vfork_child(c);
    err = pid < 0 ? errno : 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        c->stage = STAGE_OTHER;
        goto fail;
    }
    if (c->err) {
        err = c->err;
        goto reap;
    }
    close(ends[1]);
    close(ends[3]);
    close(ends[5]);
    *pid_out = pid;
    /* -1 (the caller polls for the exit instead) when the kernel has no pidfd_open
     * (ENOSYS before Linux 5.3: not asked again) or it fails (EMFILE) */
    static int no_pidfd;
    *pidfd_out = -1;
    if (!__atomic_load_n(&no_pidfd, __ATOMIC_RELAXED)) {
        *pidfd_out = (int)syscall(SYS_pidfd_open, pid, 0);
        if (*pidfd_out < 0 && errno == ENOSYS)
            __atomic_store_n(&no_pidfd, 1, __ATOMIC_RELAXED);
    }
    reads[0] = ends[0];
    reads[1] = ends[2];
    reads[2] = ends[4];
    return 0;
reap:
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
fail:
    flowrun_close_all(ends, 6);
    return err;
}
