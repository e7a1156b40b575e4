/* Every exec kind of an asynchronous group from C, and what collect and the
 * member see for each (xtc_batch(3): B-065..B-090, B-094, B-097):
 * INLINE; FENCE with a bad fd; FUTURE resolved from a pthread, set with an
 * error, or dropped; BLOCKING on the pool; an unknown or unfilled kind
 * (XTC_E_INVAL as a negative exec_status); submit and collect returning
 * invalid error values; a FUTURE wait ended by exec_timeout_ns; and
 * close(XTC_BATCH_CANCEL) ending a FUTURE wait after a cancel_hint.
 *
 * Build: cc -std=c11 -Iinclude examples/c/exec_kinds.c target/release/libxtc_capi.a -lpthread -ldl -lm
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "xtc_batch.h"

static const char *name(int rc) {
    switch (rc) {
    case XTC_OK: return "XTC_OK"; /* == XTC_BATCH_EXEC_OK */
    case XTC_BATCH_EXEC_TIMEOUT: return "XTC_BATCH_EXEC_TIMEOUT";
    case XTC_BATCH_EXEC_ABORTED: return "XTC_BATCH_EXEC_ABORTED";
    case XTC_E_INVAL: return "XTC_E_INVAL";
    case XTC_E_RANGE: return "XTC_E_RANGE";
    case XTC_E_AGAIN: return "XTC_E_AGAIN";
    case XTC_E_NOMEM: return "XTC_E_NOMEM";
    case XTC_E_ABORTED: return "XTC_E_ABORTED";
    case XTC_E_INTERNAL: return "XTC_E_INTERNAL";
    case 999: return "(not called)";
    default: return "other";
    }
}

static void check(const char *what, int rc) {
    if (rc != XTC_OK) {
        printf("%s failed: %s\n", what, name(rc));
        exit(1);
    }
}

enum mode {
    INLINE,
    UNFILLED,
    UNKNOWN_KIND,
    FENCE_NEGATIVE_FD,
    FENCE_BAD_FD,
    FUTURE_NULL,
    FUTURE_FROM_PTHREAD,
    FUTURE_SET_RANGE,
    FUTURE_PROMISE_DROPPED,
    BLOCKING_OK,
    BLOCKING_NOMEM,
    BLOCKING_INVALID,
    SUBMIT_RETURNS_INVALID,
    COLLECT_RETURNS_INVALID,
    N_MODE
};

static const char *mode_name[N_MODE] = {
    "INLINE",
    "kind left unfilled",
    "unknown kind 99",
    "FENCE fd -1",
    "FENCE fd 1000 (not open)",
    "FUTURE NULL",
    "FUTURE set XTC_OK by a pthread",
    "FUTURE set XTC_E_RANGE",
    "FUTURE, promise dropped",
    "BLOCKING run returns XTC_OK",
    "BLOCKING run returns XTC_E_NOMEM",
    "BLOCKING run returns 12345",
    "submit returns 12345",
    "collect returns -7",
};

struct req {
    enum mode mode;
    int status;  /* exec_status collect saw; 999: collect not called */
    int outcome; /* what complete got */
};

struct ctx {
    pthread_t setter;
    xtc_promise_t *promise;
    int hints;
};

static void *set_ok(void *arg) {
    struct ctx *c = arg;
    if (xtc_promise_set(c->promise, XTC_OK) != XTC_OK) {
        abort();
    }
    return NULL;
}

static int run_ok(void *arg) { (void)arg; return XTC_OK; }
static int run_nomem(void *arg) { (void)arg; return XTC_E_NOMEM; }
static int run_invalid(void *arg) { (void)arg; return 12345; }

static int submit(const xtc_batch_item_t *items, size_t count, void *user,
                  xtc_batch_exec_t *x) {
    (void)count; /* max_active 1 */
    struct ctx *c = user;
    struct req *r = items[0].request;
    xtc_future_t *f = NULL;
    switch (r->mode) {
    case INLINE: x->kind = XTC_BATCH_EXEC_INLINE; break;
    case UNFILLED: break;
    case UNKNOWN_KIND: x->kind = 99; break;
    case FENCE_NEGATIVE_FD: x->kind = XTC_BATCH_EXEC_FENCE; x->fence_fd = -1; break;
    case FENCE_BAD_FD: x->kind = XTC_BATCH_EXEC_FENCE; x->fence_fd = 1000; break;
    case FUTURE_NULL: x->kind = XTC_BATCH_EXEC_FUTURE; x->future = NULL; break;
    case FUTURE_FROM_PTHREAD:
        check("pair", xtc_future_new_pair(&f, &c->promise));
        if (pthread_create(&c->setter, NULL, set_ok, c) != 0) {
            abort();
        }
        x->kind = XTC_BATCH_EXEC_FUTURE, x->future = f;
        break;
    case FUTURE_SET_RANGE:
        check("pair", xtc_future_new_pair(&f, &c->promise));
        check("set", xtc_promise_set(c->promise, XTC_E_RANGE));
        x->kind = XTC_BATCH_EXEC_FUTURE, x->future = f;
        break;
    case FUTURE_PROMISE_DROPPED:
        check("pair", xtc_future_new_pair(&f, &c->promise));
        xtc_promise_drop(c->promise);
        x->kind = XTC_BATCH_EXEC_FUTURE, x->future = f;
        break;
    case BLOCKING_OK: x->kind = XTC_BATCH_EXEC_BLOCKING, x->run = run_ok; break;
    case BLOCKING_NOMEM: x->kind = XTC_BATCH_EXEC_BLOCKING, x->run = run_nomem; break;
    case BLOCKING_INVALID: x->kind = XTC_BATCH_EXEC_BLOCKING, x->run = run_invalid; break;
    case SUBMIT_RETURNS_INVALID: return 12345;
    case COLLECT_RETURNS_INVALID: x->kind = XTC_BATCH_EXEC_INLINE; break;
    default: break;
    }
    return XTC_OK;
}

static int collect(const xtc_batch_item_t *items, xtc_batch_result_t *results, size_t count,
                   int exec_status, void *user) {
    (void)count;
    struct ctx *c = user;
    struct req *r = items[0].request;
    r->status = exec_status;
    if (r->mode == FUTURE_FROM_PTHREAD) {
        pthread_join(c->setter, NULL);
    }
    results[0].state = XTC_BATCH_DONE;
    return r->mode == COLLECT_RETURNS_INVALID ? -7 : XTC_OK;
}

static void complete(uint64_t handle, void *request, int outcome, void *user) {
    (void)handle;
    (void)user;
    ((struct req *)request)->outcome = outcome;
}

/* Groups 2 and 3: a FUTURE nobody resolves (the promise stays in the ctx). */
static int submit_never(const xtc_batch_item_t *items, size_t count, void *user,
                        xtc_batch_exec_t *x) {
    (void)items, (void)count;
    struct ctx *c = user;
    xtc_future_t *f = NULL;
    check("pair", xtc_future_new_pair(&f, &c->promise));
    x->kind = XTC_BATCH_EXEC_FUTURE, x->future = f;
    return XTC_OK;
}

static int collect_continue(const xtc_batch_item_t *items, xtc_batch_result_t *results,
                            size_t count, int exec_status, void *user) {
    (void)count, (void)user;
    ((struct req *)items[0].request)->status = exec_status;
    results[0].state = XTC_BATCH_CONTINUE; /* after TIMEOUT this ends XTC_E_AGAIN */
    return XTC_OK;
}

/* Group 3: close(XTC_BATCH_CANCEL) from a loop process during a FUTURE wait. */
static xtc_batch_t *cancelled_group;
static void hint(uint64_t handle, void *user) {
    (void)handle;
    ((struct ctx *)user)->hints++;
}
static void close_cancel(int status, void *arg) {
    (void)status;
    *(int *)arg = xtc_batch_close(cancelled_group, XTC_BATCH_CANCEL);
}

int main(void) {
    xtc_loop_t *loop = NULL;
    check("xtc_loop_new", xtc_loop_new(&loop));
    struct ctx c = {0};
    xtc_batch_async_opts_t opts = {
        .size = sizeof opts,
        .version = XTC_BATCH_VERSION,
        .capacity = N_MODE,
        .max_active = 1,
        .resource_capacity = 1,
        .submit = submit,
        .collect = collect,
        .complete = complete,
        .user = &c,
    };
    xtc_batch_t *group = NULL;
    check("create", xtc_batch_create_async(loop, &opts, &group));
    struct req reqs[N_MODE];
    for (int i = 0; i < N_MODE; i++) {
        uint64_t h;
        reqs[i] = (struct req){.mode = (enum mode)i, .status = 999, .outcome = 1};
        check("submit", xtc_batch_submit(group, &reqs[i], 1, &h));
    }
    check("close", xtc_batch_close(group, XTC_BATCH_DRAIN));

    struct ctx c2 = {0};
    xtc_batch_async_opts_t o2 = opts;
    o2.capacity = 1, o2.exec_timeout_ns = 1000000; /* 1 ms */
    o2.submit = submit_never, o2.collect = collect_continue, o2.user = &c2;
    xtc_batch_t *timed = NULL;
    check("create", xtc_batch_create_async(loop, &o2, &timed));
    struct req tr = {.status = 999, .outcome = 1};
    uint64_t h;
    check("submit", xtc_batch_submit(timed, &tr, 1, &h));
    check("close", xtc_batch_close(timed, XTC_BATCH_DRAIN));

    struct ctx c3 = {0};
    xtc_batch_async_opts_t o3 = o2;
    o3.exec_timeout_ns = 0, o3.cancel_hint = hint, o3.user = &c3;
    check("create", xtc_batch_create_async(loop, &o3, &cancelled_group));
    struct req cr = {.status = 999, .outcome = 1};
    check("submit", xtc_batch_submit(cancelled_group, &cr, 1, &h));
    /* Runs after the driver parked on the FUTURE: the driver was spawned
     * first, and one loop runs its processes in spawn order. */
    xtc_future_t *now = NULL;
    xtc_promise_t *now_p = NULL;
    int close_rc = 1;
    check("pair", xtc_future_new_pair(&now, &now_p));
    check("set", xtc_promise_set(now_p, XTC_OK));
    check("await", xtc_loop_await(loop, now, close_cancel, &close_rc));

    check("xtc_loop_run", xtc_loop_run(loop));

    for (int i = 0; i < N_MODE; i++) {
        printf("%-34s collect saw %-24s member ends %s\n", mode_name[i], name(reqs[i].status),
               name(reqs[i].outcome));
    }
    xtc_batch_async_stats_t ast = {.size = sizeof ast, .version = XTC_BATCH_VERSION};
    check("stats", xtc_batch_get_async_stats(group, &ast));
    printf("async stats: offloads=%" PRIu64 " offload_errors=%" PRIu64
           " offload_timeouts=%" PRIu64 "\n",
           ast.offloads, ast.offload_errors, ast.offload_timeouts);

    printf("%-34s collect saw %-24s member ends %s\n", "FUTURE never set, 1 ms timeout",
           name(tr.status), name(tr.outcome));
    ast = (xtc_batch_async_stats_t){.size = sizeof ast, .version = XTC_BATCH_VERSION};
    check("stats", xtc_batch_get_async_stats(timed, &ast));
    printf("  offload_timeouts=%" PRIu64 "\n", ast.offload_timeouts);
    /* Resolving it after its group gave up on it (and after destroy) is harmless (B-075). */

    printf("%-34s close %s, hints %d, collect saw %s, member ends %s\n",
           "close(CANCEL) during a FUTURE wait", name(close_rc), c3.hints, name(cr.status),
           name(cr.outcome));

    check("destroy", xtc_batch_destroy(group));
    check("destroy", xtc_batch_destroy(timed));
    check("destroy", xtc_batch_destroy(cancelled_group));
    check("late promise_set", xtc_promise_set(c2.promise, XTC_OK));
    xtc_promise_drop(c3.promise);
    check("fini", xtc_loop_fini(loop));
    printf("done\n");
    return 0;
}
