/* Native helper threads for a batch's renders (run_batch_on in module.c).
 *
 * A batch of the loader renders on N threads. With Python threads as helpers, each one needs the GIL to wake up,
 * call run_batch and report back: a few microseconds per helper and batch with the GIL held, which grows with N
 * and is serial. Here the helpers are POSIX threads that never touch the interpreter: the caller releases the GIL
 * once, hands the batch's work function to the parked helpers, takes its own share, and waits for them.
 *
 * One batch at a time (the `use` lock; a second caller waits for it, the GIL released). Helpers are started as
 * the thread counts asked for grow, with every asynchronous signal blocked (those stay with the interpreter's
 * threads), and park on a condition between batches. A helper that cannot be started leaves the batch to fewer
 * threads. After a fork, the child has none of the parent's helpers: its pool starts empty (pthread_atfork). */

#include <Python.h>

#include "native.h"

#ifndef _WIN32
#include <pthread.h>
#include <signal.h>
#include <stdint.h>

#define MAX_HELPERS 1024

static struct {
    pthread_mutex_t use; /* held by the caller of the batch being run */
    pthread_mutex_t mu;  /* guards the fields below */
    pthread_cond_t wake, finished;
    int started;         /* helpers running */
    unsigned long round; /* bumped for each batch */
    int seats;           /* helpers that take part in this round (the first `seats` of them) */
    int busy;            /* of those, still working */
    nano_share_fn fn;
    void *arg;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          0, 0, 0, 0, NULL, NULL};

/* the round each helper was started in (it takes part only in later ones) */
static unsigned long born[MAX_HELPERS];
static int atfork_set;

static void pool_reset_in_child(void) {
    pthread_mutex_init(&pool.use, NULL);
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.finished, NULL);
    pool.started = 0;
    pool.round = 0;
    pool.seats = pool.busy = 0;
    pool.fn = NULL;
    pool.arg = NULL;
}

#ifdef __linux__
#include <errno.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The helpers run this much below the process's own priority (sysinfo.LOADER_NICE; Linux sets it per thread): the
 * training thread gets a core back at once, and the renders take what the step leaves. */
#define LOADER_NICE 10

static void lower_this_thread(void) {
    errno = 0;
    int base = getpriority(PRIO_PROCESS, (id_t)getpid()); /* (the main thread's: the process's own) */
    if (base == -1 && errno != 0)
        return;
    int nice = base + LOADER_NICE > 19 ? 19 : base + LOADER_NICE;
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice); /* (a refusal leaves it as it is) */
}
#else
static void lower_this_thread(void) {}
#endif

static void *helper_main(void *index_arg) {
    int index = (int)(intptr_t)index_arg;
    lower_this_thread();
    pthread_mutex_lock(&pool.mu);
    unsigned long last = born[index];
    for (;;) {
        while (pool.round == last)
            pthread_cond_wait(&pool.wake, &pool.mu);
        last = pool.round;
        if (index >= pool.seats)
            continue;
        nano_share_fn fn = pool.fn;
        void *arg = pool.arg;
        pthread_mutex_unlock(&pool.mu);
        fn(arg);
        pthread_mutex_lock(&pool.mu);
        if (--pool.busy == 0)
            pthread_cond_signal(&pool.finished);
    }
    return NULL;
}

/* Helpers up to `want` (called holding `use`, not `mu`); how many run. */
static int ensure_helpers(int want) {
    if (want > MAX_HELPERS)
        want = MAX_HELPERS;
    if (pool.started >= want)
        return pool.started;
    if (!atfork_set) {
        if (pthread_atfork(NULL, NULL, pool_reset_in_child) != 0)
            return pool.started; /* no fork safety: no helpers */
        atfork_set = 1;
    }
    /* every signal blocked but the synchronous ones a fault raises in the faulting thread itself, which
     * Python's faulthandler reports as it would from a Python thread */
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    sigdelset(&all, SIGABRT);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_mutex_lock(&pool.mu); /* (a new helper waits for it before it reads its round) */
    while (pool.started < want) {
        pthread_t t;
        born[pool.started] = pool.round;
        if (pthread_create(&t, &attr, helper_main, (void *)(intptr_t)pool.started) != 0)
            break;
        pool.started++;
    }
    int started = pool.started;
    pthread_mutex_unlock(&pool.mu);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return started;
}

int nano_run_shared(nano_share_fn fn, void *arg, int n_threads) {
    if (n_threads <= 1) {
        fn(arg);
        return 1;
    }
    pthread_mutex_lock(&pool.use);
    int helpers = ensure_helpers(n_threads - 1);
    if (helpers > n_threads - 1)
        helpers = n_threads - 1;
    pthread_mutex_lock(&pool.mu);
    pool.fn = fn;
    pool.arg = arg;
    pool.seats = helpers;
    pool.busy = helpers;
    pool.round++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    fn(arg);
    pthread_mutex_lock(&pool.mu);
    while (pool.busy > 0)
        pthread_cond_wait(&pool.finished, &pool.mu);
    pool.fn = NULL;
    pool.arg = NULL;
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.use);
    return helpers + 1;
}

int nano_helpers_started(void) {
    pthread_mutex_lock(&pool.mu);
    int n = pool.started;
    pthread_mutex_unlock(&pool.mu);
    return n;
}

#else /* no POSIX threads: the caller alone */

int nano_run_shared(nano_share_fn fn, void *arg, int n_threads) {
    (void)n_threads;
    fn(arg);
    return 1;
}

int nano_helpers_started(void) { return 0; }

#endif
