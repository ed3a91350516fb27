/* runner.handlers._spawn: the pool (see _spawn_pool.h).
 *
 * Threads of our own, created on demand up to max_threads, detached, every signal
 * blocked (signals go to Python's threads), never taking the GIL. Each runs one request
 * at a time (flowrun_spawn_child: pipes, vfork, pidfd) and appends it to its core's done
 * list, writing the core's eventfd when that list goes from empty to non-empty.
 *
 * Locks, never nested: q_lock (the queue, the thread counts), each core's lock (its done
 * list, refs, orphaned), p_lock (pending pids), g_lock (garbage). reap_lock: spawns are
 * readers, the reaper's look at its children (flowrun_hold_reaps) the writer,
 * writer-preferring.
 *
 * fork(): the child has none of the pool's threads nor of the handlers they started. The
 * atfork handlers hold q_lock, p_lock and g_lock across the fork and start the child with
 * them (and the reap lock) fresh, an empty queue and pending list, and a new generation:
 * a core of an older generation (made before the fork) is foreign, its lock maybe held by
 * a thread that is no more and its handlers the parent's, so it is never locked, nor its
 * handlers killed, in the child.
 */
#define _GNU_SOURCE
#include "_spawn_pool.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "_spawn_child.h"

struct core {
    pthread_mutex_t lock;
    int efd;          /* eventfd: written when `done` goes from empty to non-empty */
    struct req *done; /* finished spawns, newest first */
    int refs;         /* the Python object + the requests queued or in flight */
    int orphaned;     /* the Python object is gone: end what is finished */
    unsigned gen;     /* the process generation (fork count) it was made in */
};

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
static struct req *q_head, *q_tail;
static int n_threads, idle_threads, max_threads = 4;
static pthread_rwlock_t reap_lock;
static pthread_mutex_t p_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t *pending;
static size_t n_pending, cap_pending;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct req *garbage;
static unsigned gen; /* bumped in a forked child */

static void
init_reap_lock(void)
{
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&reap_lock, &attr);
    pthread_rwlockattr_destroy(&attr);
}

static void
core_release(struct core *c, int n)
{
    pthread_mutex_lock(&c->lock);
    int left = c->refs -= n;
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

void
flowrun_pending_remove(pid_t pid)
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

int
flowrun_pending_has(pid_t pid)
{
    int found = 0;
    pthread_mutex_lock(&p_lock);
    for (size_t i = 0; i < n_pending && !found; i++)
        found = pending[i] == pid;
    pthread_mutex_unlock(&p_lock);
    return found;
}

void
flowrun_req_end(struct req *r)
{
    if (r->err != 0 || r->pid <= 0)
        return;
    kill(-r->pid, SIGKILL);
    int fds[4] = {r->pidfd, r->reads[0], r->reads[1], r->reads[2]};
    flowrun_close_all(fds, 4);
    r->pidfd = r->reads[0] = r->reads[1] = r->reads[2] = -1;
    flowrun_pending_remove(r->pid);
}

static void
finish(struct req *r)
{
    struct core *c = r->core;
    pthread_mutex_lock(&c->lock);
    if (c->orphaned) {
        pthread_mutex_unlock(&c->lock);
        flowrun_req_end(r); /* nobody will run it */
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
            (void)w; /* cannot fail: the counter is read back to 0 by every take */
        }
        pthread_mutex_unlock(&c->lock);
    }
    core_release(c, 1);
}

static void *
worker(void *unused)
{
    (void)unused;
    sigset_t empty; /* the handler's mask: nothing blocked */
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
        c.cwd = r->cwd;
        c.setup = r->has_setup ? &r->setup : NULL;
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

/* with q_lock held: one more thread if none is idle and there is room; 0 or an errno */
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

int
flowrun_pool_submit(struct core *c, struct req *r)
{
    if (c->gen != gen)
        return EBADF;
    pthread_mutex_lock(&c->lock);
    int closed = c->orphaned;
    if (!closed)
        c->refs++;
    pthread_mutex_unlock(&c->lock);
    if (closed)
        return EBADF;
    r->core = c;
    r->next = NULL;
    r->err = 0;
    r->pid = -1;
    r->pidfd = -1;
    r->reads[0] = r->reads[1] = r->reads[2] = -1;
    pthread_mutex_lock(&q_lock);
    int e = grow();
    if (e != 0 && n_threads == 0) { /* no thread at all: it would wait for ever */
        pthread_mutex_unlock(&q_lock);
        core_release(c, 1);
        return e;
    }
    if (q_tail != NULL)
        q_tail->next = r;
    else
        q_head = r;
    q_tail = r;
    pthread_cond_signal(&q_cond);
    pthread_mutex_unlock(&q_lock);
    return 0;
}

struct core *
flowrun_core_new(void)
{
    struct core *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->efd < 0) {
        int e = errno;
        free(c);
        errno = e;
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->refs = 1;
    c->gen = gen;
    return c;
}

int
flowrun_core_fd(const struct core *c)
{
    return c->efd;
}

int
flowrun_core_foreign(const struct core *c)
{
    return c->gen != gen;
}

/* a list linked through `next`, reversed */
static struct req *
reversed(struct req *r)
{
    struct req *prev = NULL;
    while (r != NULL) {
        struct req *next = r->next;
        r->next = prev;
        prev = r;
        r = next;
    }
    return prev;
}

struct req *
flowrun_core_take(struct core *c)
{
    if (c->gen != gen)
        return NULL;
    pthread_mutex_lock(&c->lock);
    struct req *r = c->done;
    c->done = NULL;
    uint64_t count;
    ssize_t got = read(c->efd, &count, sizeof count); /* EAGAIN when nothing: fine */
    (void)got;
    pthread_mutex_unlock(&c->lock);
    return reversed(r);
}

struct req *
flowrun_core_close(struct core *c)
{
    if (c->gen != gen) { /* made before a fork: its lock and its handlers are not ours */
        close(c->efd);
        return NULL;
    }
    /* the queued ones: never started (no handler to kill afterwards, keys freed now) */
    struct req *out = NULL, **link = &q_head, *last = NULL;
    int n_queued = 0;
    pthread_mutex_lock(&q_lock);
    while (*link != NULL) {
        struct req *r = *link;
        if (r->core == c) {
            *link = r->next;
            r->err = ECANCELED;
            r->next = out;
            out = r;
            n_queued++;
        }
        else {
            last = r;
            link = &r->next;
        }
    }
    q_tail = last;
    pthread_mutex_unlock(&q_lock);
    pthread_mutex_lock(&c->lock);
    c->orphaned = 1;
    struct req *r = c->done;
    c->done = NULL;
    pthread_mutex_unlock(&c->lock);
    while (r != NULL) { /* finished, never collected: end them */
        struct req *next = r->next;
        flowrun_req_end(r);
        r->next = out;
        out = r;
        r = next;
    }
    core_release(c, n_queued + 1);
    return out;
}

struct req *
flowrun_pool_garbage(void)
{
    if (__atomic_load_n(&garbage, __ATOMIC_RELAXED) == NULL) /* the common case */
        return NULL;
    pthread_mutex_lock(&g_lock);
    struct req *r = garbage;
    garbage = NULL;
    pthread_mutex_unlock(&g_lock);
    return r;
}

void
flowrun_hold_reaps(int on)
{
    if (on)
        pthread_rwlock_wrlock(&reap_lock);
    else
        pthread_rwlock_unlock(&reap_lock);
}

void
flowrun_pool_set_threads(int n)
{
    pthread_mutex_lock(&q_lock);
    max_threads = n;
    pthread_mutex_unlock(&q_lock);
}

static void
before_fork(void)
{
    pthread_mutex_lock(&q_lock);
    pthread_mutex_lock(&p_lock);
    pthread_mutex_lock(&g_lock);
}

static void
after_fork_parent(void)
{
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&p_lock);
    pthread_mutex_unlock(&q_lock);
}

static void
after_fork_child(void)
{
    pthread_mutex_init(&q_lock, NULL);
    pthread_cond_init(&q_cond, NULL);
    pthread_mutex_init(&p_lock, NULL);
    pthread_mutex_init(&g_lock, NULL);
    init_reap_lock();
    n_threads = idle_threads = 0;
    q_head = q_tail = NULL; /* the parent's requests: leaked, never freed here */
    n_pending = 0;
    garbage = NULL;
    gen++;
}

int
flowrun_pool_init(void)
{
    static int ready;
    if (ready)
        return 0;
    init_reap_lock();
    int e = pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    if (e == 0)
        ready = 1;
    return e;
}
