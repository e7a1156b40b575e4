/* Cross-loop admission from C: four pthreads hand requests to a group with
 * xtc_batch_submit_mt while its owner loop runs (xtc_batch(3): B-106..B-121,
 * B-141..B-143).
 *
 * - The group is asynchronous with an INLINE operation (a CPU group using the
 *   async API uniformly) and mt_queue_cap 4, so the ring fills and producers
 *   see XTC_E_AGAIN; they back off (20 us doubling to 1 ms) and retry: there
 *   is no blocking submit_mt (B-113, B-114).
 * - Owner-loop calls stay on the owner loop: xtc_batch_submit from a pthread
 *   is XTC_E_INVAL (foreign ownership).
 * - Close must come from the owner loop. The last producer resolves a promise;
 *   xtc_loop_await runs a callback on the loop when it resolves, and that
 *   ordinary loop process closes the group (DRAIN). Hand-ins accepted before
 *   the close still run (B-142); submit_mt after it is XTC_E_AGAIN (B-141).
 * - Every XTC_OK from submit_mt is followed by exactly one completion (B-119).
 *
 * Build: cc -std=c11 -Iinclude examples/c/submit_mt.c target/release/libxtc_capi.a -lpthread -ldl -lm
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "xtc_batch.h"

#define PRODUCERS 4
#define PER_PRODUCER 50
#define TOTAL (PRODUCERS * PER_PRODUCER)

struct req {
    int producer;
    int seq;
    int completions; /* written by complete, on the loop */
    int outcome;
};

static struct req reqs[TOTAL];
static uint64_t handles[TOTAL];
static xtc_batch_t *group;
static xtc_promise_t *all_in;
static atomic_int producers_left = PRODUCERS;
static atomic_long agains; /* XTC_E_AGAIN answers the producers saw */
static int foreign_submit_rc = 1;

static void back_off(long *ns) {
    struct timespec ts = {0, *ns};
    nanosleep(&ts, NULL);
    *ns = *ns * 2 > 1000000 ? 1000000 : *ns * 2;
}

static void *producer(void *arg) {
    int p = (int)(intptr_t)arg;
    if (p == 0) {
        uint64_t h = 0;
        foreign_submit_rc = xtc_batch_submit(group, NULL, 1, &h);
    }
    for (int s = 0; s < PER_PRODUCER; s++) {
        int i = p * PER_PRODUCER + s;
        reqs[i].producer = p;
        reqs[i].seq = s;
        long ns = 20000;
        int rc;
        while ((rc = xtc_batch_submit_mt(group, &reqs[i], 1, &handles[i])) == XTC_E_AGAIN) {
            atomic_fetch_add(&agains, 1);
            back_off(&ns);
        }
        if (rc != XTC_OK) {
            printf("submit_mt failed: %d\n", rc);
            exit(1);
        }
    }
    if (atomic_fetch_sub(&producers_left, 1) == 1) {
        /* The last producer: every hand-in is on the ring; ask the loop to close. */
        if (xtc_promise_set(all_in, XTC_OK) != XTC_OK) {
            abort();
        }
    }
    return NULL;
}

/* An ordinary process of the owner loop (not a group callback): mutators are allowed. */
static void on_all_handed_in(int status, void *arg) {
    (void)arg;
    printf("all %d handed in (status %s); close(XTC_BATCH_DRAIN) from a loop process: %s\n",
           TOTAL, status == XTC_OK ? "XTC_OK" : "?",
           xtc_batch_close(group, XTC_BATCH_DRAIN) == XTC_OK ? "XTC_OK" : "?");
    uint64_t h = 0;
    int rc = xtc_batch_submit_mt(group, NULL, 1, &h);
    printf("submit_mt after close: %s, no handle issued: %s\n",
           rc == XTC_E_AGAIN ? "XTC_E_AGAIN" : "?", h == 0 ? "yes" : "no");
    if (rc == XTC_E_AGAIN) {
        atomic_fetch_add(&agains, 1);
    }
}

static int submit(const xtc_batch_item_t *items, size_t count, void *user,
                  xtc_batch_exec_t *out_exec) {
    (void)items;
    (void)count;
    (void)user;
    out_exec->kind = XTC_BATCH_EXEC_INLINE; /* done inline: collect runs at once */
    return XTC_OK;
}

static int collect(const xtc_batch_item_t *items, xtc_batch_result_t *results, size_t count,
                   int exec_status, void *user) {
    (void)items;
    (void)exec_status;
    (void)user;
    for (size_t i = 0; i < count; i++) {
        results[i].state = XTC_BATCH_DONE;
    }
    return XTC_OK;
}

static void complete(uint64_t handle, void *request, int outcome, void *user) {
    (void)handle;
    (void)user;
    struct req *r = request;
    r->completions++;
    r->outcome = outcome;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void check(const char *what, int rc) {
    if (rc != XTC_OK) {
        printf("%s failed: %d\n", what, rc);
        exit(1);
    }
}

int main(void) {
    xtc_loop_t *loop = NULL;
    check("xtc_loop_new", xtc_loop_new(&loop));
    xtc_batch_async_opts_t opts = {
        .size = sizeof opts,
        .version = XTC_BATCH_VERSION,
        .capacity = 8,
        .max_active = 4,
        .resource_capacity = 4,
        .submit = submit,
        .collect = collect,
        .complete = complete,
        .mt_queue_cap = 4,
    };
    check("xtc_batch_create_async", xtc_batch_create_async(loop, &opts, &group));

    xtc_future_t *future = NULL;
    check("xtc_future_new_pair", xtc_future_new_pair(&future, &all_in));
    check("xtc_loop_await", xtc_loop_await(loop, future, on_all_handed_in, NULL));

    pthread_t threads[PRODUCERS];
    for (int p = 0; p < PRODUCERS; p++) {
        if (pthread_create(&threads[p], NULL, producer, (void *)(intptr_t)p) != 0) {
            return 1;
        }
    }
    printf("producers: %d pthreads x %d submit_mt calls\n", PRODUCERS, PER_PRODUCER);
    check("xtc_loop_run", xtc_loop_run(loop));
    for (int p = 0; p < PRODUCERS; p++) {
        pthread_join(threads[p], NULL);
    }
    printf("owner-loop xtc_batch_submit from a pthread: %s\n",
           foreign_submit_rc == XTC_E_INVAL ? "XTC_E_INVAL" : "?");

    int once = 0, ok = 0;
    for (int i = 0; i < TOTAL; i++) {
        once += reqs[i].completions == 1;
        ok += reqs[i].outcome == XTC_OK;
    }
    printf("completed exactly once: %d of %d, with XTC_OK: %d\n", once, TOTAL, ok);
    qsort(handles, TOTAL, sizeof handles[0], cmp_u64);
    int distinct = handles[0] != 0;
    for (int i = 1; i < TOTAL; i++) {
        distinct &= handles[i] != handles[i - 1];
    }
    printf("handles nonzero and distinct: %s\n", distinct ? "yes" : "no");

    xtc_batch_stats_t st = {.size = sizeof st, .version = XTC_BATCH_VERSION};
    xtc_batch_async_stats_t ast = {.size = sizeof ast, .version = XTC_BATCH_VERSION};
    check("xtc_batch_get_stats", xtc_batch_get_stats(group, &st));
    check("xtc_batch_get_async_stats", xtc_batch_get_async_stats(group, &ast));
    printf("stats: completed=%" PRIu64 " rejections=%" PRIu64 " mt_queued=%" PRIu64 "\n",
           st.completed, st.rejections, ast.mt_queued);
    printf("mt_rejections equals the XTC_E_AGAIN answers seen: %s\n",
           (long)ast.mt_rejections == atomic_load(&agains) ? "yes" : "no");
    printf("cancel_mt after the driver finished: %s\n",
           xtc_batch_cancel_mt(group, handles[0]) == XTC_E_INVAL ? "XTC_E_INVAL" : "?");

    check("xtc_batch_destroy", xtc_batch_destroy(group));
    check("xtc_loop_fini", xtc_loop_fini(loop));
    printf("done\n");
    return 0;
}
