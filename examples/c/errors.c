/* The error cases of xtc_batch(3) that only a C ABI can reach, each with the
 * code the manual page gives it (B-006, B-009..B-012, B-015, B-019, B-035..B-037,
 * B-041, B-050, B-056, B-061, B-104, B-107, B-180..B-185):
 * descriptor size and version, NULL arguments, an invalid close mode, a step
 * returning an invalid error value or invalid result words, and the lifetime
 * errors.
 *
 * Build: cc -std=c11 -Iinclude examples/c/errors.c target/release/libxtc_capi.a -lpthread -ldl -lm
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xtc_batch.h"

static const char *name(int rc) {
    switch (rc) {
    case XTC_OK: return "XTC_OK";
    case XTC_E_INVAL: return "XTC_E_INVAL";
    case XTC_E_VERSION: return "XTC_E_VERSION";
    case XTC_E_RANGE: return "XTC_E_RANGE";
    case XTC_E_AGAIN: return "XTC_E_AGAIN";
    case XTC_E_DEADLK: return "XTC_E_DEADLK";
    case XTC_E_NOMEM: return "XTC_E_NOMEM";
    case XTC_E_NOSYS: return "XTC_E_NOSYS";
    case XTC_E_ABORTED: return "XTC_E_ABORTED";
    case XTC_E_INTERNAL: return "XTC_E_INTERNAL";
    default: return "not an XTC code";
    }
}

static void check(const char *what, int rc) {
    if (rc != XTC_OK) {
        printf("%s failed: %s\n", what, name(rc));
        exit(1);
    }
}

static void expect(const char *what, int rc, int want) {
    printf("%-52s %s%s\n", what, name(rc), rc == want ? "" : "  <-- UNEXPECTED");
}

/* A request says what the step does with it. */
enum how {
    RETURN_INVALID_POSITIVE, /* step returns 12345 */
    RETURN_INVALID_NEGATIVE, /* step returns -7 */
    RETURN_RANGE,            /* step returns XTC_E_RANGE: an existing code */
    ERROR_WITHOUT_CODE,      /* ERROR with error 0 */
    ERROR_WITH_BAD_CODE,     /* ERROR with error 3 */
    ERROR_AGAIN,             /* ERROR with XTC_E_AGAIN */
    UNKNOWN_STATE,           /* state 42 */
    LEFT_UNSET,              /* result word not written */
    MUTATE_IN_CALLBACK,      /* submit and get_stats from inside the step, then DONE */
    N_HOW
};

static const char *how_name[N_HOW] = {
    "step returns 12345 (invalid error value)",
    "step returns -7 (invalid error value)",
    "step returns XTC_E_RANGE",
    "result ERROR with error 0",
    "result ERROR with error 3",
    "result ERROR with XTC_E_AGAIN",
    "result state 42",
    "result left UNSET",
    "submit from inside the step (then DONE)",
};

struct req {
    enum how how;
    int outcome;
};

static xtc_batch_t *group;
static int in_callback_submit = 1, in_callback_stats = 1;

static int step(const xtc_batch_item_t *items, xtc_batch_result_t *results, size_t count,
                void *user) {
    (void)user;
    (void)count; /* max_active 1: one member per vector */
    struct req *r = items[0].request;
    switch (r->how) {
    case RETURN_INVALID_POSITIVE: return 12345;
    case RETURN_INVALID_NEGATIVE: return -7;
    case RETURN_RANGE: return XTC_E_RANGE;
    case ERROR_WITHOUT_CODE: results[0] = (xtc_batch_result_t){XTC_BATCH_ERROR, 0}; break;
    case ERROR_WITH_BAD_CODE: results[0] = (xtc_batch_result_t){XTC_BATCH_ERROR, 3}; break;
    case ERROR_AGAIN: results[0] = (xtc_batch_result_t){XTC_BATCH_ERROR, XTC_E_AGAIN}; break;
    case UNKNOWN_STATE: results[0].state = 42; break;
    case LEFT_UNSET: break;
    case MUTATE_IN_CALLBACK: {
        uint64_t h;
        in_callback_submit = xtc_batch_submit(group, NULL, 1, &h);
        xtc_batch_stats_t st = {.size = sizeof st, .version = XTC_BATCH_VERSION};
        in_callback_stats = xtc_batch_get_stats(group, &st);
        results[0].state = XTC_BATCH_DONE;
        break;
    }
    default: break;
    }
    return XTC_OK;
}

static void complete(uint64_t handle, void *request, int outcome, void *user) {
    (void)handle;
    (void)user;
    ((struct req *)request)->outcome = outcome;
}

static int nop_submit(const xtc_batch_item_t *items, size_t count, void *user,
                      xtc_batch_exec_t *out) {
    (void)items, (void)count, (void)user;
    out->kind = XTC_BATCH_EXEC_INLINE;
    return XTC_OK;
}

static int nop_collect(const xtc_batch_item_t *items, xtc_batch_result_t *results, size_t count,
                       int status, void *user) {
    (void)items, (void)status, (void)user;
    for (size_t i = 0; i < count; i++) {
        results[i].state = XTC_BATCH_DONE;
    }
    return XTC_OK;
}

/* Runs on the loop (a process, not a callback) after the first run. */
struct stale {
    uint64_t done_handle;
    int cancel_rc;
    int resume_rc;
};

static void cancel_stale(int status, void *arg) {
    (void)status;
    struct stale *s = arg;
    s->cancel_rc = xtc_batch_cancel(group, s->done_handle);
    s->resume_rc = xtc_batch_resume(group, s->done_handle);
}

int main(void) {
    xtc_loop_t *loop = NULL, *other = NULL;
    check("xtc_loop_new", xtc_loop_new(&loop));
    check("xtc_loop_new", xtc_loop_new(&other));
    const xtc_batch_opts_t good = {
        .size = sizeof(xtc_batch_opts_t),
        .version = XTC_BATCH_VERSION,
        .capacity = N_HOW,
        .max_active = 1,
        .resource_capacity = 2,
        .step = step,
        .complete = complete,
    };
    xtc_batch_opts_t o;
    xtc_batch_t *g = NULL;

    printf("== descriptors (size, version) ==\n");
    o = good, o.size = 0;
    expect("opts.size = 0", xtc_batch_create(loop, &o, &g), XTC_E_INVAL);
    o = good, o.size = sizeof o - 8;
    expect("opts.size = sizeof - 8 (below the first layout)", xtc_batch_create(loop, &o, &g),
           XTC_E_INVAL);
    o = good, o.size = XTC_DESC_SIZE_MAX + 1;
    expect("opts.size = XTC_DESC_SIZE_MAX + 1", xtc_batch_create(loop, &o, &g), XTC_E_INVAL);
    o = good, o.version = 0;
    expect("opts.version = 0", xtc_batch_create(loop, &o, &g), XTC_E_VERSION);
    o = good, o.version = XTC_BATCH_VERSION + 1;
    expect("opts.version = XTC_BATCH_VERSION + 1", xtc_batch_create(loop, &o, &g),
           XTC_E_VERSION);
    struct {
        xtc_batch_opts_t opts;
        uint64_t newer_field;
    } big = {good, 0};
    big.opts.size = sizeof big;
    expect("larger (newer) opts, extra bytes zero", xtc_batch_create(loop, &big.opts, &g),
           XTC_OK);
    xtc_batch_t *bigger = g;
    big.newer_field = 1;
    expect("larger (newer) opts, extra bytes nonzero", xtc_batch_create(loop, &big.opts, &g),
           XTC_E_INVAL);

    xtc_batch_async_opts_t ao = {
        .size = XTC_BATCH_ASYNC_OPTS_SIZE_VER0,
        .version = XTC_BATCH_VERSION,
        .capacity = 1,
        .max_active = 1,
        .resource_capacity = 1,
        .submit = nop_submit,
        .collect = nop_collect,
        .complete = complete,
        .mt_queue_cap = 8, /* beyond the declared size: not read */
    };
    xtc_batch_t *old_async = NULL;
    expect("older async opts (SIZE_VER0, no mt_queue_cap)",
           xtc_batch_create_async(loop, &ao, &old_async), XTC_OK);
    uint64_t h = 0;
    expect("  its submit_mt (mt_queue_cap read as 0)", xtc_batch_submit_mt(old_async, NULL, 1, &h),
           XTC_E_NOSYS);

    xtc_batch_stats_t st = {.size = 0, .version = XTC_BATCH_VERSION};
    expect("stats.size = 0", xtc_batch_get_stats(old_async, &st), XTC_E_INVAL);
    st = (xtc_batch_stats_t){.size = sizeof st, .version = 9};
    expect("stats.version = 9", xtc_batch_get_stats(old_async, &st), XTC_E_VERSION);
    xtc_batch_async_stats_t ast = {.size = XTC_BATCH_ASYNC_STATS_SIZE_VER0,
                                   .version = XTC_BATCH_VERSION,
                                   .offloads = 777,
                                   .mt_queued = 12345};
    expect("older async stats (SIZE_VER0)", xtc_batch_get_async_stats(old_async, &ast), XTC_OK);
    printf("  offloads written: %s, mt_queued beyond its size untouched: %s\n",
           ast.offloads == 0 ? "yes" : "no", ast.mt_queued == 12345 ? "yes" : "no");

    printf("== NULL arguments and bad options ==\n");
    expect("create(NULL loop)", xtc_batch_create(NULL, &good, &g), XTC_E_INVAL);
    expect("create(NULL opts)", xtc_batch_create(loop, NULL, &g), XTC_E_INVAL);
    expect("create(NULL out)", xtc_batch_create(loop, &good, NULL), XTC_E_INVAL);
    o = good, o.step = NULL;
    expect("opts.step = NULL", xtc_batch_create(loop, &o, &g), XTC_E_INVAL);
    o = good, o.complete = NULL;
    expect("opts.complete = NULL", xtc_batch_create(loop, &o, &g), XTC_E_INVAL);
    o = good, o.capacity = 0;
    expect("capacity < max_active", xtc_batch_create(loop, &o, &g), XTC_E_INVAL);
    o = good, o.resource_capacity = 0;
    expect("resource_capacity = 0", xtc_batch_create(loop, &o, &g), XTC_E_INVAL);
    xtc_batch_async_opts_t a2 = ao;
    a2.size = sizeof a2, a2.collect = NULL;
    expect("async opts.collect = NULL", xtc_batch_create_async(loop, &a2, &g), XTC_E_INVAL);
    a2 = ao, a2.size = sizeof a2, a2.exec_timeout_ns = -1;
    expect("async opts.exec_timeout_ns = -1", xtc_batch_create_async(loop, &a2, &g),
           XTC_E_INVAL);
    xtc_sched_class_t *foreign = NULL, *mine = NULL;
    check("xtc_sched_class_new", xtc_sched_class_new(other, 2, &foreign));
    check("xtc_sched_class_new", xtc_sched_class_new(loop, 2, &mine));
    o = good, o.sched_class = foreign;
    expect("sched_class of another loop", xtc_batch_create(loop, &o, &g), XTC_E_INVAL);
    o = good, o.sched_class = mine;
    check("create with a class", xtc_batch_create(loop, &o, &group));
    xtc_batch_t *classed = group;
    expect("the same class for a second group", xtc_batch_create(loop, &o, &g), XTC_E_INVAL);
    xtc_loop_t *tiny = NULL;
    check("xtc_loop_new_budget", xtc_loop_new_budget(64, &tiny));
    expect("create on a loop whose budget is 64 bytes", xtc_batch_create(tiny, &good, &g),
           XTC_E_NOMEM);

    printf("== submit, cancel, resume, close ==\n");
    check("create", xtc_batch_create(loop, &good, &group));
    expect("submit(NULL group)", xtc_batch_submit(NULL, NULL, 1, &h), XTC_E_INVAL);
    expect("submit(NULL out_handle)", xtc_batch_submit(group, NULL, 1, NULL), XTC_E_INVAL);
    expect("submit charge 0", xtc_batch_submit(group, NULL, 0, &h), XTC_E_RANGE);
    expect("submit charge above resource_capacity", xtc_batch_submit(group, NULL, 3, &h),
           XTC_E_RANGE);
    expect("submit_mt on a synchronous group", xtc_batch_submit_mt(group, NULL, 1, &h),
           XTC_E_NOSYS);
    struct req reqs[N_HOW];
    uint64_t handles[N_HOW];
    for (int i = 0; i < N_HOW; i++) {
        reqs[i] = (struct req){.how = (enum how)i, .outcome = 1};
        check("submit", xtc_batch_submit(group, &reqs[i], 1, &handles[i]));
    }
    expect("cancel(handle 0)", xtc_batch_cancel(group, 0), XTC_E_INVAL);
    expect("cancel(a handle no group issued)", xtc_batch_cancel(group, UINT64_MAX), XTC_E_INVAL);
    expect("resume(a WAITING request)", xtc_batch_resume(group, handles[0]), XTC_E_INVAL);
    expect("close(NULL)", xtc_batch_close(NULL, XTC_BATCH_DRAIN), XTC_E_INVAL);
    expect("close(mode 7)", xtc_batch_close(group, (enum xtc_batch_close_mode)7), XTC_E_INVAL);
    expect("close(mode -1)", xtc_batch_close(group, (enum xtc_batch_close_mode)-1), XTC_E_INVAL);
    expect("destroy before close", xtc_batch_destroy(group), XTC_E_AGAIN);
    check("close", xtc_batch_close(group, XTC_BATCH_DRAIN));
    expect("close(DRAIN) again (idempotent)",
           xtc_batch_close(group, XTC_BATCH_DRAIN), XTC_OK);
    expect("submit after close", xtc_batch_submit(group, NULL, 1, &h), XTC_E_AGAIN);
    for (xtc_batch_t **p = (xtc_batch_t *[]){bigger, old_async, classed, NULL}; *p; p++) {
        check("close", xtc_batch_close(*p, XTC_BATCH_DRAIN));
    }
    expect("destroy after close, before the driver ran", xtc_batch_destroy(group), XTC_E_AGAIN);

    printf("== results and step returns (run) ==\n");
    check("xtc_loop_run", xtc_loop_run(loop));
    for (int i = 0; i < N_HOW; i++) {
        printf("%-52s member ends %s\n", how_name[i], name(reqs[i].outcome));
    }
    printf("%-52s %s\n", "  its xtc_batch_submit", name(in_callback_submit));
    printf("%-52s %s\n", "  its xtc_batch_get_stats", name(in_callback_stats));

    printf("== after the first run ==\n");
    expect("create after the loop ran", xtc_batch_create(loop, &good, &g), XTC_E_AGAIN);
    expect("cancel from outside the loop once it ran", xtc_batch_cancel(group, handles[0]),
           XTC_E_INVAL);
    struct stale s = {.done_handle = handles[MUTATE_IN_CALLBACK]};
    xtc_future_t *f = NULL;
    xtc_promise_t *p = NULL;
    check("xtc_future_new_pair", xtc_future_new_pair(&f, &p));
    expect("promise_set(status 5)", xtc_promise_set(p, 5), XTC_E_INVAL);
    check("xtc_promise_set", xtc_promise_set(p, XTC_OK));
    check("xtc_loop_await", xtc_loop_await(loop, f, cancel_stale, &s));
    check("xtc_loop_run", xtc_loop_run(loop));
    expect("cancel of a completed handle, on the loop", s.cancel_rc, XTC_E_INVAL);
    expect("resume of a completed handle, on the loop", s.resume_rc, XTC_E_INVAL);

    xtc_batch_stats_t fin = {.size = sizeof fin, .version = XTC_BATCH_VERSION};
    check("stats", xtc_batch_get_stats(group, &fin));
    printf("stats: completed=%" PRIu64 " failed=%" PRIu64 " rejections=%" PRIu64 "\n",
           fin.completed, fin.failed, fin.rejections);
    for (xtc_batch_t **q = (xtc_batch_t *[]){group, bigger, old_async, classed, NULL}; *q; q++) {
        check("destroy", xtc_batch_destroy(*q));
    }
    expect("destroy(NULL)", xtc_batch_destroy(NULL), XTC_E_INVAL);
    xtc_sched_class_free(mine);
    xtc_sched_class_free(foreign);
    check("fini", xtc_loop_fini(tiny));
    check("fini", xtc_loop_fini(other));
    check("fini", xtc_loop_fini(loop));
    expect("xtc_loop_fini(NULL)", xtc_loop_fini(NULL), XTC_E_INVAL);
    printf("done\n");
    return 0;
}
